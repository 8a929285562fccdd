"""GPU queues: the capacity watcher's tick over N runs that Kueue keeps waiting, and how close the
wait estimate comes on a replayed history. One run, both parts:

    .venv/bin/python bench/queue_bench.py --runs 1000 --replay-runs 2000

1. Kueue mode, on the real control plane and a real Kueue (both built by tools/k8s/build.sh) and a
   real Dagster instance (SQLite, one consolidated event database): N STARTING GPU runs of class
   l4, each with its Job created as the launcher makes it (Kueue's queue label), all suspended by
   Kueue behind a ClusterQueue whose one GPU is taken. The tick is timed first (it writes each
   run's tags, wait event and estimate), then steady; the Kubernetes API calls of a tick are
   counted for N and for N/10, to show they do not grow with the runs.
2. The estimate on a replayed queue: a class of C GPUs, runs of a few kinds of work arriving at
   random (seeded), their durations spread around each kind's mean, admitted first come first
   served. At each arrival the estimate is made from what the instance would know then (finished
   runs' durations, who holds the GPUs since when, who is ahead) and compared with the wait that
   followed. Reported: median absolute error, and the share within 25 % / 50 %; no target yet.
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def kueue_tick(runs: int) -> dict[str, float]:
    import kubernetes
    import yaml
    from dagster import DagsterRunStatus
    from dagster._core.test_utils import create_run_for_test, instance_for_test

    from gpufn_dagster.class_files import load_gpu_classes
    from gpufn_dagster.run.kueue import kueue_labels, kueue_manifests
    from gpufn_dagster.tags import CLASS_LABEL, COUNT_LABEL
    from gpufn_dagster.run.k8s.watch import CapacityWatcher
    from gpufn_devcluster.cluster import DevCluster, binaries_dir
    from gpufn_devcluster.kueue import KUEUE_NAMESPACE_LABEL, Kueue, apply_objects

    work = Path(tempfile.mkdtemp(prefix="gpufn-queue-bench-"))
    classes_dir = work / "classes"
    classes_dir.mkdir()
    for path in (REPO / "classes").glob("*.yaml"):
        text = path.read_text()
        if path.stem == "l4":
            text += yaml.safe_dump({"kueue": {"local_queue": "gpu-l4", "priority_class": "gpufn-normal"}})
        (classes_dir / path.name).write_text(text)
    classes = load_gpu_classes(classes_dir)
    l4 = classes["l4"]
    storage = {"event_log_storage": {"module": "dagster._core.storage.event_log",
                                     "class": "ConsolidatedSqliteEventLogStorage",
                                     "config": {"base_dir": str(work / "events")}}}
    bins = binaries_dir()
    with DevCluster(bins) as cluster, Kueue(bins, cluster), instance_for_test(overrides=storage) as instance:
        cluster.add_pools([l4], nodes_per_class=1, cpu=1, gpus_per_node=1)
        client = cluster.api_client()
        core, batch = kubernetes.client.CoreV1Api(client), kubernetes.client.BatchV1Api(client)
        namespace = "bench"
        core.create_namespace({"metadata": {"name": namespace, "labels": {KUEUE_NAMESPACE_LABEL: "true"}}})
        apply_objects(cluster, kueue_manifests([l4], {"l4": 1}, namespace))

        def job(run_id: str) -> dict:
            name = f"dagster-run-{run_id}"
            labels = {"dagster/run-id": run_id, CLASS_LABEL: "l4", COUNT_LABEL: "1", **kueue_labels(l4)}
            return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "labels": labels},
                    "spec": {"template": {"metadata": {"labels": {"dagster/run-id": run_id, CLASS_LABEL: "l4",
                                                                  "gpufn.dev/fake-outcome": "hold"}},
                                          "spec": {"restartPolicy": "Never", "nodeSelector": dict(l4.node_selector),
                                                   "tolerations": [t.to_k8s() for t in l4.tolerations],
                                                   "containers": [{"name": "dagster", "image": "img", "resources": {
                                                       "requests": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"},
                                                       "limits": {"nvidia.com/gpu": "1"}}}]}}}}

        tags = {"gpufn/placement": "gpu", "gpufn/gpu-class": "l4", ".dagster/gpufn-gpu-count": "1"}
        holder = create_run_for_test(instance, job_name="gpu", status=DagsterRunStatus.STARTING, tags=tags)
        batch.create_namespaced_job(namespace, job(holder.run_id))
        run_ids = []
        for _ in range(runs):
            run = create_run_for_test(instance, job_name="gpu", status=DagsterRunStatus.STARTING, tags=tags)
            run_ids.append(run.run_id)
            batch.create_namespaced_job(namespace, job(run.run_id))
        custom = kubernetes.client.CustomObjectsApi(client)
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            items = custom.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", namespace, "workloads")["items"]
            pending = sum(not any(c["type"] == "Admitted" and c["status"] == "True"
                                  for c in (w.get("status") or {}).get("conditions") or []) for w in items)
            if pending == runs:
                break
            print(f"waiting for Kueue: {pending} of {runs} Workloads pending, {len(items)} made", flush=True)
            time.sleep(2)
        else:
            raise RuntimeError(f"only {pending} of {runs} Workloads pending after 900 s")

        calls = []
        original = kubernetes.client.ApiClient.call_api

        def counted(self, *args, **kwargs):
            calls.append(args[0])
            return original(self, *args, **kwargs)
        kubernetes.client.ApiClient.call_api = counted
        try:
            watcher = CapacityWatcher(instance, core, batch, classes, namespace)
            timings: dict[str, float] = {}
            for label in ("first tick (tags, wait event and estimate per run)", "steady tick (nothing changed)",
                          "steady tick again"):
                calls.clear()
                started = time.perf_counter()
                report = watcher.tick()
                timings[label] = time.perf_counter() - started
                assert report.classes["l4"].waiting == runs, report.summary()
            timings[f"Kubernetes API calls per tick ({runs} runs)"] = len(calls)
            small = CapacityWatcher(instance, core, batch, classes, namespace)
            for run_id in run_ids[runs // 10:]:  # the same tick with a tenth of the runs still waiting
                instance.report_run_canceled(instance.get_run_by_id(run_id))
            small.tick()  # deletes the canceled runs' suspended Jobs (one call each), once
            calls.clear()
            small.tick()
            timings[f"Kubernetes API calls per tick ({runs // 10} runs)"] = len(calls)
        finally:
            kubernetes.client.ApiClient.call_api = original
        print(f"tick summary: {report.summary()}")
    return timings


def replay(runs: int, gpus: int, seed: int) -> dict[str, float]:
    """The estimate against the waits of a simulated first-come-first-served queue of `runs` runs."""
    from gpufn_dagster.run.estimate import Ahead, Holder, QueueState, estimate_wait

    rng = random.Random(seed)
    kinds = {"embed": 600.0, "caption": 240.0, "rerank": 90.0, "train": 1800.0}
    weights = [0.4, 0.3, 0.2, 0.1]
    mean_duration = sum(w * m for w, m in zip(weights, kinds.values(), strict=True))
    gap = mean_duration / gpus / 0.9  # arrivals at 90 % load: queues form and drain
    clock, arrivals = 0.0, []
    for _ in range(runs):
        clock += rng.expovariate(1 / gap)
        kind = rng.choices(list(kinds), weights)[0]
        arrivals.append((clock, kind, kinds[kind] * rng.lognormvariate(0, 0.35)))
    # The true schedule: FIFO on `gpus` GPUs.
    free = [(0.0, i) for i in range(gpus)]
    starts = []
    for arrived, _, duration in arrivals:
        at, gpu = heapq.heappop(free)
        start = max(at, arrived)
        starts.append(start)
        heapq.heappush(free, (start + duration, gpu))
    errors, relative, history = [], [], defaultdict(list)
    finished = sorted(range(runs), key=lambda i: starts[i] + arrivals[i][2])
    done = 0
    for i, (arrived, kind, _) in enumerate(arrivals):
        while done < runs and starts[finished[done]] + arrivals[finished[done]][2] <= arrived:
            j = finished[done]
            history[arrivals[j][1]].insert(0, arrivals[j][2])
            done += 1
        holding = [Holder(arrivals[j][1], 1, arrived - starts[j]) for j in range(i)
                   if starts[j] <= arrived < starts[j] + arrivals[j][2]]
        ahead = [Ahead(arrivals[j][1], 1) for j in range(i) if starts[j] > arrived]
        if i < 50:  # warm-up: no history yet for every kind
            continue
        estimate = estimate_wait(QueueState("l4", gpus, holding, ahead, 1), {k: v[:20] for k, v in history.items()})
        if estimate.seconds is None:
            continue
        actual = starts[i] - arrived
        errors.append(abs(estimate.seconds - actual))
        if actual >= 60:
            relative.append(abs(estimate.seconds - actual) / actual)
    return {"runs estimated": len(errors), "median absolute error (min)": statistics.median(errors) / 60,
            "mean actual wait (min)": statistics.mean(starts[i] - arrivals[i][0] for i in range(runs)) / 60,
            "within 25 % (waits >= 1 min)": sum(r <= 0.25 for r in relative) / len(relative),
            "within 50 % (waits >= 1 min)": sum(r <= 0.5 for r in relative) / len(relative)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--replay-runs", type=int, default=2000)
    parser.add_argument("--replay-gpus", type=int, default=4)
    parser.add_argument("--seed", type=int, default=13)
    args = parser.parse_args()
    timings = kueue_tick(args.runs)
    print(f"| {args.runs} runs waiting in Kueue | value |\n| --- | --- |")
    for label, value in timings.items():
        print(f"| {label} | {value:.2f} |" if isinstance(value, float) else f"| {label} | {value} |")
    accuracy = replay(args.replay_runs, args.replay_gpus, args.seed)
    print(f"\n| replayed queue: {args.replay_runs} runs on {args.replay_gpus} GPUs, seed {args.seed} | value |\n"
          "| --- | --- |")
    for label, value in accuracy.items():
        print(f"| {label} | {value:.2f} |" if isinstance(value, float) else f"| {label} | {value} |")


if __name__ == "__main__":
    main()
