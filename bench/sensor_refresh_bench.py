"""A small refresh started by data arriving, as a new user sees it (issue 24): `gpufn append-docs
--rows 50` against the example served by `dagster dev` (its real daemon, its table sensor, its
run queue), timed from the append command's start to the materialization event of the example's
MiniLM embedding Function (`docs__embedding`) that covers the appended rows.

Three `dagster dev` sessions on fresh instances run one after the other in the same bench run:
`warm` (the shipped configuration: a slot keeps the loaded model between refreshes, `local.warm`,
and each run starts in a warm run worker, `GpuLocalRunLauncher`); `load each time` (the same with
`local.warm.idle: 0`: every refresh loads the model); `cold run workers` (the same as `warm` with
`warm_run_workers: false`: each run worker is started by the code server, as Dagster's
DefaultRunLauncher does). Each first makes the table (`--table-rows` sample rows) and refreshes it
once; then `--appends` appends of `--rows` rows follow, each once no run is going (the last
refresh's checks done), each waiting for its embeddings. The first append of a session is its cold
case; p50 and p90 are over the others. Per append it also reads where the seconds went from the
run's events (the append command, the sensor's tick, the queue, the run worker's start, the step's
start, the step) and prints their medians.

    .venv/bin/python bench/sensor_refresh_bench.py --appends 10 --rows 50
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def session(name: str, work: Path, appends: int, rows: int, keep_warm: bool, warm_run_workers: bool = True,
            table_rows: int = 500) -> tuple[list[float], list[float], dict[str, list[float]]]:
    """One dagster dev session: the seconds from each append to its embeddings' materialization, and
    each of those refreshes' time to first values (`first_values_seconds`: from the refresh's start)."""
    from dagster import AssetKey, DagsterInstance, DagsterRunStatus, RunsFilter
    from gpufn_devcluster import processes

    import lancedb

    from gpufn_dagster.assets.resources import STABLE_ROW_IDS
    from gpufn_dagster.embedded.warm import stop_hosts
    from gpufn_dagster.sample import sample_docs

    base = work / name
    home, classes, db = base / "home", base / "classes", base / "lancedb"
    home.mkdir(parents=True)
    config = yaml.safe_load((ROOT / "deploy" / "dagster-embedded.yaml").read_text())
    config["run_launcher"]["config"]["warm_run_workers"] = warm_run_workers
    (home / "dagster.yaml").write_text(yaml.safe_dump(config))
    shutil.copytree(ROOT / "classes", classes)
    if not keep_warm:
        spec = yaml.safe_load((classes / "default.yaml").read_text())
        spec["local"] = {**spec.get("local", {}), "warm": {"idle": 0}}
        (classes / "default.yaml").write_text(yaml.safe_dump(spec))
    lancedb.connect(str(db)).create_table("docs", sample_docs(table_rows), storage_options=STABLE_ROW_IDS)
    env = {**os.environ, "DAGSTER_HOME": str(home), "GPUFN_LANCEDB_URI": str(db), "GPUFN_CLASSES_DIR": str(classes),
           "PYTHONWARNINGS": "ignore"}
    # The instance's SQLite storage is made here, before dagster dev starts: made by two processes at
    # once, alembic stamped it twice ("more than one head present"), the code server died and the
    # sensor never ticked while dagster dev itself stayed up.
    DagsterInstance.from_config(str(home)).dispose()
    port = processes.free_port()
    server = processes.start([sys.executable, "-m", "dagster", "dev", "-w", "workspace.yaml", "-p", str(port)],
                             cwd=ROOT, env=env, log=base / "dagster-dev.log")
    embedding = AssetKey("docs__embedding")
    seconds, first_values = [], []
    breakdown: dict[str, list[float]] = {}
    first_calls: list[float] = []
    try:
        with DagsterInstance.from_config(str(home)) as instance:
            def covered(version: int, deadline: float) -> tuple[float, float, float, str]:
                """When the embedding's materialization covering table `version` happened (epoch
                seconds), its refresh's time to first values and the call that computed them, its run."""
                while time.monotonic() < deadline:
                    event = instance.get_latest_materialization_event(embedding)
                    if event is not None:
                        meta = event.asset_materialization.metadata
                        if meta["table_version_after"].value >= version and meta.get("rows_computed") is not None:
                            first, call = meta.get("first_values_seconds"), meta.get("first_call_seconds")
                            return (event.timestamp, first.value if first is not None else float("nan"),
                                    call.value if call is not None else float("nan"), event.run_id)
                    if server.poll() is not None:
                        raise RuntimeError(f"dagster dev exited: see {base / 'dagster-dev.log'}")
                    time.sleep(0.1)
                raise TimeoutError(f"no materialization of {embedding} covering version {version}")

            def quiet(deadline: float) -> None:
                """Wait until no run is queued or going: the last refresh's checks and view steps run
                after its embeddings commit, and the sensor starts no refresh while one goes."""
                going = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING,
                         DagsterRunStatus.STARTED]
                while instance.get_runs(RunsFilter(statuses=going), limit=1) and time.monotonic() < deadline:
                    time.sleep(0.1)

            table = lancedb.connect(str(db)).open_table("docs")
            covered(table.version, time.monotonic() + 900)  # the sensor's first tick refreshes the table
            for i in range(appends):
                quiet(time.monotonic() + 900)
                began = time.time()
                subprocess.run([sys.executable, "-m", "gpufn_dagster.cli", "append-docs", "--rows", str(rows),
                                "--db", str(db)], env=env, check=True, capture_output=True)
                table.checkout_latest()
                appended = time.time()
                at, first, call, run_id = covered(table.version, time.monotonic() + 900)
                seconds.append(at - began)
                first_values.append(first)
                first_calls.append(call)
                marks = stretches(instance, run_id, began, appended, at)
                for stretch, value in marks.items():
                    breakdown.setdefault(stretch, []).append(value)
                print(f"{name}: append {i + 1}: {seconds[-1]:.1f} s (first values {first:.2f} s, its call {call:.2f} s; "
                      + ", ".join(f"{k} {v:.1f}" for k, v in marks.items()) + ")", flush=True)
    finally:
        processes.stop(server, grace=60)
        stop_hosts(home / "gpufn-slots" / "warm")  # they end with dagster dev's code server already
    breakdown["first values minus their call"] = [f - c for f, c in zip(first_values, first_calls)]
    return seconds, first_values, breakdown


# (name, Function instances kept warm, run workers started ahead)
SESSIONS = (("warm", True, True), ("load each time", False, True), ("cold run workers", True, False))
STRETCHES = ("append command", "to the run's creation (sensor tick)", "to its launch (queue)",
             "to RUN_START (run worker start)", "to the step's start", "the step")


def stretches(instance, run_id: str, began: float, appended: float, materialized: float) -> dict[str, float]:
    """Where one append's seconds went, from its run's event log: the append command, the sensor's
    tick creating the run, the queue launching it, the run worker starting, the embedding step
    starting, the step itself (to its materialization)."""
    from dagster import DagsterEventType

    record = instance.get_run_record_by_id(run_id)
    times: dict[str, float] = {}
    for entry in instance.all_logs(run_id):
        kind = entry.dagster_event.event_type if entry.dagster_event else None
        if kind in (DagsterEventType.RUN_STARTING, DagsterEventType.RUN_START):
            times.setdefault(kind.name, entry.timestamp)
        elif kind == DagsterEventType.STEP_START and entry.step_key == "docs__embedding":
            times.setdefault("step", entry.timestamp)
    marks = [began, appended, record.create_timestamp.timestamp(), times.get("RUN_STARTING", float("nan")),
             times.get("RUN_START", float("nan")), times.get("step", float("nan")), materialized]
    return {name: marks[i + 1] - marks[i] for i, name in enumerate(STRETCHES)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--appends", type=int, default=10)
    parser.add_argument("--rows", type=int, default=50)
    parser.add_argument("--table-rows", type=int, default=500, help="the table's rows before the first append")
    parser.add_argument("--sessions", default=",".join(name for name, *_ in SESSIONS),
                        help="which sessions, comma-separated (default: all of " +
                             ", ".join(name for name, *_ in SESSIONS) + ")")
    args = parser.parse_args()
    # SIGTERM (kill, a timeout) ends the bench through its `finally`, which stops dagster dev and the
    # servers it started; without this a killed bench left dagster dev's webserver and daemon running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="gpufn-sensor-bench-"))
    results = {name: session(name, work, args.appends, args.rows, keep_warm, workers, args.table_rows)
               for name, keep_warm, workers in SESSIONS if name in args.sessions.split(",")}
    print(f"\n{args.appends} appends of {args.rows} rows each, {os.cpu_count()} CPUs; "
          "seconds from the append command to the embeddings' materialization\n")
    print("| instances | first append (cold) | p50 after it | p90 after it | first values, p50 after it |")
    print("|---|---|---|---|---|")
    for name, (values, first, _) in results.items():
        later, first_later = values[1:] or values, first[1:] or first
        print(f"| {name} | {values[0]:.1f} | {statistics.median(later):.1f} | {percentile(later, 0.9):.1f} | "
              f"{statistics.median(first_later):.2f} |")
    if "warm" in results:
        warm = results["warm"][0][1:] or results["warm"][0]
        for name in results:
            if name != "warm":
                other = results[name][0][1:] or results[name][0]
                print(f"| {name} / warm (p50) | | {statistics.median(other) / statistics.median(warm):.2f} | | |")
    print("\nWhere the seconds go (p50 over the appends after the first):\n")
    print("| stretch | " + " | ".join(results) + " |")
    print("|---|" + "---|" * len(results))
    for stretch in (*STRETCHES, "first values minus their call"):
        print(f"| {stretch} | " + " | ".join(f"{statistics.median(r[2][stretch][1:] or r[2][stretch]):.2f}"
                                             for r in results.values()) + " |")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
