"""Unit layer: what the embedded coordinator records for a run, from its steps' local-slot waits,
its tags and the clock (`run.local_capacity`, the sibling of the pods' `capacity.decide`)."""

from __future__ import annotations

from gpufn_dagster.class_files import load_gpu_classes
from gpufn_dagster.class_requests import choice_view
from gpufn_dagster.classes import GpuClass
from gpufn_dagster.run.local_capacity import decide_local_placement, decide_slots
from gpufn_dagster.run.placement import Placement
from gpufn_dagster.run.pools import StepWait, lines_of, note_waits
from gpufn_dagster.tags import (CAPACITY_REASON_TAG, CAPACITY_REPORTED_TAG, CAPACITY_TAG, HOLDING_SINCE_TAG,
                               PLACEMENT_TAG, WAIT_ESTIMATE_TAG, WAITING_SINCE_TAG, CapacityState)

from ..conftest import CLASSES

CLASSES_BY_NAME = load_gpu_classes(CLASSES)
NOW = 1_796_058_073.0


def slotted(name: str, slots: int, max_wait: str | None = None) -> GpuClass:
    return GpuClass.model_validate({**CLASSES_BY_NAME[name].model_dump(), "local": {"slots": slots},
                                    **({"max_wait": max_wait} if max_wait else {})})


def test_each_waiting_step_is_told_in_its_own_log_with_who_is_ahead_and_then_not_again():
    l4 = slotted("l4", 1)
    holder = (("run0aaaaaaa", "docs__summary"),)
    ahead = StepWait("run1", "docs__a", "l4", NOW - 50, 1, 3, holder)
    mine = [StepWait("run2", "docs__b", "l4", NOW - 30, 2, 3, holder),
            StepWait("run2", "docs__c", "l4", NOW - 20, 3, 3, holder)]
    first = decide_slots(mine, lines_of([ahead, *mine]), {"l4": l4}, {}, NOW, holding=False)
    assert first.state is CapacityState.WAITING and first.fail is None and first.event is None
    assert first.tags[CAPACITY_TAG] == "waiting" and first.tags[CAPACITY_REASON_TAG] == "LocalSlotsInUse"
    assert first.tags[WAITING_SINCE_TAG] == "2026-11-30T17:00:43Z"  # the first of its steps to wait
    assert [e.step_key for e in first.step_events] == ["docs__b", "docs__c"]
    assert [e.metadata["Position"] for e in first.step_events] == ["2 of 3", "3 of 3"]
    assert first.step_events[0].metadata["Slots held by"] == "run0aaaa/docs__summary"
    assert "behind run run1 step docs__a" in first.step_events[0].message
    assert first.waited_seconds == 30
    again = decide_slots(mine, lines_of([ahead, *mine]), {"l4": l4}, first.tags, NOW + 5, holding=False)
    assert again.tags == {} and again.step_events == () and again.state is CapacityState.WAITING
    moved = [StepWait("run2", "docs__b", "l4", NOW - 30, 1, 2, holder), mine[1]]
    told = decide_slots(moved, lines_of(moved), {"l4": l4}, first.tags, NOW + 10, holding=False)
    assert told.tags[CAPACITY_REPORTED_TAG] != first.tags[CAPACITY_REPORTED_TAG] and len(told.step_events) == 2


def test_a_choice_waits_naming_each_classes_holders():
    l4, a100 = slotted("l4", 1), slotted("a100-80gb", 1)
    choice = choice_view((a100, l4))
    (wait,) = note_waits([{"run_id": "run9", "step_key": "e", "request": choice.name, "since": NOW - 3}],
                         {"a100-80gb": [{"run_id": "runAAAAAAAA", "step_key": "s"}],
                          "l4": [{"run_id": "runBBBBBBBB", "step_key": "t"}]})
    decision = decide_slots([wait], lines_of([wait]), {choice.name: choice}, {}, NOW, holding=False)
    (event,) = decision.step_events
    assert event.metadata["GPU class"] == "a100-80gb|l4" and event.metadata["Local slots"] == 2
    assert event.metadata["Class a100-80gb held by"] == "runAAAAA/s" and event.metadata["Class l4 held by"] == "runBBBBB/t"


def test_a_wait_past_max_wait_ends_the_run_saying_so_in_the_steps_log():
    l4 = slotted("l4", 1, max_wait="1m")
    wait = StepWait("run2", "docs__b", "l4", NOW - 61, 1, 1, ())
    decision = decide_slots([wait], lines_of([wait]), {"l4": l4}, {}, NOW, holding=False)
    assert decision.state is CapacityState.TIMED_OUT and decision.fail is not None
    assert decision.tags == {CAPACITY_TAG: "timed-out", CAPACITY_REASON_TAG: "MaxWaitExceeded"}
    (event,) = decision.step_events
    assert event.step_key == "docs__b" and event.metadata["Waited seconds"] == 61 and event.metadata["max_wait seconds"] == 60


def test_a_run_that_gets_its_slots_is_running_and_one_that_waited_hears_how_long_and_its_estimate_ends():
    l4 = slotted("l4", 1)
    fresh = decide_slots([], {}, {"l4": l4}, {}, NOW, holding=True)
    assert fresh.tags[CAPACITY_TAG] == "running" and fresh.tags[CAPACITY_REASON_TAG] == "SlotAcquired"
    assert fresh.tags[HOLDING_SINCE_TAG] == "2026-11-30T17:01:13Z" and fresh.event is None
    assert decide_slots([], {}, {"l4": l4}, fresh.tags, NOW + 1, holding=True).tags == {}  # said once
    waited = {CAPACITY_TAG: "waiting", WAITING_SINCE_TAG: "2026-11-30T17:00:13Z", WAIT_ESTIMATE_TAG: "about 2 min"}
    got = decide_slots([], {}, {"l4": l4}, waited, NOW, holding=True)
    assert got.tags[CAPACITY_TAG] == "running" and got.event.metadata == {"Waited seconds": 60.0}
    assert got.tags[WAIT_ESTIMATE_TAG] != "about 2 min"  # the truth replaces the estimate
    assert decide_slots([], {}, {"l4": l4}, {}, NOW, holding=False).tags == {}  # a run without GPU steps now


def test_a_run_that_can_never_get_its_slots_here_is_refused_at_submit():
    none = decide_local_placement({"l4": Placement(slotted("l4", 0), 1)})
    assert none.state is CapacityState.NEVER_FITS and "local.slots: 0" in none.fail
    assert none.tags[PLACEMENT_TAG] == "rejected" and none.tags[CAPACITY_TAG] == "never-fits"
    choice = decide_local_placement({"a100-80gb|l4": Placement(slotted("a100-80gb", 0), 1, alternatives=(slotted("l4", 1),))})
    assert choice.fail is None and choice.tags[PLACEMENT_TAG] == "local"  # one of its classes has a slot
