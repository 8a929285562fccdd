"""Embedded mode: which local slot of its class -- and so which device -- a GPU step runs on.

The class's pool (`gpu-<class>`) lets at most `local.slots` of its steps run at once, but does not
say which slot a step got. A step takes the lowest slot whose lock file no other process holds
(an exclusive `flock`, which the kernel releases if the step dies, so a killed step never keeps a
slot) and sees that slot's device, `local.devices[slot % len(devices)]`, as CUDA_VISIBLE_DEVICES.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..classes import GpuClass
from ..tags import PLACEMENT_TAG
from .shared import RunKind


@contextmanager
def local_slot(gpu_class: GpuClass, lock_dir: Path, on_wait: Callable[[str], None] = print,
               poll_seconds: float = 1.0, report_every: float = 30.0) -> Iterator[tuple[int, str | None]]:
    """Hold a free local slot of `gpu_class` while the block runs; yields (slot, its device or None).

    Normally a slot is free at once (the pool admitted the step). A step run outside the embedded
    coordinator's pool limits may find them all held: it then waits, saying so every
    `report_every` seconds through `on_wait`.

    Args:
        gpu_class: the step's class (`local.slots`, `local.devices`).
        lock_dir: where the slot lock files live (the Dagster instance's directory).
        on_wait: where to say that the step waits for a slot.
        poll_seconds: how often a waiting step tries again.
        report_every: how often a waiting step says so.
    """
    lock_dir.mkdir(parents=True, exist_ok=True)
    slots = max(gpu_class.local.slots, 1)
    started = reported = time.monotonic()
    while True:
        for slot in range(slots):
            handle = open(lock_dir / f"{gpu_class.name}.{slot}.lock", "a")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            try:
                devices = gpu_class.local.devices
                yield slot, devices[slot % len(devices)] if devices else None
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
                handle.close()
            return
        if time.monotonic() - reported >= report_every:
            reported = time.monotonic()
            on_wait(f"all {slots} local slot(s) of GPU class {gpu_class.name!r} are held by other steps on this "
                    f"machine (pid {os.getpid()} waited {reported - started:.0f}s so far)")
        time.sleep(poll_seconds)


@contextmanager
def step_slot(context: Any, gpu_class: GpuClass | None) -> Iterator[None]:
    """Embedded mode: hold one of the class's local slots (and its device) while a GPU step runs.

    The pool let the step start; the slot says which device it uses (CUDA_VISIBLE_DEVICES), in
    the step's own process. Outside the embedded coordinator (Kubernetes, `materialize`) nothing
    is held: the pod was given its GPUs.
    """
    if gpu_class is None or context.run.tags.get(PLACEMENT_TAG) != RunKind.LOCAL.value:
        yield
        return
    lock_dir = Path(context.instance.root_directory) / "gpufn-slots"
    with local_slot(gpu_class, lock_dir, on_wait=context.log.warning) as (slot, device):
        if device is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = device
        context.log.info(f"local GPU slot {slot} of class {gpu_class.name!r}"
                         + (f", CUDA_VISIBLE_DEVICES={device}" if device is not None else ""))
        yield
