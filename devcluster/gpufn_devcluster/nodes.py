"""Fake nodes for each GPU class: the labels, taints and allocatable a real pool would carry.

Pure: GpuClass -> Node manifests; and a DRA driver's objects as a test publishes them in its place
(`device_class`, `resource_slice`, `gpu_devices`). A node satisfies its class's selector and first affinity
term, carries a taint for every toleration that has an effect (so only pods of the class land
there), and exposes the class's resource (nvidia.com/gpu or a MIG slice) as allocatable.
"""

from __future__ import annotations

from typing import Any

from gpufn_dagster.classes import GpuClass, NodeSelectorRequirement

FAKE_NODE_LABEL = "gpufn.dev/fake-node"
POOL_LABEL = "gpufn.dev/pool"
CPU_POOL = "cpu"


def _affinity_labels(requirement: NodeSelectorRequirement) -> dict[str, str]:
    if requirement.operator == "In":
        return {requirement.key: requirement.values[0]}
    if requirement.operator == "Exists":
        return {requirement.key: "true"}
    if requirement.operator == "Gt":
        return {requirement.key: str(int(requirement.values[0]) + 1)}
    if requirement.operator == "Lt":
        return {requirement.key: str(int(requirement.values[0]) - 1)}
    return {}


def _node(name: str, labels: dict[str, str], taints: list[dict[str, str]], allocatable: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                       "type": "kwok", FAKE_NODE_LABEL: "true", **labels},
            "annotations": {"kwok.x-k8s.io/node": "fake"},
        },
        "spec": {"taints": taints},
        "status": {"allocatable": allocatable, "capacity": dict(allocatable)},
    }


def gpu_nodes(gpu_class: GpuClass, count: int, *, gpus_per_node: int | None = None) -> list[dict[str, Any]]:
    """`count` nodes of the class's pool, each with `gpus_per_node` (default: the class maximum)."""
    labels = {**gpu_class.node_selector, POOL_LABEL: gpu_class.name}
    if gpu_class.node_affinity:
        for requirement in gpu_class.node_affinity[0].match_expressions:
            labels.update(_affinity_labels(requirement))
    taints = [
        {k: v for k, v in {"key": t.key, "value": t.value if t.operator == "Equal" else None, "effect": t.effect}.items()
         if v is not None}
        for t in gpu_class.tolerations if t.effect and t.key
    ]
    # A DRA class's nodes have no GPU resource: a driver publishes their devices in ResourceSlices.
    gpus = {} if gpu_class.claims_devices else {
        gpu_class.resource_name: str(gpus_per_node or gpu_class.max_gpu_count_per_worker)}
    allocatable = {**gpus, "cpu": "64", "memory": "512Gi", "pods": "110"}
    return [_node(f"{gpu_class.name}-{i}", labels, taints, allocatable) for i in range(count)]


def cpu_nodes(count: int) -> list[dict[str, Any]]:
    return [_node(f"{CPU_POOL}-{i}", {POOL_LABEL: CPU_POOL}, [], {"cpu": "16", "memory": "64Gi", "pods": "110"})
            for i in range(count)]


def device_class(name: str, driver: str) -> dict[str, Any]:
    """A DeviceClass of every device `driver` publishes, as a DRA driver's chart installs it."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]}}


def gpu_devices(product: str, memory: str, count: int, *, start: int = 0, mig_profile: str | None = None,
                prefix: str = "gpu") -> list[dict[str, Any]]:
    """`count` GPUs as NVIDIA's DRA driver describes them: product name, memory, and a MIG profile for a slice."""
    return [{"name": f"{prefix}-{start + i}",
             "attributes": {"productName": {"string": product}, "index": {"int": start + i},
                            **({"migProfile": {"string": mig_profile}} if mig_profile else {})},
             "capacity": {"memory": {"value": memory}}} for i in range(count)]


def resource_slice(node: str, driver: str, devices: list[dict[str, Any]]) -> dict[str, Any]:
    """The ResourceSlice a DRA driver's kubelet plugin publishes for the devices of one node."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{driver.replace('.', '-')}"},
            "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": devices}}
