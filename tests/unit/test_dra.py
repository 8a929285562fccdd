"""GPU classes on DRA, without a cluster: the `dra` section validated at load with file, class and
field; listed by Python, the CLI and HTTP; a choice that mixes DRA and extended-resource classes
refused; a DRA class's pod configuration (a claim, no extended resource) enforced over every layer;
and its devices counted from ResourceSlices as the allocator would match them."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from gpufn_dagster import GpuClassError, list_gpu_classes, load_gpu_classes
from gpufn_dagster.class_requests import accept
from gpufn_dagster.classes import GpuClass
from gpufn_dagster.device_cel import matching_devices
from gpufn_dagster.errors import ClassRequestError, PlacementError
from gpufn_dagster.run.capacity import could_ever_fit, dra_gpus, pod_verdict
from gpufn_dagster.run.claims import claim_template_name
from gpufn_dagster.run.kueue import kueue_manifests
from gpufn_dagster.run.placement import Placement, PodPlacement, check_no_extra_gpus, enforce_placement
from gpufn_dagster.tags import CapacityState
from gpufn_devcluster.nodes import device_class, gpu_devices, gpu_nodes, resource_slice

from ..helpers import gpufn_serve

DRIVER = "gpu.nvidia.com"
H100 = "NVIDIA H100 80GB HBM3"
SELECT_H100 = f'device.attributes["{DRIVER}"].productName == "{H100}"'
GPUFN = [sys.executable, "-m", "gpufn_dagster.cli"]


def dra_class(name: str = "h100-dra", selectors: tuple[str, ...] = (SELECT_H100,), **dra) -> dict:
    return {"name": name, "gpu_model": H100, "gpu_memory": "80GiB", "max_gpu_count_per_worker": 8,
            "node_selector": {"pool": "dra"}, "dra": {"device_class": DRIVER, "selectors": list(selectors), **dra}}


def write(directory: Path, spec: dict) -> Path:
    path = directory / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.parametrize(("dra", "field", "words"), [
    ({"selectors": ['device.attributes["gpu.nvidia.com"].productName ==']}, "dra.selectors",
     "selector 0 'device.attributes[\"gpu.nvidia.com\"].productName ==' is not CEL"),
    ({"selectors": [""]}, "dra.selectors", "an empty expression"),
    ({"device_class": "GPU_class"}, "dra.device_class", "is not a DeviceClass name: must be a DNS subdomain"),
    ({"count_per_gpu": 0}, "dra.count_per_gpu", "greater than or equal to 1"),
    ({"devce_class": "x"}, "dra.devce_class", "unknown field (did you mean 'device_class'?)"),
    ({"extended_resource": True}, "dra", "selectors and count_per_gpu belong on the DeviceClass"),
])
def test_a_bad_dra_section_is_refused_naming_file_class_and_field(classes_dir, dra, field, words):
    spec = dra_class()
    spec["dra"].update(dra)
    if "devce_class" in dra:  # the misspelt field instead of the right one
        del spec["dra"]["device_class"]
    path = write(classes_dir, spec)
    with pytest.raises(GpuClassError) as err:
        load_gpu_classes(classes_dir)
    assert f"{path}: class 'h100-dra': field '{field}'" in str(err.value)
    assert words in str(err.value)


def test_kueue_mode_with_a_dra_claim_names_the_quota_resource_kueue_counts_its_devices_as(classes_dir):
    path = write(classes_dir, {**dra_class(count_per_gpu=2), "kueue": {"local_queue": "gpu"}})
    with pytest.raises(GpuClassError, match="field .kueue.: device_resource is needed with a DRA claim") as err:
        load_gpu_classes(classes_dir)
    assert f"{path}: class 'h100-dra'" in str(err.value)
    write(classes_dir, {**dra_class(count_per_gpu=2), "kueue": {"local_queue": "gpu", "device_resource": "example.com/gpu"}})
    h100 = load_gpu_classes(classes_dir)["h100-dra"]
    (queue,) = [m for m in kueue_manifests([h100], {"h100-dra": 3}, "dagster") if m["kind"] == "ClusterQueue"]
    resources = queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
    assert {"name": "example.com/gpu", "nominalQuota": "6"} in resources  # 3 GPUs of 2 devices each
    a100 = h100.model_copy(update={"name": "a100-dra"})
    with pytest.raises(ClassRequestError, match="firstAvailable"):
        accept(["h100-dra", "a100-dra"], 1, {"h100-dra": h100, "a100-dra": a100})


def test_a_dra_class_is_listed_by_python_the_cli_and_http(classes_dir):
    write(classes_dir, dra_class())
    (listed,) = [c for c in list_gpu_classes(classes_dir) if c.name == "h100-dra"]
    assert (listed.summary()["resource_name"], listed.summary()["requested_as"]) == (None, f"DRA device class {DRIVER}")
    assert listed.summary()["dra"] == {"device_class": DRIVER, "selectors": [SELECT_H100], "count_per_gpu": 1,
                                       "extended_resource": False}
    table = subprocess.run([*GPUFN, "classes", "--dir", str(classes_dir)], capture_output=True, text=True, check=True)
    (row,) = [line for line in table.stdout.splitlines() if line.startswith("h100-dra")]
    assert f"DRA device class {DRIVER}" in row
    as_json = json.loads(subprocess.run([*GPUFN, "classes", "--dir", str(classes_dir), "--json"], capture_output=True,
                                        text=True, check=True).stdout)
    assert [c["dra"] for c in as_json if c["name"] == "h100-dra"] == [listed.summary()["dra"]]
    with gpufn_serve(classes_dir, "t0ken") as base:
        request = urllib.request.Request(f"{base}/v1/gpu/classes", headers={"Authorization": "Bearer t0ken"})
        served = json.loads(urllib.request.urlopen(request, timeout=10).read())["classes"]
    assert [c["dra"] for c in served if c["name"] == "h100-dra"] == [listed.summary()["dra"]]


def test_a_choice_mixing_dra_and_extended_resource_classes_is_refused_and_dra_classes_go_together():
    h100 = GpuClass(**dra_class())
    a100 = GpuClass(**dra_class("a100-dra", ('device.attributes["gpu.nvidia.com"].productName == "A100"',)))
    l4 = GpuClass(name="l4", gpu_model="L4", gpu_memory="24GiB", max_gpu_count_per_worker=1)
    classes = {c.name: c for c in (h100, a100, l4)}
    with pytest.raises(ClassRequestError, match="'h100-dra' get their GPUs through a DRA claim and 'l4' through"):
        accept(["h100-dra", "l4"], 1, classes)
    assert [c.name for c in accept(["h100-dra", "a100-dra"], 2, classes)] == ["h100-dra", "a100-dra"]
    # A class whose DeviceClass backs its extended resource (KEP-5004) goes with extended-resource classes.
    backed = GpuClass(name="h100-x", gpu_model="H100", gpu_memory="80GiB", max_gpu_count_per_worker=8,
                      dra={"device_class": DRIVER, "extended_resource": True})
    assert [c.name for c in accept(["h100-x", "l4"], 1, {**classes, "h100-x": backed})] == ["h100-x", "l4"]
    assert backed.requested_as == f"nvidia.com/gpu (backed by DRA device class {DRIVER})"


def decided(count: int = 2) -> PodPlacement:
    h100 = GpuClass(**dra_class())
    return PodPlacement.decide(Placement(h100, count), claim_template_name("run-1", f"h100-dra x{count}"))


def test_a_dra_pod_names_its_claim_and_asks_for_no_extended_resource_whatever_a_layer_says():
    placement = decided()
    below = {"container_config": {"resources": {"limits": {"nvidia.com/gpu": "8", "cpu": "2"},
                                                "claims": [{"name": "extra"}]}},
             "pod_spec_config": {"node_selector": {"pool": "elsewhere"}}}
    out = enforce_placement(below, placement)
    assert out["container_config"]["resources"]["limits"] == {"cpu": "2"}  # the tag's GPUs are gone
    assert out["container_config"]["resources"]["claims"] == [{"name": "gpu"}]  # the class's claim, only
    assert out["pod_spec_config"]["resource_claims"] == [
        {"name": "gpu", "resource_claim_template_name": placement.claim["name"]}]
    assert out["pod_spec_config"]["node_selector"] == {"pool": "dra"}
    assert placement.claim["spec"]["devices"]["requests"][0]["exactly"] == {
        "deviceClassName": DRIVER, "allocationMode": "ExactCount", "count": 2,
        "selectors": [{"cel": {"expression": SELECT_H100}}]}
    assert PodPlacement.from_json(json.loads(json.dumps(placement.to_json()))) == placement  # travels to steps


@pytest.mark.parametrize("pod_spec", [
    {"resource_claims": [{"name": "more", "resource_claim_template_name": "eight-gpus"}]},
    {"containers": [{"name": "sidecar", "resources": {"claims": [{"name": "gpu"}]}}]},
])
def test_a_layer_that_adds_a_claim_is_refused_as_a_widening_tag_is(pod_spec):
    with pytest.raises(PlacementError, match="claim"):
        check_no_extra_gpus(pod_spec, decided())


def test_a_dra_class_needs_its_claim_template_named_at_launch():
    with pytest.raises(PlacementError, match="claim template"):
        PodPlacement.decide(Placement(GpuClass(**dra_class()), 1))


def slices() -> list[dict]:
    return [resource_slice("n-h100", DRIVER, gpu_devices(H100, "80Gi", 4)),
            resource_slice("n-mixed", DRIVER, gpu_devices(H100, "80Gi", 1) + gpu_devices("NVIDIA A10", "24Gi", 3, start=1)),
            resource_slice("n-mig", DRIVER, gpu_devices(H100, "10Gi", 7, mig_profile="1g.10gb")),
            resource_slice("n-other", "decoy.example.com", gpu_devices(H100, "80Gi", 8))]


def test_devices_are_counted_per_node_as_the_allocator_matches_them():
    whole = [*dra_class()["dra"]["selectors"], 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0',
             '!("migProfile" in device.attributes["gpu.nvidia.com"])']
    counted = matching_devices(['device.driver == "gpu.nvidia.com"', *whole], slices())
    assert dict(counted.by_node) == {"n-h100": 4, "n-mixed": 1} and counted.unsure == 0
    mig = matching_devices(['device.attributes["gpu.nvidia.com"].migProfile == "1g.10gb"'], slices())
    assert dict(mig.by_node) == {"n-mig": 7} and mig.unsure == 4 + 4 + 8  # devices without the attribute: unknown


def test_never_fits_only_when_no_node_publishes_enough_matching_devices():
    h100 = GpuClass(**dra_class(count_per_gpu=2))
    nodes = [{**n, "metadata": {**n["metadata"], "name": name}} for n, name in
             zip(gpu_nodes(h100, 4), ("n-h100", "n-mixed", "n-mig", "n-other"))]
    gpus = dra_gpus(h100, device_class(DRIVER, DRIVER), slices(), nodes)
    # 4 devices, 2 per GPU; 7 MIG slices of an H100 (the selector allows them); n-mixed's 1 H100 is half a GPU
    assert dict(gpus.by_node) == {"n-h100": 2, "n-mig": 3}
    assert could_ever_fit(h100, 3, nodes, gpus) is True and could_ever_fit(h100, 4, nodes, gpus) is False
    assert dra_gpus(h100, None, slices(), nodes).total() == 0  # no such DeviceClass: no device
    pod = {"spec": {}, "status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                                  "message": "0/4 nodes are available: 4 cannot allocate all claims."}]}}
    assert pod_verdict(pod, [], h100, 3, nodes, gpus).state is CapacityState.WAITING
    never = pod_verdict(pod, [], h100, 4, nodes, gpus)
    assert never.state is CapacityState.NEVER_FITS and "cannot allocate all claims" in never.message


def test_the_readmes_dra_class_loads_and_its_selectors_match_the_devices_it_names(classes_dir):
    from ..conftest import REPO

    readme = (REPO / "README.md").read_text()
    (block,) = [b.split("```", 1)[0] for b in readme.split("```yaml\n")[1:] if "\ndra:\n" in b.split("```", 1)[0]]
    (classes_dir / "h100-dra.yaml").write_text(block)
    gpu_class = load_gpu_classes(classes_dir)["h100-dra"]
    assert gpu_class.claims_devices and gpu_class.dra.device_class == DRIVER
    published = [resource_slice("n1", DRIVER, gpu_devices(H100, "80Gi", 2)),
                 resource_slice("n2", DRIVER, gpu_devices(H100, "40Gi", 2)),
                 resource_slice("n3", DRIVER, gpu_devices("NVIDIA A100-SXM4-80GB", "80Gi", 2))]
    assert dict(matching_devices(gpu_class.dra.selectors, published).by_node) == {"n1": 2}


def test_kueue_manifests_refuse_what_loading_refuses_for_dra_classes(classes_dir):
    queued = {"local_queue": "gpu", "device_resource": "example.com/gpu"}
    write(classes_dir, {**dra_class(), "kueue": queued})
    write(classes_dir, {**dra_class("a100-dra", ('device.attributes["gpu.nvidia.com"].productName == "A100"',)),
                        "kueue": queued})
    write(classes_dir, dra_class("b200-dra", ('device.attributes["gpu.nvidia.com"].productName == "B200"',)))
    base = [*GPUFN, "kueue-manifests", "--dir", str(classes_dir), "--namespace", "dagster"]
    choice = subprocess.run([*base, "--choice", "h100-dra,a100-dra"], capture_output=True, text=True)
    assert choice.returncode == 2 and "firstAvailable" in choice.stderr, choice.stderr
    unqueued = subprocess.run([*base, "--local-queue", "b200-dra=gpu-b200"], capture_output=True, text=True)
    assert unqueued.returncode == 2 and "device_resource is needed" in unqueued.stderr, unqueued.stderr
    done = subprocess.run([*base, "--gpus", "h100-dra=3"], capture_output=True, text=True, check=True)
    queue = next(m for m in yaml.safe_load_all(done.stdout) if m["kind"] == "ClusterQueue"
                 and m["metadata"]["name"] == "gpufn-h100-dra")
    assert {"name": "example.com/gpu", "nominalQuota": "3"} in queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
