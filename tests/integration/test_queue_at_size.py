"""Many GPU steps waiting for one local slot, on a real Dagster instance (its concurrency pool holds
them, as in `dagster dev`): the embedded queue's pass writes within its budget, first in line first,
and the next passes write the rest; each step hears its true place once, naming only the first
runs ahead; each run's estimate is the one for its place; when the line moves, the first places
hear it and those far behind are not rewritten."""

from __future__ import annotations

import time

import dagster as dg
from dagster import DagsterRunStatus
from dagster._core.test_utils import create_run_for_test, instance_for_test

from gpufn_dagster.class_files import load_gpu_classes
from gpufn_dagster.run.capacity import POSITION_ALWAYS
from gpufn_dagster.run.estimate import Ahead, estimate_line
from gpufn_dagster.run.history import class_history, parts_of, work_of
from gpufn_dagster.tags import (CAPACITY_TAG, HOLDING_SINCE_TAG, PLACEMENT_TAG, WAIT_ESTIMATE_TAG, RunKind, gpu_pool,
                               run_gpu_tags, time_tag)

from ..helpers import event_metadata

RUNS = 200


@dg.asset
def embedding() -> None:
    """The work every waiting run does; two finished runs of it (600 s on their slot each) are its history."""


def told(instance, run_id: str) -> list[dict]:
    """The metadata of each time the run's GPU step was told it waits for a local slot."""
    return [m for m in event_metadata(instance, run_id) if "Local slots" in m]


def test_two_hundred_steps_waiting_for_a_slot_are_told_over_passes_with_true_places_and_estimates(
        tmp_path, classes_dir):
    overrides = {"run_coordinator": {"module": "gpufn_dagster", "class": "GpuQueuedRunCoordinator",
                                     "config": {"classes_dir": str(classes_dir),
                                                "write_seconds": 0.5}}}  # dagster.yaml's setting: spread over passes
    with instance_for_test(overrides=overrides) as instance:
        storage, coordinator = instance.event_log_storage, instance.run_coordinator
        slots = load_gpu_classes(classes_dir)["l4"].local.slots
        tags = {**run_gpu_tags("l4", 1), PLACEMENT_TAG: RunKind.LOCAL.value}  # as the coordinator placed them
        for _ in range(2):  # the work's history
            assert dg.materialize([embedding], instance=instance,
                                  tags={**tags, HOLDING_SINCE_TAG: time_tag(time.time() - 600)}).success
        (work,) = class_history(instance, "l4")  # what the history calls that work
        coordinator.get_run_queue_config()  # the pass that limits class l4's pool to its slots
        holders = [create_run_for_test(instance, job_name=work, status=DagsterRunStatus.STARTED, tags=tags)
                   for _ in range(slots)]
        for run in holders:
            assert storage.claim_concurrency_slot(gpu_pool("l4"), run.run_id, "embedding").is_claimed
        runs = [create_run_for_test(instance, job_name=work, status=DagsterRunStatus.STARTED, tags=tags)
                for _ in range(RUNS)]
        for run in runs:
            assert not storage.claim_concurrency_slot(gpu_pool("l4"), run.run_id, "embedding").is_claimed
        # The line as Dagster will hand out the slot: the longest waiting first (the instant a step
        # began to wait is kept to the second here, so steps of the same second go by run id).
        since = {p.run_id: p.enqueued_timestamp for p in storage.get_concurrency_info(gpu_pool("l4")).pending_steps}
        runs.sort(key=lambda r: (since[r.run_id], r.run_id))
        passes = 0
        while any(instance.get_run_by_id(r.run_id).tags.get(WAIT_ESTIMATE_TAG) is None for r in runs) and passes < 200:
            coordinator.get_run_queue_config()
            passes += 1
        assert passes > 2, passes  # the budget spread the writes
        for place, run in enumerate(runs, start=1):
            (said,) = told(instance, run.run_id)
            assert said["Position"] == f"{place} of {RUNS}", (place, said)
        message = next(e.message for e in instance.all_logs(runs[150].run_id) if "Local slots" in str(e.dagster_event))
        named = ", ".join(f"run {r.run_id[:8]} step embedding" for r in runs[:3])
        assert f"position 151, behind {named} and 147 more, 200 step(s)" in message, message  # 150 ahead, 3 named
        history = class_history(instance, "l4")
        expected = estimate_line("l4", slots, [], [Ahead(work_of(r), 1, parts_of(r)) for r in runs], history)
        estimates = [instance.get_run_by_id(r.run_id).tags[WAIT_ESTIMATE_TAG] for r in runs]
        # the runs holding the slots hold no slot lock here, so the line is estimated on free slots
        assert estimates == [e.tag for e in expected]
        # 600 s a run on 2 slots: the 200th starts after 99 rounds of two
        assert (slots, estimates[0]) == (2, "now") and estimates[-1].startswith("about 16 h 3"), estimates

        # The slot frees: the first in line gets it, everyone behind moves up one place.
        storage.free_concurrency_slots_for_run(holders[0].run_id)
        coordinator.get_run_queue_config()
        while any(len(told(instance, r.run_id)) == 1 for r in runs[1:POSITION_ALWAYS + 1]):
            coordinator.get_run_queue_config()
        for place, run in enumerate(runs[1:], start=1):
            said = told(instance, run.run_id)
            if place <= POSITION_ALWAYS:
                assert said[-1]["Position"] == f"{place} of {RUNS - 1}", (place, said)
            else:  # a move of one place is under a tenth of theirs: not said again
                assert len(said) == 1, (place, said)
        assert instance.get_run_by_id(runs[0].run_id).tags.get(CAPACITY_TAG) != "waiting" or not told(
            instance, runs[0].run_id)[-1]["Position"].startswith("1 of")
