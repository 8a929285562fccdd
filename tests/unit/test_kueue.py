"""Unit layer of Kueue mode: the shipped Kueue objects are what the classes say, a class's kueue
block is checked like every other field, and Kueue's Workload conditions read as the run's state."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from gpufn_dagster.class_files import load_gpu_classes
from gpufn_dagster.errors import GpuClassError
from gpufn_dagster.run.kueue import kueue_labels, queue_positions, workload_status

from ..conftest import REPO


def test_the_shipped_kueue_objects_are_what_the_command_in_their_header_makes_of_the_shipped_classes():
    shipped = (REPO / "deploy" / "kueue.yaml").read_text()
    command = next(line.strip("# \n") for line in shipped.splitlines() if line.startswith("#   gpufn "))
    made = subprocess.run([sys.executable, "-m", "gpufn_dagster.cli", *command.split()[1:]], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout
    assert list(yaml.safe_load_all(made)) == [d for d in yaml.safe_load_all(shipped) if d]
    kinds = [(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(shipped) if d]
    assert ("ClusterQueue", "gpufn-l4") in kinds and ("WorkloadPriorityClass", "gpufn-high") in kinds


def test_a_bad_kueue_block_names_file_class_and_field(tmp_path):
    for name in ("default", "l4"):
        (tmp_path / f"{name}.yaml").write_text((REPO / "classes" / f"{name}.yaml").read_text())
    (tmp_path / "l4.yaml").write_text((tmp_path / "l4.yaml").read_text()
                                      + "kueue: {local_queue: 'GPU queue!', priority_classes: {ten: high}}\n")
    with pytest.raises(GpuClassError) as err:
        load_gpu_classes(tmp_path)
    message = str(err.value)
    assert f"{tmp_path / 'l4.yaml'}: class 'l4': field 'kueue.local_queue'" in message, message
    assert "field 'kueue.priority_classes.ten" in message, message


def test_dagster_priority_picks_the_kueue_priority_class(tmp_path):
    (tmp_path / "default.yaml").write_text((REPO / "classes" / "default.yaml").read_text()
                                           + "kueue: {local_queue: q, priority_classes: {10: high, 0: normal}}\n")
    default = load_gpu_classes(tmp_path)["default"]
    assert [kueue_labels(default, p)["kueue.x-k8s.io/priority-class"] for p in (-5, 0, 9, 10, 99)] == [
        "normal", "normal", "normal", "high", "high"]
    assert kueue_labels(default.model_copy(update={"kueue": None}), 10) == {}


def condition(kind: str, status: str, reason: str, message: str = "") -> dict:
    return {"type": kind, "status": status, "reason": reason, "message": message}


def workload(name: str, *conditions: dict, priority: int = 0, created: str = "2026-12-01T07:00:00Z") -> dict:
    return {"metadata": {"name": name, "namespace": "ns", "creationTimestamp": created,
                         "ownerReferences": [{"kind": "Job", "name": f"dagster-run-{name}"}]},
            "spec": {"queueName": "gpu-l4", "priority": priority}, "status": {"conditions": list(conditions)}}


def test_a_preempted_workload_waiting_again_reads_as_preempted_with_both_of_kueues_messages():
    status = workload_status(workload(
        "a", condition("Evicted", "True", "Preempted", "Preempted to accommodate a workload due to prioritization"),
        condition("QuotaReserved", "False", "Pending", "couldn't assign flavors to pod set main: insufficient quota"),
        condition("Admitted", "False", "NoReservation")), {"ns/gpu-l4": "gpufn-l4"})
    assert (status.state, status.waiting, status.cluster_queue) == ("preempted", True, "gpufn-l4")
    assert status.describe() == ("Evicted (Preempted): Preempted to accommodate a workload due to prioritization; "
                                 "now Pending: couldn't assign flavors to pod set main: insufficient quota")
    admitted = workload_status(workload("b", condition("Evicted", "False", "Preempted"),
                                        condition("QuotaReserved", "True", "QuotaReserved"),
                                        condition("Admitted", "True", "Admitted", "The workload is admitted")), {})
    assert (admitted.state, admitted.waiting) == ("admitted", False)


def test_positions_follow_kueues_order_per_cluster_queue_and_skip_admitted_workloads():
    statuses = [workload_status(w, {"ns/gpu-l4": "gpufn-l4"}) for w in [
        workload("old-low", condition("QuotaReserved", "False", "Pending"), priority=-10, created="2026-12-01T06:00:00Z"),
        workload("new-high", condition("QuotaReserved", "False", "Pending"), priority=10, created="2026-12-01T08:00:00Z"),
        workload("running", condition("Admitted", "True", "Admitted"), priority=100)]]
    assert queue_positions(statuses) == {"new-high": (1, 2), "old-low": (2, 2)}


def test_without_kueue_installed_the_watcher_reads_no_workloads_instead_of_failing_its_tick():
    import kubernetes
    from dagster._core.test_utils import instance_for_test

    from gpufn_dagster.run.k8s.watch import CapacityWatcher

    class NoKueue:  # the API server's answer when Kueue's CRDs are not installed
        def list_namespaced_custom_object(self, *args, **kwargs):
            raise kubernetes.client.ApiException(status=404, reason="Not Found")

    with instance_for_test() as instance:
        watcher = CapacityWatcher(instance, core_api=None, batch_api=None, classes={}, namespace="ns",
                                  custom_api=NoKueue())
        assert watcher._workloads() == {}
