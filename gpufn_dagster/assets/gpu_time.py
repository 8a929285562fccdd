"""When a shard's GPUs became its: the start of the GPU-seconds a fan-out reports as held.

On a local slot (embedded mode) the GPUs are the step's from the moment it takes the slot. In a pod
of its own (a run placed per step: gpufn's executor gives each shard a pod on its class's nodes)
the pod holds its GPUs before the step begins, while the step's process starts, imports Dagster
and loads the code location; that process is the pod's container (`dagster api execute_step`), so
its start is when the pod's GPUs began to wait for it. What comes before the container inside the
pod (scheduling, the image's pull) cannot be seen from inside it and is not counted.
"""

from __future__ import annotations

import os
import time

from ..embedded.procfs import age_seconds
from ..tags import PLACEMENT_TAG, RunKind


def held_since(run_tags: dict[str, str], on_local_slot: bool) -> float:
    """On `time.monotonic()`'s clock, when this step's GPUs became its (see the module's docstring).

    >>> import time
    >>> abs(held_since({}, on_local_slot=True) - time.monotonic()) < 1
    True
    >>> held_since({"gpufn/placement": "per-step"}, on_local_slot=False) <= time.monotonic() - age_seconds(os.getpid()) + 1
    True
    """
    if not on_local_slot and run_tags.get(PLACEMENT_TAG) == RunKind.PER_STEP.value:
        return time.monotonic() - age_seconds(os.getpid())
    return time.monotonic()
