"""The deployed path, timed: Dagster deployed on the development cluster as its Helm chart deploys
it (`gpufn_devcluster.deployment`: code server and daemon pods, the instance in PostgreSQL, the
table on SeaweedFS, a CPU and a GPU real node), one fanned-out refresh per N shards launched
through the webserver's GraphQL API as the Launchpad does: launch -> first shard pod running,
launch -> commit step done, launch -> run ended, side by side for each N in one run, with each
figure's ratio to N = 1.

    .venv/bin/python bench/deploy_bench.py --shards 1,2,4 --fragment-rows 1100

Every refresh computes `--fragment-rows` new rows per shard (a shard takes at least 1,024); the
Function is the real-node tests' (`tests/integration/realnode_defs.py`: upper-cases a text).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import dagster as dg
import kubernetes
import lancedb
import pyarrow as pa

from gpufn_dagster.class_files import load_gpu_classes
from gpufn_devcluster.cluster import DevCluster, binaries_dir
from gpufn_devcluster.deployment import Deployment, small_classes
from gpufn_devcluster.objectstore import ObjectStore
from gpufn_devcluster.postgres import Postgres
from gpufn_devcluster.realnode import RealNode

REPO = Path(__file__).resolve().parents[1]
DEFS = REPO / "tests" / "integration" / "realnode_defs.py"


def _docs(start: int, count: int) -> pa.Table:
    return pa.table({"id": list(range(start, start + count)), "text": [f"doc {i}" for i in range(start, start + count)]})


def one_refresh(deployment: Deployment, table, shards: int, rows: int) -> dict[str, float]:
    """Seconds from launch to the first shard pod running, to the commit step's success, to the run's end."""
    start = table.count_rows()
    for index in range(shards):  # one new fragment per shard
        table.add(_docs(start + index * rows, rows))
    core = kubernetes.client.CoreV1Api(deployment.cluster.api_client())
    launched = time.time()
    run_id = deployment.launch("docs__shout", {"ops": {"docs__shout": {"ops": {"docs__shout_plan": {
        "config": {"workers": shards}}}}}})
    first_shard = None
    while (run := deployment.instance.get_run_by_id(run_id)).status not in (
            dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE):
        if first_shard is None and any(
                p.status.phase == "Running" and (p.spec.containers[0].resources.limits or {}).get("nvidia.com/gpu")
                for p in core.list_namespaced_pod(deployment.namespace, label_selector=f"dagster/run-id={run_id}").items):
            first_shard = time.time()
        if time.time() - launched > 900:
            raise RuntimeError(f"run {run_id} still {run.status} after 900 s")
        time.sleep(0.25)
    if run.status != dg.DagsterRunStatus.SUCCESS:
        raise RuntimeError(f"run {run_id} failed")
    commit = next(e.timestamp for e in deployment.instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_SUCCESS)
                  if e.step_key.endswith("_commit"))
    shard_steps = {e.step_key for e in deployment.instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_SUCCESS)
                   if "_shard" in e.step_key}
    if len(shard_steps) != shards:
        raise RuntimeError(f"run {run_id} ran {len(shard_steps)} shards, not {shards}")
    ended = deployment.instance.get_run_record_by_id(run_id).end_time
    return {"launch -> first shard pod running": (first_shard or commit) - launched,
            "launch -> commit done": commit - launched, "launch -> run ended": ended - launched}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shards", default="1,2,4", help="the shard counts to time, in one run")
    parser.add_argument("--fragment-rows", type=int, default=1100)
    args = parser.parse_args()
    counts = [int(n) for n in args.shards.split(",")]
    work = Path(tempfile.mkdtemp(prefix="gpufn-deploy-bench-"))
    classes = small_classes(REPO / "classes", Path(tempfile.mkdtemp(prefix="gpufn-deploy-classes-")))
    results: dict[int, dict[str, float]] = {}
    with DevCluster(binaries_dir()) as cluster, ObjectStore(binaries_dir()) as store, Postgres() as postgres, \
            RealNode(binaries_dir(), cluster, load_gpu_classes(classes)["l4"], gpus=max(counts), name="real-l4") as _, \
            RealNode(binaries_dir(), cluster, None, name="real-cpu") as _cpu:
        db_uri = store.uri("deploy-bench")
        table = lancedb.connect(db_uri, storage_options=store.storage_options).create_table("docs", _docs(0, 1))
        env = {"GPUFN_LANCEDB_URI": db_uri, "GPUFN_TEST_LOG": str(work / "calls.log")}
        with Deployment(cluster, store, postgres, classes, DEFS, work, env) as deployment:
            one_refresh(deployment, table, 1, args.fragment_rows)  # warm: the first run also fills the 1-row fragment
            for shards in counts:
                results[shards] = one_refresh(deployment, table, shards, args.fragment_rows)
    print(f"| seconds ({args.fragment_rows} rows a shard) | " + " | ".join(f"N = {n}" for n in counts)
          + " | " + " | ".join(f"N = {n} / N = {counts[0]}" for n in counts[1:]) + " |")
    print("| --- |" + " --- |" * (2 * len(counts) - 1))
    for label in results[counts[0]]:
        cells = [f"{results[n][label]:.1f}" for n in counts]
        ratios = [f"{results[n][label] / results[counts[0]][label]:.2f}" for n in counts[1:]]
        print(f"| {label} | " + " | ".join(cells + ratios) + " |")


if __name__ == "__main__":
    main()
