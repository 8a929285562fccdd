"""A small refresh's whole run with its step processes spawned (Dagster's default start method) vs
forked from the forkserver that `build_definitions`' executor starts with the engine preloaded
(its default since issue 24) vs no step process at all (`in_process`: the steps run in the run
worker, as the table sensor asks for small appends), side by side in one session.

Each round appends `--rows` rows to a local table and materializes a Function over them (plus a
CPU Function beside it, so the run has two steps) as a real run: `execute_job` on a persistent
instance with the executor's multiprocess step processes, the way a sensor's run goes once the
daemon launched it. Rounds alternate spawn / forkserver / in_process; each ratio is taken per
round, then the median. The run worker's own start (the daemon's launch) is the same either way and left out.

    .venv/bin/python bench/step_start_bench.py --rounds 5 --rows 50
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
CASES = {"spawn": {"execution": {"config": {"start_method": {"spawn": {}}}}}, "forkserver": {},
         "in_process": {"execution": {"config": {"in_process": True}}}}


def definitions():
    """The code location the runs load (by file, as `dagster dev` loads a workspace's python_file)."""
    import os

    import dagster as dg

    from gpufn_dagster import build_definitions, gpu_function

    def shout(text: str) -> str:
        return text.upper()

    def length(text: str) -> int:
        return len(text)

    assets = [gpu_function(table="docs", column="shout")(shout), gpu_function(table="docs", column="size")(length)]
    return build_definitions(assets=assets, db_uri=os.environ["GPUFN_LANCEDB_URI"],
                             jobs=[dg.define_asset_job("refresh", selection=assets)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rows", type=int, default=50)
    args = parser.parse_args()

    import os

    import dagster as dg
    import lancedb
    import pyarrow as pa
    from dagster import DagsterInstance

    from gpufn_dagster.assets.resources import STABLE_ROW_IDS

    work = Path(tempfile.mkdtemp(prefix="gpufn-step-start-"))
    os.environ["GPUFN_LANCEDB_URI"] = str(work / "db")
    table = lancedb.connect(str(work / "db")).create_table(
        "docs", pa.table({"id": pa.array([], pa.int64()), "text": pa.array([], pa.string())}),
        storage_options=STABLE_ROW_IDS)
    job = dg.reconstructable(_job)
    seconds: dict[str, list[float]] = {name: [] for name in CASES}
    added = 0
    (work / "home").mkdir()
    with DagsterInstance.local_temp(str(work / "home")) as instance:
        for _ in range(args.rounds):
            for name, config in CASES.items():
                table.add(pa.table({"id": list(range(added, added + args.rows)),
                                    "text": [f"doc {i}" for i in range(added, added + args.rows)]}))
                added += args.rows
                began = time.monotonic()
                with dg.execute_job(job, instance, run_config=config) as result:
                    assert result.success, name
                seconds[name].append(time.monotonic() - began)
    print(f"{args.rounds} rounds of {args.rows} new rows, 2 Function steps per run, {os.cpu_count()} CPUs\n")
    print("| step processes | run seconds, median | min | max |")
    print("|---|---|---|---|")
    for name, values in seconds.items():
        print(f"| {name} | {statistics.median(values):.2f} | {min(values):.2f} | {max(values):.2f} |")
    for slow, fast in (("spawn", "forkserver"), ("forkserver", "in_process"), ("spawn", "in_process")):
        ratios = [a / b for a, b in zip(seconds[slow], seconds[fast])]
        print(f"| {slow} / {fast} (median of per-round ratios) | {statistics.median(ratios):.2f} | "
              f"{min(ratios):.2f} | {max(ratios):.2f} |")


def _job():
    """The asset job of `definitions()`, for `dg.reconstructable` (a module-level function)."""
    sys.path.insert(0, str(HERE.parent))
    return definitions().resolve_job_def("refresh")


if __name__ == "__main__":
    main()
