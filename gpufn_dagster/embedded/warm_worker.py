"""A warm run worker: the process that will execute a code location's next run, started before
that run exists (`python -m gpufn_dagster.embedded.warm_worker <repository origin> <instance ref> <location> <run id> <ready fd>`).

A run worker started for its run spends seconds before its first step: a fresh interpreter
importing Dagster, Arrow, Lance and the code location, then a forkserver for its steps importing
them again. For a small refresh started by a sensor that is most of the run. This process does all
of it while it waits: it loads the code location as the run will (`ReconstructableRepository`, with
the load data -- what the code server kept when it defined the location -- of `run id`, the run whose
launch started it, so it opens no table its code server already read: `assets.table_schemas`),
starts its step forkserver with the executor's preloads (`embedded.forkserver`), says it is ready on
`ready fd`, then reads one line from its standard input -- the run, as Dagster's
`ExecuteRunArgs` -- and executes it exactly as `dagster api execute_run` does (what dagster-k8s runs
in a run pod). End of input before a run (its launcher is gone) ends it.

The same answer as a cold worker: if any source file it imported (the project's code, editable
installs; not the Python installation) changed after it loaded them, it does not run the old code:
it says so in the run's log and replaces itself (`exec`) by a fresh `dagster api execute_run`; so
too if its run carries other load data than it loaded with (the code server reloaded meanwhile).
"""

from __future__ import annotations

import gc
import os
import sys
import time
from pathlib import Path

from dagster import DagsterInstance, deserialize_value, serialize_value

from ..private_ledger import (EngineEventData, ExecuteRunArgs, InstanceRef, RepositoryLoadData, RepositoryPythonOrigin,
                               execute_run_main, recon_repository_from_origin, reuse_alembic_scripts, set_snowflake_partner_env_var)
from ..loaded_code import changed, loaded_files
from . import forkserver

MODULE = "gpufn_dagster.embedded.warm_worker"


def load_data(instance: DagsterInstance, run_id: str) -> RepositoryLoadData | None:
    """What the code server kept when it defined the code location of run `run_id` (Dagster's
    repository load data, stored with the run's execution plan), as `dagster api execute_run`
    reads it; None for a run that has none."""
    run = instance.get_run_by_id(run_id)
    if run is None or not run.has_repository_load_data or run.execution_plan_snapshot_id is None:
        return None
    return instance.get_execution_plan_snapshot(run.execution_plan_snapshot_id).repository_load_data


def prepare(origin: RepositoryPythonOrigin, instance_ref: InstanceRef, location_name: str,
            run_id: str) -> tuple[dict[str, tuple[int, int]], RepositoryLoadData | None]:
    """Load the code location with the load data of run `run_id`, set the environment as the run
    worker will before its first step (the location's secrets, Dagster's own variables), and start
    the step forkserver in it; the files loaded and the load data. A location that does not load is
    left for the run to load again, which reports the error in its log as a cold worker would."""
    reuse_alembic_scripts()  # the run opens the instance again: its schema checks reuse what this one loads
    with DagsterInstance.from_ref(instance_ref) as instance:
        data = load_data(instance, run_id)
        instance.inject_env_vars(location_name)
    try:
        recon_repository_from_origin(origin).with_repository_load_data(data).get_definition()
    except Exception:  # noqa: BLE001 -- the run reports it
        pass
    set_snowflake_partner_env_var()
    os.environ[forkserver.STEP_PRELOAD_ENV] = forkserver.preload_spec(instance_ref)
    forkserver.start_ahead(forkserver.default_preloads())
    gc.freeze()  # what it loaded lives as long as it does: the run's collections need not walk it again
    return loaded_files(), data


def run(input_json: str, files: dict[str, tuple[int, int]], loaded_with: RepositoryLoadData | None) -> None:
    """Execute the run as `dagster api execute_run` does, or be replaced by that command when what
    this worker loaded no longer fits the run (`afresh`)."""
    args = deserialize_value(input_json, ExecuteRunArgs)
    if afresh(args, changed(files), loaded_with):
        os.execv(sys.executable, [sys.executable, "-m", "dagster", "api", "execute_run", input_json])
    execute_run_main(input_json)


def afresh(args: ExecuteRunArgs, stale: list[str], loaded_with: RepositoryLoadData | None) -> bool:
    """Whether the run must start in a fresh process, said in its log: source files changed since
    this worker loaded them, or its code location was defined with other load data (the code server
    reloaded meanwhile)."""
    if args.instance_ref is None:
        return bool(stale)
    with DagsterInstance.from_ref(args.instance_ref) as instance:
        if stale:
            why = (f"loaded the code before {len(stale)} of its files changed "
                   f"({', '.join(Path(p).name for p in stale[:3])}{', ...' if len(stale) > 3 else ''})")
        elif serialize_value(load_data(instance, args.run_id)) != serialize_value(loaded_with):
            why = "loaded the code location as its code server defined it before it reloaded"
        else:
            return False
        instance.report_engine_event(f"The warm run worker (pid {os.getpid()}) {why}, so it starts afresh.",
                                     instance.get_run_by_id(args.run_id),
                                     EngineEventData({"Changed files": "\n".join(stale)}))
        return True


def main(origin_json: str, instance_ref_json: str, location_name: str, run_id: str, ready_fd: int) -> None:
    started = time.monotonic()
    files, loaded_with = prepare(deserialize_value(origin_json, RepositoryPythonOrigin),
                                 deserialize_value(instance_ref_json, InstanceRef), location_name, run_id)
    try:  # its launcher stops listening once it handed the run
        with os.fdopen(ready_fd, "w") as ready:
            ready.write(f"{time.monotonic() - started:.3f}\n")
    except BrokenPipeError:
        pass
    line = sys.stdin.readline()
    if line.strip():
        run(line.strip(), files, loaded_with)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
