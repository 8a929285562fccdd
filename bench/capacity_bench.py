"""One capacity-watcher tick over N waiting GPU runs, on the real control plane (kube-apiserver +
kube-scheduler + KWOK from tools/k8s/build.sh) and a real Dagster instance (SQLite), side by side
with the per-run approach (one pod read + one event list per run, what dagster-k8s's health and
debug-info calls do).

    .venv/bin/python bench/capacity_bench.py --runs 1000
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import kubernetes
from dagster import DagsterRunStatus
from dagster._core.test_utils import create_run_for_test, instance_for_test

from gpufn_dagster.run.watch import CapacityWatcher
from gpufn_dagster.classes import load_gpu_classes
from gpufn_devcluster.cluster import DevCluster, binaries_dir

REPO = Path(__file__).resolve().parents[1]


def pending_pod(run_id: str) -> dict:
    """A GPU run worker pod of class a100-80gb that cannot be placed (its pool has no node here)."""
    name = f"dagster-run-{run_id}"
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"dagster/run-id": run_id, "job-name": name,
                                                  "gpufn.dev/gpu-class": "a100-80gb"}},
            "spec": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}, "restartPolicy": "Never",
                     "containers": [{"name": "dagster", "image": "img",
                                     "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1000)
    args = parser.parse_args()
    classes = load_gpu_classes(REPO / "classes")
    # One event database for all runs, as in a production (Postgres) deployment; Dagster's default
    # SQLite storage keeps a database file per run and migrates each on first use in a process.
    work = Path(tempfile.mkdtemp(prefix="gpufn-capacity-bench-"))
    storage = {"event_log_storage": {"module": "dagster._core.storage.event_log",
                                     "class": "ConsolidatedSqliteEventLogStorage",
                                     "config": {"base_dir": str(work / "events")}}}
    with DevCluster(binaries_dir()) as cluster, instance_for_test(overrides=storage) as instance:
        cluster.add_pools([c for c in classes.values() if c.name == "l4"], nodes_per_class=1, cpu=1)
        client = cluster.api_client()
        core, batch = kubernetes.client.CoreV1Api(client), kubernetes.client.BatchV1Api(client)
        run_ids = []
        for _ in range(args.runs):
            run = create_run_for_test(instance, job_name="gpu", status=DagsterRunStatus.STARTING,
                                      tags={"gpufn/placement": "gpu", "gpufn/gpu-class": "a100-80gb",
                                            ".dagster/gpufn/gpu-count": "2"})
            run_ids.append(run.run_id)
            core.create_namespaced_pod("default", pending_pod(run.run_id))
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            pods = core.list_namespaced_pod("default", label_selector="gpufn.dev/gpu-class").items
            if sum(any(c.reason == "Unschedulable" for c in p.status.conditions or []) for p in pods) == args.runs:
                break
            time.sleep(2)
        watcher = CapacityWatcher(instance, core, batch, classes, "default")
        timings = {}
        for label in ("first tick (records 1 tag set + 1 event per run)", "steady tick (nothing changed)",
                      "steady tick again"):
            started = time.perf_counter()
            report = watcher.tick()
            timings[label] = time.perf_counter() - started
            assert report.classes["a100-80gb"].waiting == args.runs, report.summary()
        started = time.perf_counter()
        for run_id in run_ids:  # the per-run alternative: read each run's pod and its events
            pod = core.list_namespaced_pod("default", label_selector=f"dagster/run-id={run_id}").items[0]
            core.list_namespaced_event("default", field_selector=f"involvedObject.name={pod.metadata.name}")
        timings["per-run reads (pod + events per run), no processing"] = time.perf_counter() - started
    print(f"| {args.runs} waiting GPU runs | seconds |\n| --- | --- |")
    for label, seconds in timings.items():
        print(f"| {label} | {seconds:.2f} |")


if __name__ == "__main__":
    main()
