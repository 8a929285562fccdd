"""The last module a run's step forkserver preloads: it opens (then closes) the run's instance, so
every step forks with the instance's storage already imported -- on this 2-core machine about 1.1 s
of imports (SQLAlchemy, Alembic, Dagster's storage) that each step would otherwise do itself, most
of a small step's start.

Which instance is in `$GPUFN_STEP_PRELOAD` (`forkserver.preload_spec`), set by the run worker's
executor before its first step, or by a warm run worker before it starts its forkserver ahead.
Without it (a forkserver someone else started with this module) it opens nothing. No connection
stays open and no thread is started, so the steps forked from the server share nothing live.
"""

from __future__ import annotations

import os

from dagster import DagsterInstance, deserialize_value

from ..dagster_private import InstanceRef
from .forkserver import STEP_PRELOAD_ENV


def load(spec: str) -> None:
    """Open the instance `spec` names, read from its run storage once, and close it."""
    with DagsterInstance.from_ref(deserialize_value(spec, InstanceRef)) as instance:
        instance.get_runs(limit=1)


if os.environ.get(STEP_PRELOAD_ENV):
    load(os.environ[STEP_PRELOAD_ENV])
