"""One capacity-watcher tick over N waiting GPU runs, on the real control plane (kube-apiserver +
kube-scheduler + KWOK from tools/k8s/build.sh) and a real Dagster instance stored in SQLite and
in PostgreSQL (Debian's server, dagster-postgres), side by side in one run, with the per-run
approach beside each (one pod read + one event list per run, what dagster-k8s's health and
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

from gpufn_dagster.run.k8s.watch import CapacityWatcher
from gpufn_dagster.class_files import load_gpu_classes
from gpufn_dagster.tags import run_gpu_tags
from gpufn_devcluster.cluster import DevCluster, binaries_dir
from gpufn_devcluster.postgres import Postgres

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


def measure(cluster: DevCluster, classes: dict, instance, namespace: str, runs: int) -> dict[str, float]:
    """Seconds of each tick over `runs` waiting runs of `instance`, their pods in `namespace`."""
    client = cluster.api_client()
    core, batch = kubernetes.client.CoreV1Api(client), kubernetes.client.BatchV1Api(client)
    core.create_namespace({"metadata": {"name": namespace}})
    run_ids = []
    for _ in range(runs):
        run = create_run_for_test(instance, job_name="gpu", status=DagsterRunStatus.STARTING,
                                  tags={"gpufn/placement": "gpu", **run_gpu_tags("a100-80gb", 2)})
        run_ids.append(run.run_id)
        core.create_namespaced_pod(namespace, pending_pod(run.run_id))
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        pods = core.list_namespaced_pod(namespace, label_selector="gpufn.dev/gpu-class").items
        if sum(any(c.reason == "Unschedulable" for c in p.status.conditions or []) for p in pods) == runs:
            break
        time.sleep(2)
    watcher = CapacityWatcher(instance, core, batch, classes, namespace)
    timings = {}
    for label in ("first tick (records 1 tag set + 1 event per run)", "steady tick (nothing changed)",
                  "steady tick again"):
        started = time.perf_counter()
        report = watcher.tick()
        timings[label] = time.perf_counter() - started
        assert report.classes["a100-80gb"].waiting == runs, report.summary()
    started = time.perf_counter()
    for run_id in run_ids:  # the per-run alternative: read each run's pod and its events
        pod = core.list_namespaced_pod(namespace, label_selector=f"dagster/run-id={run_id}").items[0]
        core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={pod.metadata.name}")
    timings["per-run reads (pod + events per run), no processing"] = time.perf_counter() - started
    core.delete_namespace(namespace)
    return timings


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--storage", default="sqlite,postgres",
                        help="the instance storages to measure, in one run: sqlite, postgres or both")
    args = parser.parse_args()
    classes = load_gpu_classes(REPO / "classes")
    # SQLite: one event database for all runs (Dagster's default SQLite storage keeps a file per run
    # and migrates each on first use in a process). Postgres: dagster-postgres on a real server, as
    # a Kubernetes deployment of Dagster stores its instance.
    work = Path(tempfile.mkdtemp(prefix="gpufn-capacity-bench-"))
    storages = {
        "sqlite": lambda: {"event_log_storage": {"module": "dagster._core.storage.event_log",
                                                 "class": "ConsolidatedSqliteEventLogStorage",
                                                 "config": {"base_dir": str(work / "events")}}},
        "postgres": lambda: {"storage": {"postgres": {"postgres_url": postgres.database()}}},
    }
    chosen = [name.strip() for name in args.storage.split(",")]
    results: dict[str, dict[str, float]] = {}
    with DevCluster(binaries_dir()) as cluster, Postgres() as postgres:
        cluster.add_pools([c for c in classes.values() if c.name == "l4"], nodes_per_class=1, cpu=1)
        for name in chosen:
            with instance_for_test(overrides=storages[name]()) as instance:
                results[name] = measure(cluster, classes, instance, f"bench-{name}", args.runs)
    print(f"| {args.runs} waiting GPU runs | " + " | ".join(f"{name} (s)" for name in chosen)
          + (" | postgres / sqlite |" if len(chosen) == 2 else " |"))
    print("| --- |" + " --- |" * (len(chosen) + (len(chosen) == 2)))
    for label in results[chosen[0]]:
        cells = [f"{results[name][label]:.2f}" for name in chosen]
        ratio = [f"{results['postgres'][label] / results['sqlite'][label]:.2f}"] if len(chosen) == 2 else []
        print(f"| {label} | " + " | ".join(cells + ratio) + " |")


if __name__ == "__main__":
    main()
