"""Unit layer (no cluster): GPU requests -> one class -> pod configuration, and its enforcement."""

from __future__ import annotations

import pytest

from gpufn_dagster.class_files import load_gpu_classes
from gpufn_dagster.classes import GpuClass
from gpufn_dagster.errors import ClassRequestError, PlacementError
from dataclasses import replace

from gpufn_dagster.run.placement import (PodPlacement, decode_step_placements, encode_step_placements,
                                         enforce_placement, gpu_requests, placement_k8s_config, resolve_placement)

from ..conftest import CLASSES

CLASSES_BY_NAME = load_gpu_classes(CLASSES)


def test_requests_take_the_largest_count_per_class_and_ignore_cpu_steps():
    tags = [{"gpufn/gpu-class": "l4", "gpufn/gpu-count": "1"}, {"gpufn/gpu-class": "l4", "gpufn/gpu-count": "3"},
            {"gpufn/gpu-count": "0"}, None, {}]
    assert gpu_requests(tags) == {"l4": 3}
    assert resolve_placement({}, CLASSES_BY_NAME) is None


def test_a_run_of_two_classes_is_refused_and_a_request_the_classes_cannot_serve_says_the_rules_problem():
    with pytest.raises(PlacementError, match="2 GPU classes: a100-80gb .2 GPU., l4 .1 GPU."):
        resolve_placement({"l4": 1, "a100-80gb": 2}, CLASSES_BY_NAME)
    # the class-request rule is `class_requests.accept`'s (test_class_requests); launch wraps its error
    with pytest.raises(PlacementError) as err:
        resolve_placement({"a100-80gb|l4": 5}, CLASSES_BY_NAME)
    assert isinstance(err.value.__cause__, ClassRequestError) and err.value.__cause__.field == "gpu_count"
    assert str(err.value) == f"GPU request 'a100-80gb|l4' of 5 GPU: {err.value.__cause__.problem}"


def test_pod_config_of_a_class_with_affinity():
    placement = resolve_placement({"h100-80gb": 4}, CLASSES_BY_NAME)
    config = placement_k8s_config(placement)
    assert config["container_config"]["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert config["pod_spec_config"]["node_selector"]["karpenter.k8s.aws/instance-gpu-name"] == "h100"
    terms = config["pod_spec_config"]["affinity"]["node_affinity"][
        "required_during_scheduling_ignored_during_execution"]["node_selector_terms"]
    assert terms == [{"match_expressions": [{"key": "karpenter.sh/capacity-type", "operator": "In",
                                             "values": ["on-demand", "reserved"]}]}]
    assert config["pod_template_spec_metadata"]["labels"] == {"gpufn.dev/gpu-class": "h100-80gb",
                                                              "gpufn.dev/gpu-count": "4"}


def test_enforcement_keeps_user_narrowing_and_drops_widening():
    placement = resolve_placement({"h100-80gb": 1}, CLASSES_BY_NAME)
    user = {
        "container_config": {"resources": {"limits": {"nvidia.com/gpu": "8", "nvidia.com/mig-1g.10gb": "2",
                                                      "memory": "1Gi"}}},
        "pod_spec_config": {"node_name": "anywhere", "node_selector": {"zone": "a", "nvidia.com/gpu.product": "T4"},
                            "tolerations": [{"key": "spot", "operator": "Exists"}],
                            "affinity": {"node_affinity": {"required_during_scheduling_ignored_during_execution": {
                                "node_selector_terms": [{"match_expressions": [
                                    {"key": "any", "operator": "Exists"}]}]}}}},
    }
    out = enforce_placement(user, PodPlacement.decide(placement))
    assert out["container_config"]["resources"]["limits"] == {"nvidia.com/gpu": "1", "memory": "128Gi"}
    assert "node_name" not in out["pod_spec_config"]
    assert out["pod_spec_config"]["node_selector"]["zone"] == "a"
    assert out["pod_spec_config"]["node_selector"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert {"key": "spot", "operator": "Exists"} in out["pod_spec_config"]["tolerations"]
    terms = out["pod_spec_config"]["affinity"]["node_affinity"]["required_during_scheduling_ignored_during_execution"]
    assert terms["node_selector_terms"][0]["match_expressions"][0]["key"] == "karpenter.sh/capacity-type"
    assert len(terms["node_selector_terms"]) == 1


def test_a_pod_accepting_two_classes_may_land_on_either_pool_preferring_the_first():
    placement = resolve_placement({"a100-80gb|h100-80gb": 2}, CLASSES_BY_NAME)
    assert placement.request == "a100-80gb|h100-80gb" and placement.describe() == (
        "2 x nvidia.com/gpu on GPU class 'a100-80gb' or else 'h100-80gb'")
    config = placement_k8s_config(placement)
    pod = config["pod_spec_config"]
    assert pod["node_selector"] == {}  # a selector is ANDed: the classes' selectors go in ORed terms instead
    affinity = pod["affinity"]["node_affinity"]
    a100 = [{"key": "cloud.google.com/gke-accelerator", "operator": "In", "values": ["nvidia-a100-80gb"]},
            {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-A100-SXM4-80GB"]}]
    h100 = [{"key": "karpenter.k8s.aws/instance-gpu-name", "operator": "In", "values": ["h100"]},
            {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]},
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand", "reserved"]}]
    assert affinity["required_during_scheduling_ignored_during_execution"]["node_selector_terms"] == [
        {"match_expressions": a100}, {"match_expressions": h100}]
    assert affinity["preferred_during_scheduling_ignored_during_execution"] == [
        {"weight": 100, "preference": {"match_expressions": a100}},
        {"weight": 50, "preference": {"match_expressions": h100}}]
    pools = {t["value"] for t in pod["tolerations"] if t["key"] == "gpufn.dev/pool"}
    assert pools == {"a100-80gb", "h100-80gb"}  # both pools' taints tolerated
    assert len([t for t in pod["tolerations"] if t["key"] == "nvidia.com/gpu"]) == 1  # the shared one once
    assert config["container_config"]["resources"]["requests"] == {"nvidia.com/gpu": "2", "cpu": "8", "memory": "64Gi"}
    assert config["pod_template_spec_metadata"]["annotations"] == {"gpufn.dev/gpu-classes": "a100-80gb|h100-80gb"}
    assert config["pod_template_spec_metadata"]["labels"]["gpufn.dev/gpu-class"] == "a100-80gb"

    decided = PodPlacement.decide(placement)
    assert decided.gpu_class == "a100-80gb|h100-80gb" and decode_step_placements(
        encode_step_placements({"x": decided})) == {"x": decided}
    user = {"pod_spec_config": {"affinity": {"node_affinity": {
        "preferred_during_scheduling_ignored_during_execution": [
            {"weight": 100, "preference": {"match_expressions": h100}}]}}}}
    out = enforce_placement(user, decided)["pod_spec_config"]["affinity"]["node_affinity"]
    assert out == affinity  # no layer below reorders the classes


def test_a_decided_placement_travels_as_text_whole_and_carries_the_runs_kueue_priority_class():
    l4 = GpuClass.model_validate({**CLASSES_BY_NAME["l4"].model_dump(), "kueue": {
        "local_queue": "gpu-l4", "priority_classes": {10: "gpu-high", 0: "gpu-normal"}}})
    high = PodPlacement.decide(replace(resolve_placement({"l4": 1}, {"l4": l4}), priority=10))
    low = PodPlacement.decide(resolve_placement({"l4": 1}, {"l4": l4}))
    assert high.priority_class == "gpu-high" and low.priority_class == "gpu-normal"
    assert high.config["job_metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "gpu-high"
    decided = {"l4 x1": high, "h100-80gb x4": PodPlacement.decide(resolve_placement({"h100-80gb": 4}, CLASSES_BY_NAME))}
    assert decode_step_placements(encode_step_placements(decided)) == decided


def test_the_k8s_config_sections_are_dagster_k8s_own():
    from dagster_k8s.job import UserDefinedDagsterK8sConfig

    from gpufn_dagster.run.placement import K8S_CONFIG_SECTIONS

    assert K8S_CONFIG_SECTIONS == tuple(f for f in UserDefinedDagsterK8sConfig._fields if f != "merge_behavior")
