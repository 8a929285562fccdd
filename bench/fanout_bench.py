"""Scaling out (issue 9), side by side in one run:

1. `fanout`: one Function refresh spread over N = 1, 2, 4, 8 GPU workers on the same table, as a
   user runs it -- a real Dagster run through the embedded coordinator and its daemon, the
   multiprocess executor, one process per shard, each on a local slot of its class. The Function
   sleeps a fixed time per call (a stand-in for a GPU kernel: the wait is the device's, so the 2
   cores are not the limit). The instance is the shipped embedded one: its run launcher starts
   each run in a warm run worker, and each slot keeps the Function's instance warm (a warm-up run
   over every slot first, as a session's first run finds neither).
   Reported: wall time of the run (from launch to its end, Dagster's start-up included) as this
   loop sees it (polled) and as Dagster records it (creation to end), and of its shard phase (first
   shard start to last shard end), and the speed-up over N = 1 of each; and the GPU-seconds the
   shards held their slots and, of those, idle (no Function call running: the shard's start inside
   its step, reads, checkpoints), as the run's materialization reports them (`gpu_held_seconds`,
   `gpu_idle_seconds`), at each table size of `--rows` (a comma list: 10x apart shows the growth).
2. `storage`: the same refresh (`refresh_column`, a trivial batch Function) of the same table on a
   local directory and on the object store (SeaweedFS on this machine, S3 API): rows/s of each and
   the ratio.
3. `plan`: planning a refresh of a 10M-row table after 1 % of its rows changed (`ColumnRefresh.plan`,
   fragment metadata only): its time, and how many fragments and rows it plans.

    .venv/bin/python bench/fanout_bench.py --rows 96000 --storage-rows 1000000 --plan-rows 10000000
    .venv/bin/python bench/fanout_bench.py --only fanout --rows 30720,307200 --workers 1,8

Writes bench/results/fanout.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
BATCH, SLEEP = 256, 0.1  # rows per call, seconds per call

DEFS = textwrap.dedent(f"""
    import time
    import pyarrow as pa
    import pyarrow.compute as pc
    from gpufn_dagster import build_definitions, gpu_function

    def kernel(text: pa.Array) -> pa.Array:
        time.sleep({SLEEP})  # the device's time, not the CPU's
        return pc.utf8_length(text)

    asset = gpu_function(table="docs", column="size", output_type=pa.int32(), gpu_class="bench", workers=8,
                         batch_size={BATCH}, adapt_batch_size=False)(kernel)
    defs = build_definitions(assets=[asset])
""")
BENCH_CLASS = ("name: bench\ngpu_model: SIMULATED\ngpu_memory: 16GiB\nmax_gpu_count_per_worker: 1\n"
               "local: {slots: 8, devices: ['0', '1', '2', '3', '4', '5', '6', '7']}\n")


def fanout(sizes: list[int], workers: list[int]) -> list[dict]:
    import lancedb
    import pyarrow as pa
    from dagster import DagsterEventType, DagsterRunStatus
    from dagster._core.test_utils import create_test_daemon_workspace_context, instance_for_test
    from dagster._core.workspace.load_target import PythonFileTarget
    from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import QueuedRunCoordinatorDaemon
    from dagster_graphql.client.query import LAUNCH_PIPELINE_EXECUTION_MUTATION
    from dagster_graphql.test.utils import execute_dagster_graphql

    base = Path(tempfile.mkdtemp(prefix="gpufn-fanout-"))
    classes = base / "classes"
    shutil.copytree(ROOT / "classes", classes)
    (classes / "bench.yaml").write_text(BENCH_CLASS)
    (base / "bench_defs.py").write_text(DEFS)
    os.environ.update(GPUFN_CLASSES_DIR=str(classes))
    results = []
    db = base / "db"
    os.environ["GPUFN_LANCEDB_URI"] = str(db)

    def fresh_table(n_rows: int) -> None:
        connection = lancedb.connect(str(db))
        if "docs" in connection.list_tables().tables:
            connection.drop_table("docs")
        connection.create_table("docs", pa.table({"id": list(range(n_rows)), "text": [f"doc {i}" for i in range(n_rows)]}))

    fresh_table(BATCH)
    # The shipped embedded instance (deploy/dagster-embedded.yaml): its run launcher starts runs in warm run workers.
    overrides = {"run_coordinator": {"module": "gpufn_dagster", "class": "GpuQueuedRunCoordinator",
                                     "config": {"classes_dir": str(classes)}},
                 "run_launcher": {"module": "gpufn_dagster", "class": "GpuLocalRunLauncher"}}
    target = PythonFileTarget(python_file=str(base / "bench_defs.py"), attribute="defs", working_directory=None,
                              location_name="bench")
    with instance_for_test(overrides=overrides) as instance, \
            create_test_daemon_workspace_context(target, instance) as workspace:
        daemon = QueuedRunCoordinatorDaemon(interval_seconds=1)

        def run(n: int) -> tuple[str, float]:
            started = time.monotonic()
            launched = execute_dagster_graphql(workspace.create_request_context(), LAUNCH_PIPELINE_EXECUTION_MUTATION,
                                               variables={"executionParams": {
                "selector": {"repositoryLocationName": "bench", "repositoryName": "__repository__",
                             "pipelineName": "__ASSET_JOB", "assetSelection": [{"path": ["docs__size"]}]},
                "runConfigData": {"ops": {"docs__size": {"ops": {"docs__size_plan": {"config": {"workers": n}}}}}},
                "mode": "default"}}).data["launchPipelineExecution"]
            run_id = launched["run"]["runId"]
            while instance.get_run_by_id(run_id).status not in (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE):
                list(daemon.run_iteration(workspace))
                time.sleep(0.2)
            if instance.get_run_by_id(run_id).status != DagsterRunStatus.SUCCESS:
                said = [f"{e.step_key or ''} {e.dagster_event_type or ''} {e.message}" for e in instance.all_logs(run_id)]
                raise SystemExit(f"run {run_id} (workers={n}) did not succeed; its log:\n" + "\n".join(said))
            return run_id, time.monotonic() - started

        # A session's first run finds no warm run worker, and a slot's first step no warm instance;
        # the measured runs find both, as a sensor's or a backfill's later refreshes do: this warm-up
        # spreads a small table over every slot the largest N uses.
        fresh_table(max(workers) * 1024)  # 1,024 rows: the smallest shard
        run(max(workers))
        for rows, n in [(rows, n) for rows in sizes for n in workers]:
            fresh_table(rows)
            wait = time.monotonic() + 120
            while not all(w.ready() for w in instance.run_launcher.waiting) and time.monotonic() < wait:
                time.sleep(0.5)
            run_id, wall = run(n)
            record = instance.get_run_record_by_id(run_id)
            starts = [e.timestamp for e in instance.all_logs(run_id, of_type=DagsterEventType.STEP_START)
                      if "_shard[" in (e.step_key or "")]
            ends = [e.timestamp for e in instance.all_logs(run_id, of_type=DagsterEventType.STEP_SUCCESS)
                    if "_shard[" in (e.step_key or "")]
            results.append({"workers": n, "rows": rows, "run_seconds": round(wall, 2),
                            # Dagster's own record of the run: from its creation to its end, without this
                            # loop's 0.2 s polls and queue-daemon passes (up to ~0.3 s on every run).
                            "run_recorded_seconds": round(record.end_time - record.create_timestamp.timestamp(), 2),
                            "shard_phase_seconds": round(max(ends) - min(starts), 2),
                            "device_seconds": round(rows / BATCH * SLEEP, 1), **_gpu_seconds(instance, run_id)})
            print(results[-1], flush=True)
    for r in results:
        one = next(o for o in results if o["rows"] == r["rows"])  # the fewest workers, same table
        r["speedup_run"] = round(one["run_seconds"] / r["run_seconds"], 2)
        r["speedup_run_recorded"] = round(one["run_recorded_seconds"] / r["run_recorded_seconds"], 2)
        r["speedup_shards"] = round(one["shard_phase_seconds"] / r["shard_phase_seconds"], 2)
    shutil.rmtree(base, ignore_errors=True)
    return results


def _gpu_seconds(instance, run_id: str) -> dict:
    """The GPU-seconds the run's materialization reports: held by its shards, and idle of those."""
    from dagster import AssetKey

    event = instance.get_latest_materialization_event(AssetKey("docs__size"))
    assert event.run_id == run_id, (event.run_id, run_id)
    metadata = event.asset_materialization.metadata
    held, idle = metadata["gpu_held_seconds"].value, metadata["gpu_idle_seconds"].value
    return {"gpu_held_seconds": held, "gpu_idle_seconds": idle, "gpu_idle_share": round(idle / held, 3)}


def storage(rows: int) -> list[dict]:
    import lance
    import pyarrow as pa
    import pyarrow.compute as pc

    from gpufn_dagster import make_function, refresh_column
    from gpufn_devcluster.cluster import binaries_dir
    from gpufn_devcluster.objectstore import ObjectStore

    def size(text: pa.Array) -> pa.Array:
        return pc.utf8_length(text)

    function = make_function(size, table="docs", column="size", output_type=pa.int32(), batch_size=4096)
    data = pa.table({"id": pa.array(range(rows), pa.int64()), "text": [f"document number {i}" for i in range(rows)]})
    base = Path(tempfile.mkdtemp(prefix="gpufn-storage-"))
    out = []
    with ObjectStore(binaries_dir()) as store:
        for name, uri, options in [("local", str(base / "docs.lance"), None),
                                   ("object store", store.uri("bench") + "/docs.lance", store.storage_options)]:
            lance.write_dataset(data, uri, max_rows_per_file=rows // 8, storage_options=options)
            result = refresh_column(uri, function, storage_options=options)
            assert result.rows_computed == rows
            out.append({"storage": name, "rows": rows, "wall_seconds": round(result.wall_seconds, 2),
                        "rows_per_second": round(rows / result.wall_seconds)})
            print(out[-1], flush=True)
    out[1]["vs_local"] = round(out[1]["rows_per_second"] / out[0]["rows_per_second"], 2)
    shutil.rmtree(base, ignore_errors=True)
    return out


def plan(rows: int) -> dict:
    import lance
    import pyarrow as pa
    import pyarrow.compute as pc

    from gpufn_dagster import make_function, refresh_column
    from gpufn_dagster.refresh.engine import ColumnRefresh, RefreshOptions
    from gpufn_dagster.refresh.files import TableFiles

    def size(text: pa.Array) -> pa.Array:
        return pc.utf8_length(text)

    function = make_function(size, table="docs", column="size", output_type=pa.int32(), batch_size=65536)
    uri = tempfile.mkdtemp(prefix="gpufn-plan-") + "/docs.lance"
    step = 1_000_000
    for start in range(0, rows, step):
        ids = pa.array(range(start, start + step), pa.int64())
        lance.write_dataset(pa.table({"id": ids, "text": pc.cast(ids, pa.string())}), uri,
                            mode="append" if start else "create", max_rows_per_file=step)
    refresh_column(uri, function)  # every row current
    dataset = lance.dataset(uri)
    dataset.update({"text": "'changed'"}, where="id % 100 = 0")  # 1 % of the rows, in every fragment
    started = time.monotonic()
    planned = ColumnRefresh(TableFiles(uri), function, RefreshOptions(lease_token="bench")).plan(workers=8)
    seconds = time.monotonic() - started
    result = {"rows": lance.dataset(uri).count_rows(), "fragments": len(lance.dataset(uri).get_fragments()),
              "fragments_planned": planned.fragments, "rows_planned": planned.rows, "plan_seconds": round(seconds, 3)}
    print(result, flush=True)
    shutil.rmtree(Path(uri).parent, ignore_errors=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="96000", help="rows of the fan-out table (a comma list: each size)")
    parser.add_argument("--workers", default="1,2,4,8")
    parser.add_argument("--storage-rows", type=int, default=1_000_000)
    parser.add_argument("--plan-rows", type=int, default=10_000_000)
    parser.add_argument("--only", choices=["fanout", "storage", "plan"])
    args = parser.parse_args()
    results: dict = {}
    if args.only in (None, "fanout"):
        results["fanout"] = fanout([int(r) for r in args.rows.split(",")], [int(n) for n in args.workers.split(",")])
    if args.only in (None, "storage"):
        results["storage"] = storage(args.storage_rows)
    if args.only in (None, "plan"):
        results["plan"] = plan(args.plan_rows)
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "fanout.json").write_text(json.dumps(results, indent=2))
    if "fanout" in results:
        print("\n| rows | workers | run s (polled) | run s (recorded) | shard phase s | device s (1 worker) "
              "| speed-up (run, polled) | speed-up (run, recorded) | speed-up (shards) | GPU s held | GPU s idle "
              "| idle share |")
        print("| --- |" + " --- |" * 11)
        for r in results["fanout"]:
            print(f"| {r['rows']:,} | {r['workers']} | {r['run_seconds']} | {r['run_recorded_seconds']} | "
                  f"{r['shard_phase_seconds']} | {r['device_seconds']} | {r['speedup_run']} | "
                  f"{r['speedup_run_recorded']} | {r['speedup_shards']} | {r['gpu_held_seconds']} | "
                  f"{r['gpu_idle_seconds']} | {r['gpu_idle_share']} |")


if __name__ == "__main__":
    main()
