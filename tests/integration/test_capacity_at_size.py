"""Many runs waiting at once, on the real control plane and a PostgreSQL instance: the watcher's
tick writes within its budget, first in line first, and leaves the rest to the next ticks; every run
is told once, with its true place and an estimate for that place; when the line moves, places
follow the rule (`capacity.place_moved`) without a write per run behind."""

from __future__ import annotations

import time

import dagster as dg
import kubernetes
import pytest
from dagster import DagsterRunStatus
from dagster._core.test_utils import create_run_for_test, instance_for_test

from gpufn_dagster.class_files import load_gpu_classes
from gpufn_dagster.run.capacity import POSITION_ALWAYS, POSITION_STEP
from gpufn_dagster.run.estimate import Ahead, estimate_line
from gpufn_dagster.run.history import class_history, class_holders, parts_of, work_of
from gpufn_dagster.run.k8s.watch import CapacityWatcher
from gpufn_dagster.tags import (CAPACITY_TAG, CLASS_LABEL, COUNT_LABEL, HOLDING_SINCE_TAG, PLACEMENT_TAG,
                               QUEUE_POSITION_TAG, WAIT_ESTIMATE_TAG, WAITING_SINCE_TAG, RunKind, run_gpu_tags,
                               time_tag)

from ..conftest import NODES_PER_CLASS, wait_for
from ..helpers import a100, event_metadata, gpu_pod

pytestmark = [pytest.mark.k8s, pytest.mark.postgres]

RUNS = 200
GPUS = 2  # per run; the a100 pool has NODES_PER_CLASS nodes of 8


@dg.asset
def embedding() -> None:
    """The work every waiting run does; two finished runs of it (600 s on their GPUs each) are its history."""


def run_pod(run_id: str, namespace: str) -> dict:
    """A run worker pod as the launcher labels it, asking for GPUS of class a100-80gb."""
    pod = gpu_pod(f"dagster-run-{run_id}", a100(), GPUS)
    pod["metadata"]["labels"] |= {"dagster/run-id": run_id, "job-name": f"dagster-run-{run_id}",
                                 CLASS_LABEL: "a100-80gb", COUNT_LABEL: str(GPUS)}
    return pod


def waits(instance, run_id: str) -> list[dict]:
    return [m for m in event_metadata(instance, run_id) if "Requested" in m or m.get("Position") and "Runs ahead" not in m]


def test_two_hundred_runs_starting_to_wait_are_told_over_ticks_with_true_places_and_estimates(
        cluster, core, namespace, postgres_url, classes_dir):
    fill = [f"fill-{i}" for i in range(NODES_PER_CLASS)]
    for name in fill:
        core.create_namespaced_pod(namespace, gpu_pod(name, a100(), a100().max_gpu_count_per_worker))
    for name in fill:
        wait_for(lambda n=name: core.read_namespaced_pod(n, namespace).status.phase == "Running", what=name)
    with instance_for_test(overrides={"storage": {"postgres": {"postgres_url": postgres_url}}}) as instance:
        tags = run_gpu_tags("a100-80gb", GPUS)
        for _ in range(2):  # the work's history: 600 s on its GPUs each time
            assert dg.materialize([embedding], instance=instance,
                                  tags={**tags, HOLDING_SINCE_TAG: time_tag(time.time() - 600)}).success
        (work,) = class_history(instance, "a100-80gb")  # what the history calls that work
        runs = [create_run_for_test(instance, job_name=work, status=DagsterRunStatus.STARTING,
                                    tags={PLACEMENT_TAG: RunKind.GPU.value, **tags}) for _ in range(RUNS)]
        for run in runs:
            core.create_namespaced_pod(namespace, run_pod(run.run_id, namespace))
        wait_for(lambda: sum(any(c.reason == "Unschedulable" for c in p.status.conditions or [])
                             for p in core.list_namespaced_pod(namespace, label_selector=CLASS_LABEL).items) == RUNS,
                 timeout=300, what="every run's pod Unschedulable")
        client = cluster.api_client()
        watcher = CapacityWatcher(instance, kubernetes.client.CoreV1Api(client), kubernetes.client.BatchV1Api(client),
                                  load_gpu_classes(classes_dir), namespace, write_seconds=1.0)
        reports = [watcher.tick()]
        while reports[-1].left_out and len(reports) < 200:
            reports.append(watcher.tick())
        assert reports[-1].left_out == 0 and len(reports) > 2, [r.left_out for r in reports]  # spread over ticks
        assert all(r.classes["a100-80gb"].waiting == RUNS for r in reports)  # every tick judged the whole line
        first = [instance.get_run_by_id(r.run_id).tags.get(CAPACITY_TAG) for r in runs]
        told = sorted((instance.get_run_by_id(r.run_id) for r in runs),
                      key=lambda r: (r.tags[WAITING_SINCE_TAG], r.run_id))  # the line as the watcher orders it
        assert first == ["waiting"] * RUNS
        # Told first in line first: a run told on a later tick is never ahead of one told earlier.
        assert [r.tags[QUEUE_POSITION_TAG] for r in told] == [f"{i} of {RUNS}" for i in range(1, RUNS + 1)]
        for place, run in enumerate(told, start=1):
            (said,) = waits(instance, run.run_id)  # told once, whichever tick it fell on
            assert said["Position"] == f"{place} of {RUNS}", (place, said)
        # Each run's estimate is the one for its place in the whole line (written on a later tick than its wait).
        history = class_history(instance, "a100-80gb")
        line = [Ahead(work_of(r), GPUS, parts_of(r)) for r in told]
        expected = estimate_line("a100-80gb", NODES_PER_CLASS * 8, class_holders(instance, "a100-80gb", time.time()),
                                 line, history)
        assert [r.tags[WAIT_ESTIMATE_TAG] for r in told] == [e.tag for e in expected]
        assert told[0].tags[WAIT_ESTIMATE_TAG] != told[-1].tags[WAIT_ESTIMATE_TAG]  # later in line, longer

        # One node's GPUs free: the first runs in line are scheduled and everyone behind moves up.
        core.delete_namespaced_pod(fill[0], namespace, grace_period_seconds=0)
        moved = 8 // GPUS
        placed = lambda: {p.metadata.labels["dagster/run-id"] for p in core.list_namespaced_pod(
            namespace, label_selector=CLASS_LABEL).items if p.spec.node_name}
        wait_for(lambda: len(placed()) == moved, timeout=120, what="the freed node's runs scheduled")
        while watcher.tick().left_out:
            pass
        after = {r.run_id: instance.get_run_by_id(r.run_id) for r in told}
        assert sorted(after[r].tags[CAPACITY_TAG] for r in placed()) == ["scheduled"] * moved
        behind = [r for r in told if r.run_id not in placed()]  # the line now, in its order
        for place, run in enumerate(behind, start=1):
            tag = after[run.run_id].tags[QUEUE_POSITION_TAG]
            if place <= POSITION_ALWAYS:
                assert tag == f"{place} of {RUNS - moved}", (place, tag)
            else:  # behind the first places a move under a tenth of the place is not written
                assert tag == run.tags[QUEUE_POSITION_TAG], (place, tag)
                assert abs(int(tag.split(" of ")[0]) - place) <= POSITION_STEP * place
            assert len(waits(instance, run.run_id)) == 1  # no page heard of the move within the minute
