"""The capacity watcher's ticks over N waiting GPU runs, N = 1,000 and 10,000 side by side in one
run, on the real control plane (kube-apiserver + kube-scheduler + KWOK from tools/k8s/build.sh)
with 1,000 nodes of four GPU classes, and a real Dagster instance in PostgreSQL (Debian's server,
dagster-postgres; `--storage sqlite` for a consolidated SQLite event database instead).

    .venv/bin/python bench/capacity_bench.py --runs 1000,10000 --nodes 1000

Every GPU node (one GPU each) is taken by a pod that is not a run's, so each run's pod is
Unschedulable for want of room (`Insufficient nvidia.com/gpu` on its class's nodes, node selector
mismatches on the others'). Per N, in a namespace and a database of its own:

- the tick in which all N start waiting (each run's tags, wait event and estimate are written
  first in line first until the tick's write budget, `write_budget.WRITE_SECONDS`, is spent; the
  rest on the next ticks), and the first few ticks after it (how many runs a tick tells);
- a tick allowed to write nothing, twice: what the steady tick costs (its reads and decisions);
  and once more as a minute on, when no run was updated within the kept runs' overlap (the line
  has stood still), so the tick reads none of them again;
- the same steady ticks as the `gpu_capacity` sensor makes them, its pods, events and nodes kept
  current by watches (`informers`) after its first tick, which lists them;
- a tick in which each class's line moves (one GPU freed per class: its first run is scheduled,
  the others move up one place);
- the per-run alternative a user would reach for, what dagster-k8s's health check and debug info
  do (one pod read and one event list per run), on 1,000 runs and scaled to N.

Wall and this process's CPU seconds for each, and the ratio of N = 10,000 to N = 1,000.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import kubernetes
from dagster import DagsterRunStatus
from dagster._core.test_utils import create_run_for_test, instance_for_test

from gpufn_dagster.class_files import load_gpu_classes
from gpufn_dagster.run.k8s.informers import Informers
from gpufn_dagster.run.k8s.watch import CapacityWatcher
from gpufn_dagster.run.kept_runs import OVERLAP_SECONDS
from gpufn_dagster.run.write_budget import WRITE_SECONDS
from gpufn_dagster.tags import CAPACITY_TAG, CLASS_LABEL, COUNT_LABEL, run_gpu_tags
from gpufn_devcluster.cluster import DevCluster, binaries_dir
from gpufn_devcluster.nodes import cpu_nodes, gpu_nodes
from gpufn_devcluster.postgres import Postgres

REPO = Path(__file__).resolve().parents[1]
CLASSES = ("default", "l4", "a100-80gb", "h100-80gb")
HOLD = "gpufn.dev/fake-outcome"  # KWOK keeps a pod so labelled running (unlabelled ones succeed at once)


def run_pod(run_id: str, gpu_class, namespace: str) -> dict:
    """A GPU run worker pod of `gpu_class` asking for one GPU, as the launcher labels it."""
    name = f"dagster-run-{run_id}"
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"dagster/run-id": run_id, "job-name": name, CLASS_LABEL: gpu_class.name,
                                    COUNT_LABEL: "1", HOLD: "hold"}},
            "spec": {"nodeSelector": dict(gpu_class.node_selector), "restartPolicy": "Never",
                     "tolerations": [t.to_k8s() for t in gpu_class.tolerations],
                     "containers": [{"name": "dagster", "image": "img",
                                     "resources": {"limits": {gpu_class.resource_name: "1"}}}]}}


def taker(node: str) -> dict:
    """A pod that is not a run's, bound to `node`, taking its one GPU."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"take-{node}", "labels": {HOLD: "hold"}},
            "spec": {"nodeName": node, "restartPolicy": "Never", "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": "c", "image": "img", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


def timed(fn) -> tuple[float, float, object]:
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def measure(cluster: DevCluster, classes: dict, instance, namespace: str, runs: int,
            gpu_nodes_by_class: dict[str, list[str]], max_ticks: int) -> dict[str, tuple[float, float, str]]:
    """(wall s, CPU s, note) of each tick over `runs` waiting runs of `instance`, their pods in `namespace`."""
    client = cluster.api_client()
    core, batch = kubernetes.client.CoreV1Api(client), kubernetes.client.BatchV1Api(client)
    core.create_namespace({"metadata": {"name": namespace}})
    core.create_namespace({"metadata": {"name": f"{namespace}-takers"}})
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda node: core.create_namespaced_pod(f"{namespace}-takers", taker(node)),
                      [n for nodes in gpu_nodes_by_class.values() for n in nodes]))
    started = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:  # PostgreSQL and API round trips: made side by side
        run_ids = list(pool.map(lambda i: create_run_for_test(
            instance, job_name="gpu", status=DagsterRunStatus.STARTING,
            tags={"gpufn/placement": "gpu", **run_gpu_tags(CLASSES[i % len(CLASSES)], 1)}).run_id, range(runs)))
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda pair: core.create_namespaced_pod(namespace, run_pod(pair[0], pair[1], namespace)),
                      [(run_id, classes[CLASSES[i % len(CLASSES)]]) for i, run_id in enumerate(run_ids)]))
    deadline = time.monotonic() + 1800
    while time.monotonic() < deadline:
        pods = kubernetes.client.CoreV1Api(client).list_namespaced_pod(namespace, _preload_content=False)
        text = pods.data.decode()
        if text.count('"reason":"Unschedulable"') >= runs:
            break
        time.sleep(5)
    print(f"  {runs} runs and pods made, all Unschedulable, in {time.perf_counter() - started:.0f} s", flush=True)
    watcher = CapacityWatcher(instance, core, batch, classes, namespace, deadline_seconds=120)
    out: dict[str, tuple[float, float, str]] = {}

    def told() -> int:
        return sum(1 for r in instance.get_runs() if r.tags.get(CAPACITY_TAG) == "waiting")

    wall, cpu, report = timed(watcher.tick)
    waiting = sum(r.waiting for r in report.classes.values())
    assert waiting == runs, report.summary()
    out["first tick (all start waiting)"] = (wall, cpu, f"{told()} of {runs} told, {report.left_out} updates left")
    ticks, total_wall, total_cpu = 1, wall, cpu
    while report.left_out and ticks < max_ticks:
        wall, cpu, report = timed(watcher.tick)
        ticks, total_wall, total_cpu = ticks + 1, total_wall + wall, total_cpu + cpu
    rate = told() / total_wall
    out[f"the first ticks, while runs are told (at most {max_ticks})"] = (
        total_wall, total_cpu, f"{ticks} tick(s), {told()} of {runs} told ({rate:.0f} runs/s, tags, event and estimate)"
        + ("" if not report.left_out else f"; all {runs} in about {runs / max(rate, 1e-9) / 60:.0f} min at that rate"))
    # The steady tick writes nothing: timed with nothing allowed to be written (telling 10,000 runs
    # first takes tens of minutes of storage writes here), which is its reads and decisions.
    watcher.write_seconds = 0.0
    for label in ("tick writing nothing (the steady tick's reads and decisions)", "the same again"):
        wall, cpu, report = timed(watcher.tick)
        out[label] = (wall, cpu, f"{report.left_out} updates not written")
    # ... and once the line has stood still for a minute: no run was updated within the kept runs'
    # overlap, so the tick reads none again (the kept runs' clock moved on, not the machine's).
    watcher.runs.clock = lambda: time.time() + OVERLAP_SECONDS + 1
    wall, cpu, report = timed(watcher.tick)
    out["the same a minute on (no run updated since)"] = (wall, cpu, f"{report.left_out} updates not written")
    watcher.runs.clock = time.time
    # The sensor's ticks: the first lists and starts the watches, the next read what they keep.
    informers = Informers()
    sensor = CapacityWatcher(instance, core, batch, classes, namespace, deadline_seconds=120, write_seconds=0.0,
                             runs=watcher.runs, informers=informers)
    wall, cpu, report = timed(sensor.tick)
    out["sensor's first tick writing nothing (lists, starts the watches)"] = (wall, cpu, "")
    time.sleep(2)
    for label in ("sensor's steady tick (kept lists, writing nothing)", "the sensor's steady tick again"):
        wall, cpu, report = timed(sensor.tick)
        assert sum(r.waiting for r in report.classes.values()) == runs, report.summary()
        out[label] = (wall, cpu, f"{report.left_out} updates not written")
    watcher.runs.clock = lambda: time.time() + OVERLAP_SECONDS + 1
    wall, cpu, report = timed(sensor.tick)
    out["the sensor's a minute on (kept lists, no run updated since)"] = (wall, cpu, "")
    watcher.runs.clock = time.time
    informers.stop()
    watcher.write_seconds = WRITE_SECONDS
    for nodes in gpu_nodes_by_class.values():  # one GPU of each class frees: the first in line gets it
        core.delete_namespaced_pod(f"take-{nodes[0]}", f"{namespace}-takers", grace_period_seconds=0)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        placed = [p for p in core.list_namespaced_pod(namespace, field_selector="spec.nodeName!=").items]
        if len(placed) >= min(len(gpu_nodes_by_class), runs):  # each class with a run in line places one
            break
        time.sleep(2)
    wall, cpu, report = timed(watcher.tick)
    out["tick after each line moved (one GPU freed per class)"] = (wall, cpu, f"{report.left_out} updates left")
    sample = run_ids[:1000]
    wall, cpu, _ = timed(lambda: [
        core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={core.list_namespaced_pod(namespace, label_selector=f'dagster/run-id={run_id}').items[0].metadata.name}")
        for run_id in sample])
    scale = runs / len(sample)
    out["per-run reads (pod + events per run), no processing"] = (
        wall * scale, cpu * scale, f"{len(sample)} runs read{f', scaled x{scale:g}' if scale != 1 else ''}")
    core.delete_namespace(namespace)
    core.delete_namespace(f"{namespace}-takers")
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and core.list_namespaced_pod(f"{namespace}-takers", limit=1).items:
        time.sleep(3)
    return out


Figures = Mapping[str, tuple[float, float, str]]  # label -> (wall s, CPU s, note)


def print_sizes(title: str, unit: str, sizes: Sequence[int], results: Mapping[int, Figures]) -> None:
    """A Markdown table of `results` (size -> figures) and the notes below it."""
    small, big = sizes[0], sizes[-1]
    print(f"\n| {title} | " + " | ".join(f"{n} {unit}: wall s | CPU s" for n in sizes)
          + (f" | {big}/{small} wall | {big}/{small} CPU |" if len(sizes) > 1 else " |"))
    print("| --- |" + " --- | --- |" * len(sizes) + (" --- | --- |" if len(sizes) > 1 else ""))
    for label in results[small]:
        cells = [f"{results[n][label][0]:.2f} | {results[n][label][1]:.2f}" for n in sizes]
        ratios = ([f"{results[big][label][0] / max(results[small][label][0], 1e-9):.1f}",
                   f"{results[big][label][1] / max(results[small][label][1], 1e-9):.1f}"] if len(sizes) > 1 else [])
        print(f"| {label} | " + " | ".join(cells + ratios) + " |")
    print()
    for n in sizes:
        for label, (_, _, note) in results[n].items():
            if note:
                print(f"  {n} {unit}, {label}: {note}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", default="1000,10000", help="waiting runs, comma-separated sizes")
    parser.add_argument("--nodes", type=int, default=1000, help="KWOK nodes: four GPU classes and 4 %% CPU nodes")
    parser.add_argument("--storage", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--ticks", type=int, default=4, help="the most ticks timed while runs are told")
    args = parser.parse_args()
    sizes = [int(n) for n in args.runs.split(",")]
    classes = load_gpu_classes(REPO / "classes")
    work = Path(tempfile.mkdtemp(prefix="gpufn-capacity-bench-"))
    per_class = (args.nodes - args.nodes // 25) // len(CLASSES)
    results: dict[int, dict[str, tuple[float, float, str]]] = {}
    with ExitStack() as stack:
        cluster = stack.enter_context(DevCluster(binaries_dir()))
        postgres = stack.enter_context(Postgres()) if args.storage == "postgres" else None
        by_class = {}
        for name in CLASSES:
            manifests = gpu_nodes(classes[name], per_class, gpus_per_node=1)
            by_class[name] = cluster.add_nodes(manifests, timeout=600)
        cluster.add_nodes(cpu_nodes(args.nodes - per_class * len(CLASSES)), timeout=600)
        print(f"{args.nodes} nodes: {per_class} of each of {', '.join(CLASSES)} (one GPU each), the rest CPU",
              flush=True)
        for runs in sizes:
            storage = ({"storage": {"postgres": {"postgres_url": postgres.database()}}} if postgres else
                       {"event_log_storage": {"module": "dagster._core.storage.event_log",
                                              "class": "ConsolidatedSqliteEventLogStorage",
                                              "config": {"base_dir": str(work / f"events-{runs}")}}})
            with instance_for_test(overrides=storage) as instance:
                results[runs] = measure(cluster, classes, instance, f"bench-{runs}", runs, by_class, args.ticks)
    print_sizes(f"{args.storage}, {args.nodes} nodes", "runs", sizes, results)


if __name__ == "__main__":
    main()
