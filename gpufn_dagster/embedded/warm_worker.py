"""A warm run worker: the process that will execute a code location's next run, started before
that run exists (`python -m gpufn_dagster.embedded.warm_worker <repository origin> <instance ref> <location> <ready fd>`).

A run worker started for its run spends seconds before its first step: a fresh interpreter
importing Dagster, Arrow, Lance and the code location, then a forkserver for its steps importing
them again. For a small refresh started by a sensor that is most of the run. This process does all
of it while it waits: it loads the code location as the run will (`ReconstructableRepository`),
starts its step forkserver with the executor's preloads (`embedded.forkserver`), says it is ready on
`ready fd`, then reads one line from its standard input -- the run, as Dagster's
`ExecuteRunArgs` -- and executes it exactly as `dagster api execute_run` does (what dagster-k8s runs
in a run pod). End of input before a run (its launcher is gone) ends it.

The same answer as a cold worker: if any source file it imported (the project's code, editable
installs; not the Python installation) changed after it loaded them, it does not run the old code:
it says so in the run's log and replaces itself (`exec`) by a fresh `dagster api execute_run`.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from pathlib import Path

from dagster import DagsterInstance, deserialize_value

from ..private_ledger import (EngineEventData, ExecuteRunArgs, InstanceRef, RepositoryPythonOrigin, execute_run_main,
                               recon_repository_from_origin, reuse_alembic_scripts, set_snowflake_partner_env_var)
from ..loaded_code import changed, loaded_files
from . import forkserver

MODULE = "gpufn_dagster.embedded.warm_worker"


def prepare(origin: RepositoryPythonOrigin, instance_ref: InstanceRef, location_name: str) -> dict[str, tuple[int, int]]:
    """Load the code location, set the environment as the run worker will before its first step
    (the location's secrets, Dagster's own variables), and start the step forkserver in it; the
    files loaded. A location that does not load is left for the run to load again, which reports
    the error in its log as a cold worker would."""
    try:
        recon_repository_from_origin(origin).get_definition()
    except Exception:  # noqa: BLE001 -- the run reports it
        pass
    reuse_alembic_scripts()  # the run opens the instance again: its schema checks reuse what this one loads
    with DagsterInstance.from_ref(instance_ref) as instance:
        instance.inject_env_vars(location_name)
    set_snowflake_partner_env_var()
    os.environ[forkserver.STEP_PRELOAD_ENV] = forkserver.preload_spec(instance_ref)
    forkserver.start_ahead(forkserver.default_preloads())
    gc.freeze()  # what it loaded lives as long as it does: the run's collections need not walk it again
    return loaded_files()


def run(input_json: str, files: dict[str, tuple[int, int]]) -> None:
    """Execute the run as `dagster api execute_run` does, unless the code changed since it loaded."""
    stale = changed(files)
    if stale:
        args = deserialize_value(input_json, ExecuteRunArgs)
        if args.instance_ref is not None:
            with DagsterInstance.from_ref(args.instance_ref) as instance:
                instance.report_engine_event(
                    f"The warm run worker (pid {os.getpid()}) loaded the code before {len(stale)} of its files "
                    f"changed ({', '.join(Path(p).name for p in stale[:3])}{', ...' if len(stale) > 3 else ''}), "
                    "so it starts afresh.", instance.get_run_by_id(args.run_id),
                    EngineEventData({"Changed files": "\n".join(stale)}))
        os.execv(sys.executable, [sys.executable, "-m", "dagster", "api", "execute_run", input_json])
    execute_run_main(input_json)


def main(origin_json: str, instance_ref_json: str, location_name: str, ready_fd: int) -> None:
    started = time.monotonic()
    files = prepare(deserialize_value(origin_json, RepositoryPythonOrigin), deserialize_value(instance_ref_json, InstanceRef),
                    location_name)
    try:  # its launcher stops listening once it handed the run
        with os.fdopen(ready_fd, "w") as ready:
            ready.write(f"{time.monotonic() - started:.3f}\n")
    except BrokenPipeError:
        pass
    line = sys.stdin.readline()
    if line.strip():
        run(line.strip(), files)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
