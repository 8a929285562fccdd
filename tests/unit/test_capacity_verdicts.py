"""Unit layer for capacity verdicts (pure): the scheduler's message as a histogram, autoscaler
reactions, and what is not a capacity wait."""

from __future__ import annotations

from gpufn_dagster.run.capacity import parse_scheduler_message, pod_verdict
from gpufn_dagster.tags import CapacityState
from gpufn_dagster.class_files import load_gpu_classes

from ..conftest import CLASSES

A100 = load_gpu_classes(CLASSES)["a100-80gb"]
MESSAGE = ("0/5 nodes are available: 3 Insufficient nvidia.com/gpu, 2 node(s) didn't match Pod's node "
           "affinity/selector. preemption: 0/5 nodes are available: 5 Preemption is not helpful for scheduling.")


def unschedulable(message: str = MESSAGE) -> dict:
    return {"spec": {}, "status": {"conditions": [{"type": "PodScheduled", "status": "False",
                                                   "reason": "Unschedulable", "message": message}]}}


def node(gpus: str) -> dict:
    return {"metadata": {"labels": dict(A100.node_selector)}, "status": {"allocatable": {"nvidia.com/gpu": gpus}}}


def test_scheduler_message_becomes_a_histogram():
    reasons = parse_scheduler_message(MESSAGE)
    assert reasons.nodes == 5
    assert reasons.counts == {"Insufficient nvidia.com/gpu": 3, "node(s) didn't match Pod's node affinity/selector": 2}
    assert reasons.summary().startswith("Insufficient nvidia.com/gpu: 3 of 5 nodes")


def test_waiting_keeps_the_message_verbatim_and_notes_the_autoscaler():
    events = [{"reason": "TriggeredScaleUp", "message": "pod triggered scale-up"}, {"reason": "FailedScheduling"},
              {"reason": "Nominated", "message": "Pod should schedule on: nodeclaim/gpu-abc"}]
    verdict = pod_verdict(unschedulable(), events, A100, 2, [node("8")])
    assert verdict.state is CapacityState.WAITING and verdict.message == MESSAGE
    assert verdict.autoscaler == ("Nominated", "TriggeredScaleUp")


def test_empty_pool_waits_for_the_autoscaler_but_too_small_nodes_never_fit():
    assert pod_verdict(unschedulable(), [], A100, 2, []).state is CapacityState.WAITING
    assert pod_verdict(unschedulable(), [], A100, 16, [node("8"), node("8")]).state is CapacityState.NEVER_FITS


def test_bound_pod_is_scheduled_even_before_it_runs():
    bound = pod_verdict({"spec": {"node_name": "a100-80gb-1"}, "status": {"phase": "Pending"}}, [], A100, 1, [])
    assert bound.state is CapacityState.SCHEDULED and bound.node == "a100-80gb-1" and bound.reason == ""
    # ...unless its container cannot start: that is reported, never taken for a wait or a success.
    pulling = pod_verdict({"spec": {"node_name": "a100-80gb-1"}, "status": {"container_statuses": [
        {"state": {"waiting": {"reason": "ImagePullBackOff", "message": "no such image"}}}]}}, [], A100, 1, [])
    assert pulling.state is CapacityState.FAILING and pulling.reason == "ImagePullBackOff" and pulling.message == "no such image"


def test_gated_pod_is_not_reported_as_a_capacity_wait():
    pod = {"spec": {"scheduling_gates": [{"name": "example.com/quota"}]},
           "status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]}}
    assert pod_verdict(pod, [], A100, 1, []).state is CapacityState.GATED
    failing = {"spec": {"node_name": "n"}, "status": {"container_statuses": [
        {"state": {"waiting": {"reason": "ImagePullBackOff", "message": "back-off pulling image"}}}]}}
    assert pod_verdict(failing, [], A100, 1, []).state is CapacityState.FAILING
