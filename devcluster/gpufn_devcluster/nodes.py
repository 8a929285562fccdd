"""Fake nodes for each GPU class: the labels, taints and allocatable a real pool would carry.

Pure: GpuClass -> Node manifests. A node satisfies its class's selector and first affinity
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
    allocatable = {gpu_class.resource_name: str(gpus_per_node or gpu_class.max_gpu_count_per_worker),
                   "cpu": "64", "memory": "512Gi", "pods": "110"}
    return [_node(f"{gpu_class.name}-{i}", labels, taints, allocatable) for i in range(count)]


def cpu_nodes(count: int) -> list[dict[str, Any]]:
    return [_node(f"{CPU_POOL}-{i}", {POOL_LABEL: CPU_POOL}, [], {"cpu": "16", "memory": "64Gi", "pods": "110"})
            for i in range(count)]
