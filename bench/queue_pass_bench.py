"""The embedded queue's pass (GpuQueuedRunCoordinator.get_run_queue_config, which the queue daemon
calls before every dequeue) over N GPU steps waiting for class l4's local slots, N = 1,000 and
10,000 side by side in one run, on a real Dagster instance (SQLite, as `dagster dev` stores it; or
`--storage postgres`, a real PostgreSQL server through dagster-postgres).

    .venv/bin/python bench/queue_pass_bench.py --steps 1000,10000

Each waiting step is a STARTED run's step whose claim sits in Dagster's concurrency pool `gpu-l4`
behind the runs holding its slots -- exactly what a run's GPU step leaves there when the slots are
taken. Per N, in an instance of its own: the pass in which all N are told (it writes first in
line first for `write_budget.QUEUE_PASS_WRITE_SECONDS`, then leaves the rest to the next passes),
the first passes (how many steps a pass tells), a pass allowed to write nothing twice (what the
steady pass costs: its reads and decisions), and the pass after one slot freed (the first in line gets it, the others move up one place). Wall and
this process's CPU seconds, and the ratio of the largest N to the smallest.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from dagster import DagsterRunStatus
from dagster._core.test_utils import create_run_for_test, instance_for_test

from gpufn_dagster.class_files import load_gpu_classes
from gpufn_dagster.tags import CAPACITY_TAG, PLACEMENT_TAG, WAIT_ESTIMATE_TAG, RunKind, gpu_pool, run_gpu_tags
from gpufn_devcluster.postgres import Postgres
from capacity_bench import print_sizes  # bench/, beside this script: the same table

REPO = Path(__file__).resolve().parents[1]


def timed(fn) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def measure(storage: dict, classes_dir: Path, steps: int, max_passes: int) -> dict[str, tuple[float, float, str]]:
    overrides = {**storage, "run_coordinator": {"module": "gpufn_dagster", "class": "GpuQueuedRunCoordinator",
                                                "config": {"classes_dir": str(classes_dir)}}}
    out: dict[str, tuple[float, float, str]] = {}
    with instance_for_test(overrides=overrides) as instance:
        pool, coordinator = gpu_pool("l4"), instance.run_coordinator
        tags = {**run_gpu_tags("l4", 1), PLACEMENT_TAG: RunKind.LOCAL.value}  # as the coordinator placed it
        coordinator.get_run_queue_config()  # limits the pool to the class's slots
        started = time.perf_counter()
        slots = load_gpu_classes(classes_dir)["l4"].local.slots
        with ThreadPoolExecutor(8) as threads:  # PostgreSQL round trips: made side by side
            runs = list(threads.map(lambda _: create_run_for_test(instance, job_name="embedding",
                                                                   status=DagsterRunStatus.STARTED, tags=tags),
                                    range(steps + slots)))
            list(threads.map(lambda run: instance.event_log_storage.claim_concurrency_slot(pool, run.run_id, "embedding"),
                             runs))
        print(f"  {steps} waiting steps made in {time.perf_counter() - started:.0f} s", flush=True)
        waiting = runs[slots:]

        def told() -> tuple[int, int]:
            """(steps told they wait, of those also told their estimate)."""
            tags = [r.tags for r in instance.get_runs() if r.tags.get(CAPACITY_TAG) == "waiting"]
            return len(tags), sum(WAIT_ESTIMATE_TAG in t for t in tags)

        wall, cpu = timed(coordinator.get_run_queue_config)
        waits, estimated = told()
        out["first pass (all start waiting)"] = (wall, cpu, f"{waits} of {steps} told, {estimated} estimated")
        passes, total_wall, total_cpu = 1, wall, cpu
        while told() != (steps, steps) and passes < max_passes:
            wall, cpu = timed(coordinator.get_run_queue_config)
            passes, total_wall, total_cpu = passes + 1, total_wall + wall, total_cpu + cpu
        waits, estimated = told()
        rate = (waits + estimated) / 2 / total_wall
        out[f"the first passes, while steps are told (at most {max_passes})"] = (
            total_wall, total_cpu, f"{passes} pass(es), {waits} of {steps} told, {estimated} estimated: "
            f"{rate:.0f} steps/s told and estimated"
            + ("" if estimated == steps else f"; all {steps} in about {steps / max(rate, 1e-9) / 60:.0f} min at that rate"))
        # The steady pass writes nothing: timed here with nothing allowed to be written (telling all
        # 10,000 first would take tens of minutes of storage writes here), which is its reads and decisions.
        budget, coordinator._write_seconds = coordinator._write_seconds, 0.0
        for label in ("pass writing nothing (the steady pass's reads and decisions)", "the same again"):
            out[label] = (*timed(coordinator.get_run_queue_config), "")
        coordinator._write_seconds = budget
        instance.event_log_storage.free_concurrency_slots_for_run(runs[0].run_id)
        wall, cpu = timed(coordinator.get_run_queue_config)
        out["pass after a slot freed (the line moved)"] = (wall, cpu, f"{len(waiting) - 1} steps moved up")
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", default="1000,10000", help="waiting steps, comma-separated sizes")
    parser.add_argument("--storage", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--passes", type=int, default=6, help="the most passes timed while steps are told")
    args = parser.parse_args()
    sizes = [int(n) for n in args.steps.split(",")]
    work = Path(tempfile.mkdtemp(prefix="gpufn-queue-pass-bench-"))
    classes_dir = work / "classes"
    shutil.copytree(REPO / "classes", classes_dir)
    results = {}
    with ExitStack() as stack:
        postgres = stack.enter_context(Postgres()) if args.storage == "postgres" else None
        for steps in sizes:
            storage = {"storage": {"postgres": {"postgres_url": postgres.database()}}} if postgres else {}
            results[steps] = measure(storage, classes_dir, steps, args.passes)
    print_sizes(args.storage, "steps", sizes, results)


if __name__ == "__main__":
    main()
