"""Class files accept what Kubernetes accepts: a sample of classes that load is placed on a pod the
real API server accepts (server-side dry run), and values the loader refuses are ones the API server
refuses too -- so a class never lists fine and then fails every run."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import kubernetes
import pytest
import yaml

from gpufn_dagster import GpuClassError, load_gpu_classes
from gpufn_dagster.classes import GpuClass

from ..conftest import CLASSES

pytestmark = pytest.mark.k8s
BASE = {"name": "probe", "gpu_model": "X", "gpu_memory": "8GiB", "max_gpu_count_per_worker": 2}


def pod_for(gpu_class: GpuClass, count: int = 1) -> dict:
    """The pod a worker of the class gets: its selector, tolerations, affinity and resources."""
    resources = {"limits": {gpu_class.resource_name: str(count)}, "requests": {gpu_class.resource_name: str(count)}}
    if gpu_class.cpu:
        resources["requests"]["cpu"] = gpu_class.cpu
    if gpu_class.memory:
        resources["requests"]["memory"] = resources["limits"]["memory"] = gpu_class.memory
    spec: dict = {"containers": [{"name": "w", "image": "busybox", "resources": resources}],
                  "nodeSelector": dict(gpu_class.node_selector),
                  "tolerations": [t.to_k8s() for t in gpu_class.tolerations]}
    if gpu_class.node_affinity:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": r.key, "operator": r.operator, **({"values": r.values} if r.values else {})}
                                  for r in term.match_expressions]} for term in gpu_class.node_affinity]}}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "probe-"}, "spec": spec}


def load_one(directory: Path, fields: dict) -> GpuClass:
    (directory / "probe.yaml").write_text(yaml.safe_dump({**BASE, **fields}))
    return load_gpu_classes(directory)["probe"]


ACCEPTED = [
    {},
    {"node_selector": {"cloud.google.com/gke-accelerator": "nvidia-l4", "team": ""}},
    {"tolerations": [{"operator": "Exists"}, {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                     {"key": "spot", "operator": "Equal", "value": "true", "effect": "NoExecute",
                      "toleration_seconds": 300}]},
    {"node_affinity": [{"match_expressions": [{"key": "karpenter.sh/capacity-type", "operator": "In",
                                               "values": ["on-demand", "spot"]},
                                              {"key": "gpu-count", "operator": "Gt", "values": ["3"]}]}]},
    {"cpu": "500m", "memory": "1e3"},
    {"cpu": "0.5", "memory": "64Gi"},
    {"resource_name": "nvidia.com/mig-1g.10gb"},
    {"resource_name": "amd.com/gpu"},
]

REFUSED = [
    ({"node_selector": {"NVIDIA A100": "x"}}, "node_selector"),
    ({"node_selector": {"a/b/c": "x"}}, "node_selector"),
    ({"node_selector": {"pool": "NVIDIA A100"}}, "node_selector"),
    ({"tolerations": [{"operator": "Equal", "value": "x", "effect": "NoSchedule"}]}, "tolerations[0]"),
    ({"tolerations": [{"key": "bad key", "operator": "Exists"}]}, "tolerations[0]"),
    ({"node_affinity": [{"match_expressions": [{"key": "n", "operator": "Gt", "values": ["1", "2"]}]}]},
     "node_affinity[0].match_expressions[0]"),
    ({"resource_name": "nvidia..com/gpu"}, "resource_name"),
    ({"resource_name": "requests.nvidia.com/gpu"}, "resource_name"),
    ({"memory": "64 Gi"}, "memory"),
    ({"memory": "1_000"}, "memory"),
    ({"memory": "1e3Gi"}, "memory"),
    ({"cpu": "-1"}, "cpu"),
    ({"cpu": "１２"}, "cpu"),
]


@pytest.fixture
def directory(tmp_path: Path) -> Path:
    target = tmp_path / "classes"
    shutil.copytree(CLASSES, target)
    return target


def test_shipped_and_sample_classes_make_pods_the_api_server_accepts(core, namespace, directory):
    samples = [*load_gpu_classes(CLASSES).values(), *(load_one(directory, fields) for fields in ACCEPTED)]
    for gpu_class in samples:
        core.create_namespaced_pod(namespace, pod_for(gpu_class), dry_run="All")  # raises on a 4xx


@pytest.mark.parametrize(("fields", "field"), REFUSED, ids=lambda v: str(v)[:40])
def test_values_the_loader_refuses_are_ones_kubernetes_refuses(core, namespace, directory, fields, field):
    with pytest.raises(GpuClassError, match=re.escape(f"probe.yaml: class 'probe': field '{field}")):
        load_one(directory, fields)
    # The same values written into a pod, bypassing the loader: the API server refuses them too.
    base = load_one(directory, {})
    pod = pod_for(base)
    spec = pod["spec"]
    resources = spec["containers"][0]["resources"]
    if "node_selector" in fields:
        spec["nodeSelector"] = fields["node_selector"]
    if "tolerations" in fields:
        spec["tolerations"] = [{k if k != "toleration_seconds" else "tolerationSeconds": v for k, v in t.items()}
                               for t in fields["tolerations"]]
    if "node_affinity" in fields:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": term["match_expressions"]} for term in fields["node_affinity"]]}}}
    if "resource_name" in fields:
        resources["limits"] = resources["requests"] = {fields["resource_name"]: "1"}
    for quantity in ("cpu", "memory"):
        if quantity in fields:
            resources["requests"][quantity] = fields[quantity]
    with pytest.raises((kubernetes.client.ApiException, ValueError)) as err:
        core.create_namespaced_pod(namespace, pod, dry_run="All")
    if isinstance(err.value, kubernetes.client.ApiException):
        assert err.value.status in (400, 422), err.value


def test_fuzzed_classes_that_load_are_accepted_by_kubernetes(core, namespace, tmp_path):
    """The four figures of the hostile class-file fuzz: clear errors, loaded and accepted by the API
    server, loaded but refused by it (must be none), hangs (none: each load is bounded)."""
    import random

    from ..helpers import SEED, field_cases, outcome, place, whole_file_cases

    cases = {f"field case {i}": text for i, text in enumerate(field_cases(random.Random(SEED)))} | whole_file_cases()
    errors = accepted = refused = 0
    for i, (label, content) in enumerate(cases.items()):
        directory = tmp_path / f"case{i}"
        shutil.copytree(CLASSES, directory)
        place(directory, label, content)
        result, _seconds = outcome(directory)
        if result == "error":
            errors += 1
            continue
        assert result == "valid", (label, result)
        loaded = load_gpu_classes(directory)
        (name,) = set(loaded) - set(load_gpu_classes(CLASSES))  # the fuzzed class, whatever its name
        gpu_class = loaded[name]
        try:
            core.create_namespaced_pod(namespace, pod_for(gpu_class, gpu_class.max_gpu_count_per_worker),
                                       dry_run="All")
            accepted += 1
        except kubernetes.client.ApiException as err:
            refused += 1
            print(f"refused by Kubernetes: {label}: {err.body[:300]}")
    print(f"\n{len(cases)} class files: {errors} clear errors, {accepted} loaded and accepted by Kubernetes, "
          f"{refused} loaded but refused by Kubernetes, 0 hangs")
    assert refused == 0 and accepted > 0
