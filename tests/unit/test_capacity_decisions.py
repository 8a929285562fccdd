"""Unit layer: what a watcher tick records for a run, from its pod's verdict, its tags and the clock."""

from __future__ import annotations

from gpufn_dagster.class_files import load_gpu_classes
from gpufn_dagster.run.capacity import Verdict, decide, decide_without_pod, kueue_verdict, parse_scheduler_message
from gpufn_dagster.run.kueue import WorkloadStatus
from gpufn_dagster.tags import CAPACITY_REASON_TAG, CAPACITY_TAG, QUEUE_POSITION_TAG, WAITING_SINCE_TAG, CapacityState

from ..conftest import CLASSES

L4 = load_gpu_classes(CLASSES)["l4"]
NOW = 1_796_058_073.0
FULL = Verdict(CapacityState.WAITING, "Unschedulable", "0/5 nodes are available: 2 Insufficient nvidia.com/gpu.")


def test_a_new_wait_is_tagged_and_told_once():
    first = decide(FULL, {}, L4, 1, (2, 3), NOW)
    assert first.tags[CAPACITY_TAG] == "waiting" and first.tags[CAPACITY_REASON_TAG] == "Unschedulable"
    assert first.tags[WAITING_SINCE_TAG] == "2026-11-30T17:01:13Z"
    assert "position 2 of 3" in first.event.message and FULL.message in first.event.message
    again = decide(FULL, first.tags, L4, 1, (1, 3), NOW + 30)       # only its place in the queue moved
    assert again.tags == {".dagster/gpufn-queue-position": "1 of 3"} and again.event is None and again.waited_seconds == 30
    # The tag follows every move; the page hears of a move again once a minute at most.
    later = decide(FULL, {**first.tags, **again.tags}, L4, 1, (1, 2), NOW + 61)
    assert later.tags[".dagster/gpufn-queue-position"] == "1 of 2" and "now position 1 of 2" in later.event.message
    assert decide(FULL, {**first.tags, **again.tags, **later.tags}, L4, 1, (1, 2), NOW + 200).tags == {}
    # The scheduler rewords its message as it retries (here: its preemption part); the reasons are the same.
    reworded = Verdict(CapacityState.WAITING, "Unschedulable", FULL.message + " preemption: 0/5 nodes are available: "
                       "5 Preemption is not helpful for scheduling.", reasons=parse_scheduler_message(FULL.message))
    plain = decide(Verdict(CapacityState.WAITING, "Unschedulable", FULL.message, reasons=reworded.reasons), {}, L4, 1, None,
                   NOW)
    assert decide(reworded, plain.tags, L4, 1, None, NOW + 10).event is None
    changed = Verdict(CapacityState.WAITING, "Unschedulable", FULL.message, autoscaler=("TriggeredScaleUp",))
    told = decide(changed, first.tags, L4, 1, (1, 3), NOW + 60)
    assert "Autoscaler: TriggeredScaleUp" in told.event.message
    assert told.tags[WAITING_SINCE_TAG] == first.tags[WAITING_SINCE_TAG]   # since when is kept


def test_the_place_in_line_follows_the_line_both_ways_in_its_tag_and_once_a_minute_on_the_page():
    """A higher priority joining ahead moves a run back as surely as one leaving moves it forward."""
    pending = kueue_verdict(WorkloadStatus("w", "job", "q", 0, "2026-11-30T17:01:13Z", "pending", "Pending",
                                           "couldn't assign flavors to pod set main: insufficient unused quota"))
    tags: dict[str, str] = {}
    said = []
    # (seconds from now, place in line): alone; two join ahead; the first of them leaves; a minute on
    for at, place in [(0, (1, 1)), (10, (2, 2)), (20, (3, 3)), (30, (2, 2)), (61, (2, 2)), (70, (2, 2)),
                      (80, (3, 3)), (140, (3, 3))]:
        decision = decide(pending, tags, L4, 1, place, NOW + at, cluster_queue="q",
                          kueue_state="pending")
        tags = {**tags, **decision.tags}
        assert tags[QUEUE_POSITION_TAG] == f"{place[0]} of {place[1]}", (at, tags)  # every tick, both ways
        if decision.event is not None:
            said.append((at, decision.event.metadata["Position"]))
    assert said == [(0, "1 of 1"), (61, "2 of 2"), (140, "3 of 3")]


def test_a_wait_past_max_wait_fails_the_run_and_one_within_it_does_not():
    tags = decide(FULL, {}, L4, 1, None, NOW).tags
    limit = L4.max_wait.total_seconds() if L4.max_wait else None
    if limit is None:   # the shipped l4 class waits indefinitely
        assert decide(FULL, tags, L4, 1, None, NOW + 10 ** 7).fail is None
        l4 = L4.model_copy(update={"max_wait": __import__("datetime").timedelta(minutes=5)})
    else:
        l4 = L4
    assert decide(FULL, tags, l4, 1, None, NOW + 299).fail is None
    late = decide(FULL, tags, l4, 1, None, NOW + 301)
    assert late.tags == {CAPACITY_TAG: "timed-out", CAPACITY_REASON_TAG: "MaxWaitExceeded"}
    assert "after 301s (max_wait 300s)" in late.fail and FULL.message in late.fail


def test_capacity_arriving_says_where_and_after_how_long():
    waiting = decide(FULL, {}, L4, 1, None, NOW).tags
    arrived = decide(Verdict(CapacityState.SCHEDULED, node="l4-1"), waiting, L4, 1, None, NOW + 42)
    assert arrived.tags == {CAPACITY_TAG: "scheduled", CAPACITY_REASON_TAG: "Scheduled",
                            ".dagster/gpufn-holding-since": "2026-11-30T17:01:55Z"}  # its time on the GPU counts from here
    estimated = decide(Verdict(CapacityState.SCHEDULED, node="l4-1"), {**waiting, ".dagster/gpufn-wait-estimate": "about 2 min"},
                       L4, 1, None, NOW + 98)
    assert estimated.tags[".dagster/gpufn-wait-estimate"] == "waited 2 min"  # the truth replaces the estimate
    assert arrived.event.message == "GPU capacity arrived: scheduled on node l4-1 after waiting 42s"
    assert decide(Verdict(CapacityState.SCHEDULED, node="l4-1"), {**waiting, **arrived.tags}, L4, 1, None, NOW + 50).tags == {}


def test_never_fits_gated_and_failing_are_not_waits():
    never = decide(Verdict(CapacityState.NEVER_FITS, "Unschedulable", "no node has 9"), {}, L4, 9, None, NOW)
    assert never.fail.startswith("This run can never start") and never.tags[CAPACITY_REASON_TAG] == "NeverFits"
    gated = decide(Verdict(CapacityState.GATED, "SchedulingGated", "held"), {}, L4, 1, None, NOW)
    assert gated.tags == {CAPACITY_TAG: "gated", CAPACITY_REASON_TAG: "SchedulingGated"} and gated.fail is None
    failing = decide(Verdict(CapacityState.FAILING, "ImagePullBackOff", "no such image"), {}, L4, 1, None, NOW)
    assert failing.tags[CAPACITY_REASON_TAG] == "ImagePullBackOff" and "not a capacity wait" in failing.event.message
    assert decide(Verdict(CapacityState.FAILING, "ImagePullBackOff", "x"), failing.tags, L4, 1, None, NOW).event is None
    assert decide(Verdict(CapacityState.PENDING), {}, L4, 1, None, NOW) == decide(Verdict(CapacityState.PENDING), {}, L4, 1, None, NOW)
    assert decide(Verdict(CapacityState.PENDING), {}, L4, 1, None, NOW).tags == {}


def test_a_run_without_a_pod_is_replacing_lost_or_not_started_yet():
    assert decide_without_pod({CAPACITY_TAG: "waiting"}, "job-1", None).tags[CAPACITY_TAG] == "replacing"
    assert decide_without_pod({CAPACITY_TAG: "replacing"}, "job-1", None).event is None   # told once
    assert decide_without_pod({}, "job-1", None).tags == {}                                 # no pod yet
    failed = decide_without_pod({}, "job-1", "BackoffLimitExceeded: Job has reached the specified backoff limit")
    assert failed.tags[CAPACITY_REASON_TAG] == "JobFailed" and "BackoffLimitExceeded" in failed.fail
    gone = decide_without_pod({CAPACITY_TAG: "scheduled"}, None, None)
    assert gone.tags == {CAPACITY_TAG: "lost", CAPACITY_REASON_TAG: "PodLost"} and "re-execute" in gone.fail


def test_a_local_wait_names_who_holds_the_slots_and_who_is_ahead():
    from gpufn_dagster.run.pools import step_waits, wait_message

    waits = step_waits("l4", [("run-b", "docs__embedding", NOW + 5, 0), ("run-a", "docs__summary", NOW, 0)],
                       [("run-x", "docs__embedding"), ("run-y", "docs__embedding")])
    second = next(w for w in waits if w.run_id == "run-b")
    message = wait_message(second, L4, [w for w in waits if w.position < second.position])
    assert second.position == 2 and second.digest == "l4:docs__embedding:2/2"
    assert "all 2 slot(s) in use (run run-x step docs__embedding, run run-y step docs__embedding)" in message
    assert "position 2, behind run run-a step docs__summary, 2 step(s) of the class waiting" in message
