"""The last module a run's step forkserver preloads: it opens (then closes) the run's instance, so
every step forks with the instance's storage already imported -- on this 2-core machine about 1.1 s
of imports (SQLAlchemy, Alembic, Dagster's storage) that each step would otherwise do itself, most
of a small step's start -- and the alembic scripts its schema checks read already loaded (another
0.45 s a step, `private_ledger.reuse_alembic_scripts`).

Which instance is in `$GPUFN_STEP_PRELOAD` (`forkserver.preload_spec`), set by the run worker's
executor before its first step, or by a warm run worker before it starts its forkserver ahead.
Without it (a forkserver someone else started with this module) it opens nothing. No connection
stays open and no thread is started, so the steps forked from the server share nothing live. Last,
it freezes the server's heap (`gc.freeze`), so the steps' collections leave it alone.
"""

from __future__ import annotations

import gc
import os

from dagster import DagsterInstance, deserialize_value

from ..private_ledger import InstanceRef, reuse_alembic_scripts
from .forkserver import STEP_PRELOAD_ENV


def load(spec: str) -> None:
    """Open the instance `spec` names, read from its run storage once, and close it; the schema
    checks' alembic scripts stay loaded for the steps (`reuse_alembic_scripts`)."""
    reuse_alembic_scripts()
    with DagsterInstance.from_ref(deserialize_value(spec, InstanceRef)) as instance:
        instance.get_runs(limit=1)


if os.environ.get(STEP_PRELOAD_ENV):
    load(os.environ[STEP_PRELOAD_ENV])
# Everything the server imported is kept out of its steps' garbage collections: a step forked from
# it would otherwise walk that whole heap at each full collection (about 0.35 s of a small step's
# CPU here) and copy every page it touches. What CPython's docs of `gc.freeze` advise before forking.
gc.freeze()
