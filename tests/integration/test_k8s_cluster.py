"""The development control plane is a real Kubernetes: the real scheduler places GPU pods by the
class's selector, tolerations and resource, leaves them Pending with its own reason when the pool
is full, and the real Job controller turns Jobs into pods. Only the Kubernetes API is used."""

from __future__ import annotations

import kubernetes
import pytest

from gpufn_dagster.class_files import load_gpu_classes

from ..conftest import CLASSES, CPU_NODES, NODES_PER_CLASS, wait_for
from ..helpers import a100, gpu_pod

pytestmark = pytest.mark.k8s


def node_of(core, namespace: str, name: str) -> str | None:
    return core.read_namespaced_pod(name, namespace).spec.node_name


def test_gpu_pod_lands_on_its_class_pool(core, namespace):
    core.create_namespaced_pod(namespace, gpu_pod("one-gpu", a100(), 1))
    node = wait_for(lambda: node_of(core, namespace, "one-gpu"), what="scheduling")
    labels = core.read_node(node).metadata.labels
    assert labels["gpufn.dev/pool"] == "a100-80gb"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    wait_for(lambda: core.read_namespaced_pod("one-gpu", namespace).status.phase == "Running", what="Running")


def test_full_pool_leaves_pod_pending_with_scheduler_reason_then_schedules_it(core, namespace):
    gpus = a100().max_gpu_count_per_worker
    for i in range(NODES_PER_CLASS):  # fill every A100 node
        core.create_namespaced_pod(namespace, gpu_pod(f"fill-{i}", a100(), gpus))
    for i in range(NODES_PER_CLASS):
        wait_for(lambda i=i: core.read_namespaced_pod(f"fill-{i}", namespace).status.phase == "Running",
                 what=f"fill-{i} Running")

    core.create_namespaced_pod(namespace, gpu_pod("waiting", a100(), 1))

    def unschedulable():
        conditions = core.read_namespaced_pod("waiting", namespace).status.conditions or []
        return next((c for c in conditions if c.type == "PodScheduled" and c.reason == "Unschedulable"), None)

    condition = wait_for(unschedulable, what="PodScheduled=False")
    nodes = len(core.list_node().items)
    assert nodes == len(load_gpu_classes(CLASSES)) * NODES_PER_CLASS + CPU_NODES
    assert condition.status == "False"
    assert condition.message.startswith(f"0/{nodes} nodes are available: ")
    assert f"{NODES_PER_CLASS} Insufficient nvidia.com/gpu" in condition.message
    events = wait_for(lambda: [e for e in core.list_namespaced_event(
        namespace, field_selector="involvedObject.name=waiting").items if e.reason == "FailedScheduling"],
        what="FailedScheduling event")
    assert "Insufficient nvidia.com/gpu" in events[-1].message
    assert node_of(core, namespace, "waiting") is None

    # Release one running pod: it completes, its GPUs free up, the waiting pod is scheduled there.
    freed = node_of(core, namespace, "fill-0")
    core.patch_namespaced_pod("fill-0", namespace, {"metadata": {"labels": {"gpufn.dev/fake-outcome": "succeed"}}})
    wait_for(lambda: core.read_namespaced_pod("fill-0", namespace).status.phase == "Succeeded", what="fill-0 done")
    assert wait_for(lambda: node_of(core, namespace, "waiting"), timeout=60, what="rescheduling") == freed


def test_mig_pod_lands_only_on_mig_nodes(core, namespace):
    mig = load_gpu_classes(CLASSES)["a100-mig-1g-10gb"]
    core.create_namespaced_pod(namespace, gpu_pod("slice", mig, 1))
    node = wait_for(lambda: node_of(core, namespace, "slice"), what="scheduling")
    assert core.read_node(node).metadata.labels["gpufn.dev/pool"] == "a100-mig-1g-10gb"


def cpu_job(name: str, pod_metadata: dict) -> dict:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"backoffLimit": 0, "template": {
                "metadata": pod_metadata,
                "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}


def test_job_controller_creates_pod_that_completes(cluster, core, namespace):
    batch = kubernetes.client.BatchV1Api(cluster.api_client())
    batch.create_namespaced_job(namespace, cpu_job("job", {"annotations": {"gpufn.dev/fake-run-ms": "200"}}))
    pods = wait_for(lambda: core.list_namespaced_pod(namespace, label_selector="job-name=job").items, what="Job pod")
    assert core.read_node(wait_for(lambda: node_of(core, namespace, pods[0].metadata.name), what="bound")) \
        .metadata.labels["gpufn.dev/pool"] == "cpu"
    wait_for(lambda: (batch.read_namespaced_job("job", namespace).status.succeeded or 0) == 1, what="Job succeeded")


def test_failing_pod_fails_its_job(cluster, core, namespace):
    batch = kubernetes.client.BatchV1Api(cluster.api_client())
    batch.create_namespaced_job(namespace, cpu_job("bad", {"labels": {"gpufn.dev/fake-outcome": "fail"}}))
    wait_for(lambda: (batch.read_namespaced_job("bad", namespace).status.failed or 0) == 1, what="Job failed")
    (pod,) = core.list_namespaced_pod(namespace, label_selector="job-name=bad").items
    assert pod.status.phase == "Failed"
    job = wait_for(lambda: (j := batch.read_namespaced_job("bad", namespace)).status.conditions and j,
                   what="Job condition")
    failed = [c for c in job.status.conditions if c.type == "Failed"]
    assert failed and failed[0].status == "True" and failed[0].reason == "BackoffLimitExceeded"
    assert not job.status.succeeded and not job.status.active
