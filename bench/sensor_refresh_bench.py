"""A small refresh started by data arriving, as a new user sees it (issue 24): `gpufn append-docs
--rows 50` against the example served by `dagster dev` (its real daemon, its table sensor, its
run queue), timed from the append command's start to the materialization event of the example's
MiniLM embedding Function (`docs__embedding`) that covers the appended rows.

Two `dagster dev` sessions on fresh instances run one after the other in the same bench run:
`warm` (the shipped classes: a slot keeps the loaded model between refreshes, `local.warm`) and
`load each time` (the same classes with `local.warm.idle: 0`: every refresh loads the model in its
step, as before issue 24). Each first makes the table (`--table-rows` sample rows) and refreshes it once;
then `--appends` appends of `--rows` rows follow, each once no run is going (the last refresh's
checks done), each waiting for its embeddings. The first append
of a session is its cold case; p50 and p90 are over the others.

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


def session(name: str, work: Path, appends: int, rows: int, keep_warm: bool, table_rows: int = 500) -> tuple[list[float], list[float]]:
    """One dagster dev session: the seconds from each append to its embeddings' materialization, and
    each of those refreshes' time to first values (`first_values_seconds`: from the refresh's start)."""
    from dagster import AssetKey, DagsterInstance, DagsterRunStatus, RunsFilter
    from gpufn_devcluster import processes

    import lancedb

    from gpufn_dagster.assets.resources import STABLE_ROW_IDS
    from gpufn_dagster.refresh.warm import stop_hosts
    from gpufn_dagster.sample import sample_docs

    base = work / name
    home, classes, db = base / "home", base / "classes", base / "lancedb"
    home.mkdir(parents=True)
    shutil.copy(ROOT / "deploy" / "dagster-embedded.yaml", home / "dagster.yaml")
    shutil.copytree(ROOT / "classes", classes)
    if not keep_warm:
        spec = yaml.safe_load((classes / "default.yaml").read_text())
        spec["local"] = {**spec.get("local", {}), "warm": {"idle": 0}}
        (classes / "default.yaml").write_text(yaml.safe_dump(spec))
    lancedb.connect(str(db)).create_table("docs", sample_docs(table_rows), storage_options=STABLE_ROW_IDS)
    env = {**os.environ, "DAGSTER_HOME": str(home), "GPUFN_LANCEDB_URI": str(db), "GPUFN_CLASSES_DIR": str(classes),
           "PYTHONWARNINGS": "ignore"}
    port = processes.free_port()
    server = processes.start([sys.executable, "-m", "dagster", "dev", "-w", "workspace.yaml", "-p", str(port)],
                             cwd=ROOT, env=env, log=base / "dagster-dev.log")
    embedding = AssetKey("docs__embedding")
    seconds, first_values = [], []
    try:
        with DagsterInstance.from_config(str(home)) as instance:
            def covered(version: int, deadline: float) -> tuple[float, float]:
                """When the embedding's materialization covering table `version` happened (epoch
                seconds), and its refresh's time to first values."""
                while time.monotonic() < deadline:
                    event = instance.get_latest_materialization_event(embedding)
                    if event is not None:
                        meta = event.asset_materialization.metadata
                        if meta["table_version_after"].value >= version and meta.get("rows_computed") is not None:
                            first = meta.get("first_values_seconds")
                            return event.timestamp, first.value if first is not None else float("nan")
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
                at, first = covered(table.version, time.monotonic() + 900)
                seconds.append(at - began)
                first_values.append(first)
                print(f"{name}: append {i + 1}: {seconds[-1]:.1f} s (first values {first:.2f} s)", flush=True)
    finally:
        processes.stop(server, grace=60)
        stop_hosts(home / "gpufn-slots" / "warm")  # they end with dagster dev's code server already
    return seconds, first_values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--appends", type=int, default=10)
    parser.add_argument("--rows", type=int, default=50)
    parser.add_argument("--table-rows", type=int, default=500, help="the table's rows before the first append")
    args = parser.parse_args()
    # SIGTERM (kill, a timeout) ends the bench through its `finally`, which stops dagster dev and the
    # servers it started; without this a killed bench left dagster dev's webserver and daemon running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="gpufn-sensor-bench-"))
    results = {name: session(name, work, args.appends, args.rows, keep_warm, args.table_rows)
               for name, keep_warm in (("warm", True), ("load each time", False))}
    print(f"\n{args.appends} appends of {args.rows} rows each, {os.cpu_count()} CPUs; "
          "seconds from the append command to the embeddings' materialization\n")
    print("| instances | first append (cold) | p50 after it | p90 after it | first values, p50 after it |")
    print("|---|---|---|---|---|")
    for name, (values, first) in results.items():
        later, first_later = values[1:] or values, first[1:] or first
        print(f"| {name} | {values[0]:.1f} | {statistics.median(later):.1f} | {percentile(later, 0.9):.1f} | "
              f"{statistics.median(first_later):.2f} |")
    warm, cold = (results[n][0][1:] or results[n][0] for n in ("warm", "load each time"))
    print(f"| load each time / warm (p50) | | {statistics.median(cold) / statistics.median(warm):.2f} | | |")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
