"""Kueue mode on the real control plane with a real Kueue (built from its pinned module): a class
that names a LocalQueue hands its runs' Jobs to Kueue, which suspends them until its ClusterQueue
admits them -- by quota, in priority order, preempting a lower priority. Every step of that is
what the Dagster run shows: Kueue's state and words, its place in the ClusterQueue, and that a
preempted run waits again instead of failing."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import kubernetes
import pytest
import yaml
from dagster import DagsterInstance, DagsterRunStatus
from dagster._core.launcher import WorkerStatus
from dagster._core.test_utils import instance_for_test

from gpufn_dagster.class_files import load_gpu_classes
from gpufn_dagster.run.kueue import kueue_manifests
from gpufn_dagster.run.k8s.watch import CapacityWatcher
from gpufn_devcluster.kueue import KUEUE_NAMESPACE_LABEL, Kueue, apply_objects

from ..conftest import REPO, wait_for
from ..helpers import event_metadata, fanned_out_run, launcher_config, materialize, shard_step_pods

pytestmark = pytest.mark.k8s
KUEUE = {"local_queue": "gpu-l4", "priority_classes": {10: "gpufn-high", 0: "gpufn-normal", -10: "gpufn-low"}}


@pytest.fixture(scope="module")
def kueue(cluster) -> Iterator[Kueue]:
    from gpufn_devcluster.cluster import binaries_dir

    with Kueue(binaries_dir(), cluster) as running:
        yield running


@pytest.fixture
def kueue_classes(classes_dir):
    """The shipped classes, l4 in Kueue mode (LocalQueue gpu-l4, three priority classes)."""
    l4 = classes_dir / "l4.yaml"
    l4.write_text(l4.read_text() + yaml.safe_dump({"kueue": KUEUE}))
    return classes_dir


@pytest.fixture
def queue(cluster, kueue, namespace, core, kueue_classes) -> Iterator[str]:
    """Kueue's objects for the l4 class as `kueue_manifests` makes them, with a quota of one GPU,
    in this test's namespace (labelled for Kueue); its ClusterQueue is this test's own."""
    yield from _queue(cluster, namespace, core, kueue_classes, gpus=1)


@pytest.fixture
def empty_queue(cluster, kueue, namespace, core, kueue_classes) -> Iterator[str]:
    """The same with a quota of no GPU at all: no l4 request can ever be admitted."""
    yield from _queue(cluster, namespace, core, kueue_classes, gpus=0)


def _queue(cluster, namespace, core, kueue_classes, gpus: int) -> Iterator[str]:
    core.patch_namespace(namespace, {"metadata": {"labels": {KUEUE_NAMESPACE_LABEL: "true"}}})
    objects = kueue_manifests(load_gpu_classes(kueue_classes).values(), {"l4": gpus}, namespace)
    name = f"gpufn-l4-{uuid.uuid4().hex[:6]}"
    custom = kubernetes.client.CustomObjectsApi(cluster.api_client())
    for body in objects:
        if body["kind"] == "ClusterQueue":
            # in a cohort of its own: the ClusterQueue of an earlier test, still being deleted while Kueue
            # ends its Workloads, must not lend this one quota
            body["metadata"]["name"] = body["spec"]["cohortName"] = name
        elif body["kind"] == "LocalQueue":
            body["spec"]["clusterQueue"] = name
        try:
            apply_objects(cluster, [body])
        except kubernetes.client.ApiException as err:
            if err.status != 409:  # flavors and priority classes are cluster-wide, made by an earlier test
                raise
    yield name
    kubernetes.client.BatchV1Api(cluster.api_client()).delete_collection_namespaced_job(
        namespace, propagation_policy="Background")
    custom.delete_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "clusterqueues", name)


@pytest.fixture
def instance(cluster, namespace, kueue_classes) -> Iterator[DagsterInstance]:
    overrides = {"run_launcher": launcher_config(cluster, namespace, kueue_classes),
                 "run_coordinator": {"module": "dagster._core.run_coordinator", "class": "DefaultRunCoordinator"},
                 "run_monitoring": {"enabled": True, "start_timeout_seconds": 0}}
    with instance_for_test(overrides=overrides) as instance:
        yield instance


@pytest.fixture
def watcher(cluster, instance, namespace, kueue_classes) -> CapacityWatcher:
    client = cluster.api_client()
    return CapacityWatcher(instance, kubernetes.client.CoreV1Api(client), kubernetes.client.BatchV1Api(client),
                           load_gpu_classes(kueue_classes), namespace)


def workload(cluster, namespace: str, run_id: str) -> dict:
    """The Kueue Workload of a run's Job, once Kueue made it."""
    custom = kubernetes.client.CustomObjectsApi(cluster.api_client())
    job = f"dagster-run-{run_id}"

    def find():
        items = custom.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", namespace, "workloads")["items"]
        return next((w for w in items if any(o["name"] == job for o in w["metadata"].get("ownerReferences", []))), None)
    return wait_for(find, what=f"the Workload of {job}", timeout=60)


def condition(cluster, namespace: str, run_id: str, kind: str, status: str = "True", reason: str | None = None) -> dict:
    def find():
        for c in (workload(cluster, namespace, run_id).get("status") or {}).get("conditions") or []:
            if c["type"] == kind and c["status"] == status and (reason is None or c["reason"] == reason):
                return c
        return None
    return wait_for(find, what=f"{kind}={status} on the Workload of run {run_id}", timeout=90)


def running_pod(core, namespace: str, run_id: str):
    def find():
        pods = core.list_namespaced_pod(namespace, label_selector=f"dagster/run-id={run_id}").items
        return next((p for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp), None)
    return wait_for(find, what=f"a running pod of run {run_id}", timeout=90)


def events(instance: DagsterInstance, run_id: str) -> list[str]:
    return [e.message for e in instance.all_logs(run_id) if e.is_dagster_event and e.message]


def job_suspended(cluster, namespace: str, run_id: str) -> bool:
    job = kubernetes.client.BatchV1Api(cluster.api_client()).read_namespaced_job(f"dagster-run-{run_id}", namespace)
    return bool(job.spec.suspend)


def test_quota_admits_one_run_the_next_waits_with_kueues_reason_and_starts_when_quota_frees(
        cluster, core, namespace, queue, instance, watcher):
    first = materialize(instance, "frames__emb_l4")
    job = kubernetes.client.BatchV1Api(cluster.api_client()).read_namespaced_job(f"dagster-run-{first}", namespace)
    assert job.metadata.labels["kueue.x-k8s.io/queue-name"] == "gpu-l4"
    assert job.metadata.labels["kueue.x-k8s.io/priority-class"] == "gpufn-normal"  # no dagster/priority: 0
    condition(cluster, namespace, first, "Admitted")
    assert running_pod(core, namespace, first).spec.node_selector["cloud.google.com/gke-accelerator"] == "nvidia-l4"

    second = materialize(instance, "frames__emb_l4")
    pending = condition(cluster, namespace, second, "QuotaReserved", "False")
    assert "insufficient unused quota for nvidia.com/gpu in flavor l4" in pending["message"], pending
    watcher.tick()
    run = instance.get_run_by_id(second)
    assert run.status == DagsterRunStatus.STARTING  # waiting: not failed, not orphaned
    assert job_suspended(cluster, namespace, second)
    assert not core.list_namespaced_pod(namespace, label_selector=f"dagster/run-id={second}").items
    assert (run.tags["gpufn/capacity"], run.tags[".dagster/gpufn-capacity-reason"], run.tags[".dagster/gpufn-kueue"]) == (
        "waiting", "KueuePending", "pending")
    wait = next(m for m in event_metadata(instance, second) if "Position" in m)
    assert (wait["Position"], wait["ClusterQueue"], wait["GPU class"]) == ("1 of 1", queue, "l4"), wait
    assert pending["message"] in wait["Kueue message"], wait  # Kueue's message verbatim
    assert run.tags[".dagster/gpufn-wait-estimate"] == "unknown"  # this instance has no finished run of the work yet
    assert any("Wait estimate: unknown (0 runs ahead on l4" in m and "no finished run of frames__emb_l4" in m
               for m in events(instance, second)), events(instance, second)
    # Dagster's run monitoring sees a suspended Job as a worker still starting, not a failed one.
    assert instance.run_launcher.check_run_worker_health(run).status == WorkerStatus.RUNNING
    assert instance.get_run_by_id(first).tags[".dagster/gpufn-kueue"] == "admitted"

    instance.run_launcher.terminate(first)  # its Job goes, and with it the quota it held
    condition(cluster, namespace, second, "Admitted")
    running_pod(core, namespace, second)
    watcher.tick()
    run = instance.get_run_by_id(second)
    assert (run.tags["gpufn/capacity"], run.tags[".dagster/gpufn-kueue"]) == ("scheduled", "admitted")
    said = event_metadata(instance, second)
    assert [m["ClusterQueue"] for m in said if "ClusterQueue" in m and "Kueue" in m] == [queue], said
    assert [m["Node"].startswith("l4-") for m in said if "Node" in m] == [True], said


def test_waiting_runs_are_admitted_by_dagster_priority_and_a_higher_one_preempts_a_lower(
        cluster, core, namespace, queue, instance, watcher):
    low = materialize(instance, "frames__emb_l4", tags={"dagster/priority": "-10"})
    condition(cluster, namespace, low, "Admitted")
    running_pod(core, namespace, low)

    high = materialize(instance, "frames__emb_l4", tags={"dagster/priority": "10"})
    preempted = condition(cluster, namespace, low, "Evicted", reason="Preempted")
    condition(cluster, namespace, high, "Admitted")
    running_pod(core, namespace, high)
    wait_for(lambda: job_suspended(cluster, namespace, low), what="the preempted run's Job suspended")
    wait_for(lambda: not [p for p in core.list_namespaced_pod(namespace, label_selector=f"dagster/run-id={low}").items
                          if not p.metadata.deletion_timestamp], what="the preempted run's pod gone", timeout=60)
    watcher.tick()
    run = instance.get_run_by_id(low)
    assert run.status == DagsterRunStatus.STARTING  # preempted: it waits again, it did not fail
    assert (run.tags["gpufn/capacity"], run.tags[".dagster/gpufn-capacity-reason"], run.tags[".dagster/gpufn-kueue"]) == (
        "waiting", "KueuePreempted", "preempted")
    said = next(m for m in events(instance, low) if "Waiting for GPU capacity" in m)
    assert "Kueue preempted it (it waits to be admitted again; its code did not fail)" in said, said
    assert preempted["message"] in said, said

    # Two more wait behind the high-priority run: the normal one was submitted last but goes first.
    normal = materialize(instance, "frames__emb_l4")
    condition(cluster, namespace, normal, "QuotaReserved", "False")
    watcher.tick()
    said = next(m for m in event_metadata(instance, normal) if "Position" in m)
    assert (said["Position"], said["ClusterQueue"]) == ("1 of 2", queue), said
    late = materialize(instance, "frames__emb_l4")  # a third waiter, behind both
    workload(cluster, namespace, late)  # Kueue may say nothing more of a workload that is not first in line
    watcher.tick()
    said = next(m for m in event_metadata(instance, late) if "Position" in m)
    # Ahead of the older low one (priority first); beside the normal one of equal priority, the
    # order is by age, which Kueue records to the second: either may be first.
    assert said["ClusterQueue"] == queue, said
    assert (said["Position"], said["Runs ahead"]) in (("2 of 3", normal), ("1 of 3", "")), said
    instance.run_launcher.terminate(late)
    instance.run_launcher.terminate(high)
    condition(cluster, namespace, normal, "Admitted")
    running_pod(core, namespace, normal)
    assert job_suspended(cluster, namespace, low)  # the low one still waits
    watcher.tick()
    assert instance.get_run_by_id(normal).tags["gpufn/capacity"] == "scheduled"
    assert instance.get_run_by_id(low).tags["gpufn/capacity"] == "waiting"


def test_a_run_that_ends_while_kueue_keeps_its_job_suspended_leaves_no_job_behind(
        cluster, core, namespace, queue, instance, watcher):
    holder = materialize(instance, "frames__emb_l4")
    condition(cluster, namespace, holder, "Admitted")
    waiting = materialize(instance, "frames__emb_l4")
    condition(cluster, namespace, waiting, "QuotaReserved", "False")
    instance.report_run_failed(instance.get_run_by_id(waiting), "failed elsewhere (say, by an operator)")
    report = watcher.tick()
    assert f"dagster-run-{waiting}" in report.deleted_jobs
    batch = kubernetes.client.BatchV1Api(cluster.api_client())
    assert f"dagster-run-{waiting}" not in {j.metadata.name for j in batch.list_namespaced_job(namespace).items
                                            if not j.metadata.deletion_timestamp}
    assert f"dagster-run-{holder}" not in report.deleted_jobs  # the admitted one's run is still starting


def test_the_shipped_kueue_objects_are_accepted_by_kueue_and_their_cluster_queues_become_active(cluster, kueue, core):
    objects = [d for d in yaml.safe_load_all((REPO / "deploy" / "kueue.yaml").read_text()) if d]
    if not any(n.metadata.name == "dagster" for n in core.list_namespace().items):
        core.create_namespace({"metadata": {"name": "dagster"}})
    custom = kubernetes.client.CustomObjectsApi(cluster.api_client())
    for body in objects:
        try:
            apply_objects(cluster, [body])  # through Kueue's validating and defaulting webhooks
        except kubernetes.client.ApiException as err:
            assert err.status == 409, err.body  # a flavor or priority class an earlier test made
    queues = [d["metadata"]["name"] for d in objects if d["kind"] == "ClusterQueue"]

    def active(name: str) -> bool:
        status = custom.get_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "clusterqueues", name).get("status") or {}
        return any(c["type"] == "Active" and c["status"] == "True" for c in status.get("conditions") or [])
    for name in queues:
        wait_for(lambda n=name: active(n), what=f"ClusterQueue {name} Active", timeout=60)
    for body in objects:
        if body["kind"] == "LocalQueue":
            custom.delete_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", "dagster", "localqueues",
                                                   body["metadata"]["name"])
    for name in queues:
        custom.delete_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "clusterqueues", name)


def test_a_fanned_out_refresh_whose_shard_jobs_kueue_holds_back_names_the_waiting_shards(
        cluster, core, namespace, queue, instance, watcher):
    # The launcher's classes put l4 in Kueue mode; the code location's (./classes) do not, and need not:
    # the shard pods are placed at launch.
    run = fanned_out_run(cluster, namespace, instance)
    shard_step_pods(cluster, namespace, instance, run, range(2), pods=False)
    batch = kubernetes.client.BatchV1Api(cluster.api_client())
    jobs = {j.metadata.labels["step"]: j for j in batch.list_namespaced_job(namespace).items if "step" in j.metadata.labels}
    assert {j.metadata.labels["kueue.x-k8s.io/queue-name"] for j in jobs.values()} == {"gpu-l4"}
    custom = kubernetes.client.CustomObjectsApi(cluster.api_client())

    def states():
        items = custom.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", namespace, "workloads")["items"]
        return sorted(c["type"] for w in items for c in w.get("status", {}).get("conditions", [])
                      if c["type"] in ("Admitted", "QuotaReserved") and c["status"] == ("True" if c["type"] == "Admitted"
                                                                                       else "False"))
    wait_for(lambda: states() == ["Admitted", "QuotaReserved"], what="one shard admitted, one held back", timeout=90)
    watcher.tick()
    said = [m for m in events(instance, run.run_id) if "Waiting for GPU capacity" in m]
    assert len(said) == 1 and said[0].startswith("[CapacityWatcher] Step frames__emb_wide.frames__emb_wide_shard-shard_1: Waiting"), said
    assert "insufficient unused quota for nvidia.com/gpu in flavor l4" in said[0], said
    assert instance.get_run_by_id(run.run_id).tags[".dagster/gpufn-capacity-reason"] == "KueuePending"


def test_a_shard_job_of_a_run_of_dagster_priority_10_carries_the_high_priority_class(cluster, namespace, queue,
                                                                                     instance):
    custom = kubernetes.client.CustomObjectsApi(cluster.api_client())
    batch = kubernetes.client.BatchV1Api(cluster.api_client())
    seen = {}
    for priority, expected in (("10", "gpufn-high"), ("0", "gpufn-normal")):
        run = fanned_out_run(cluster, namespace, instance, tags={"dagster/priority": priority})
        (name,) = shard_step_pods(cluster, namespace, instance, run, range(1), pods=False)
        assert batch.read_namespaced_job(name, namespace).metadata.labels["kueue.x-k8s.io/priority-class"] == expected

        def find(job=name):
            items = custom.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", namespace, "workloads")["items"]
            return next((w for w in items if any(o["name"] == job for o in w["metadata"].get("ownerReferences", []))),
                        None)
        seen[priority] = wait_for(find, what=f"the Workload of {name}", timeout=60)["spec"]
        assert seen[priority]["priorityClassRef"]["name"] == expected, seen[priority]  # Kueue took it
        said = [m for m in events(instance, run.run_id) if "GPU placement per step" in m]
        assert said, events(instance, run.run_id)
    assert seen["10"]["priority"] > seen["0"]["priority"]  # Kueue admits and preempts by it


def test_a_queue_whose_maximum_capacity_can_never_hold_the_run_fails_it_as_never_fits(
        cluster, core, namespace, empty_queue, instance, watcher):
    run_id = materialize(instance, "frames__emb_l4")
    pending = condition(cluster, namespace, run_id, "QuotaReserved", "False")
    assert "> maximum capacity (0)" in pending["message"], pending  # Kueue's words for "never"
    watcher.tick()
    run = instance.get_run_by_id(run_id)
    assert run.status == DagsterRunStatus.FAILURE  # not KueuePending until a max_wait nobody set
    assert (run.tags["gpufn/capacity"], run.tags[".dagster/gpufn-capacity-reason"]) == ("never-fits", "NeverFits")
    failure = next(m for m in events(instance, run_id) if "can never start" in m)
    assert f"ClusterQueue {empty_queue} can never admit it" in failure and pending["message"] in failure, failure
    batch = kubernetes.client.BatchV1Api(cluster.api_client())
    assert f"dagster-run-{run_id}" not in {j.metadata.name for j in batch.list_namespaced_job(namespace).items
                                           if not j.metadata.deletion_timestamp}


def test_a_waiting_runs_position_follows_the_clusterqueue_line_in_its_tag_and_page(
        cluster, core, namespace, queue, instance, watcher):
    import time

    # The holder's high priority: no run that joins later preempts it. The waiting ones' low priority:
    # a run of normal priority that joins later goes ahead of them.
    holder = materialize(instance, "frames__emb_l4", tags={"dagster/priority": "10"})
    condition(cluster, namespace, holder, "Admitted")
    waiting = [materialize(instance, "frames__emb_l4", tags={"dagster/priority": "-10"}) for _ in range(3)]
    for run_id in waiting:
        workload(cluster, namespace, run_id)
    condition(cluster, namespace, waiting[0], "QuotaReserved", "False")
    now = time.time()
    watcher.tick(now=now)
    first = {r: instance.get_run_by_id(r).tags.get(".dagster/gpufn-queue-position") for r in waiting}
    assert sorted(first.values()) == ["1 of 3", "2 of 3", "3 of 3"], first  # not "position 1" for all
    ahead = next(r for r, p in first.items() if p == "1 of 3")
    instance.run_launcher.terminate(ahead)  # the first in line leaves
    rest = [r for r in waiting if r != ahead]
    wait_for(lambda: not [w for w in _workloads(cluster, namespace) if any(
        o["name"] == f"dagster-run-{ahead}" for o in w["metadata"].get("ownerReferences", []))],
        what="the Workload of the run that left", timeout=60)
    watcher.tick(now=now + 30)  # the tags follow at once...
    moved = {r: instance.get_run_by_id(r).tags[".dagster/gpufn-queue-position"] for r in rest}
    assert sorted(moved.values()) == ["1 of 2", "2 of 2"], moved
    assert not any("now position" in m for r in rest for m in events(instance, r))  # ...the page within a minute
    watcher.tick(now=now + 120)
    for run_id in rest:
        # Said once: "Still waiting ...: now position ..." a minute on -- or at once, in a new report,
        # when Kueue's own words for the wait changed too (its message grows as it retries).
        said = [m for m in events(instance, run_id) if f"position {moved[run_id]} in ClusterQueue {queue}" in m]
        assert len(said) == 1, said
        assert said[0].startswith(("[CapacityWatcher] Still waiting for GPU capacity of class 'l4': now position",
                                   "[CapacityWatcher] Waiting for GPU capacity: class 'l4'")), said
    from dagster._core.storage.tags import TagType, get_tag_type  # what the UI and GraphQL leave out

    for run_id in rest:  # the runs list: the three tags a user filters by, nothing more
        shown = {k: v for k, v in instance.get_run_by_id(run_id).tags.items()
                 if "gpufn" in k and get_tag_type(k) is not TagType.HIDDEN}
        assert shown == {"gpufn/gpu-class": "l4", "gpufn/capacity": "waiting", "gpufn/placement": "gpu"}, shown
    still = sum("Still waiting" in m for r in rest for m in events(instance, r))
    watcher.tick(now=now + 300)  # nothing moved since: the place is not said again
    assert sum("Still waiting" in m for r in rest for m in events(instance, r)) == still

    # A run that joins ahead moves them back just as at once; their pages, told over a minute ago, hear it now.
    joined = materialize(instance, "frames__emb_l4")
    workload(cluster, namespace, joined)
    watcher.tick(now=now + 310)
    back = {r: instance.get_run_by_id(r).tags[".dagster/gpufn-queue-position"] for r in [joined, *rest]}
    assert back[joined] == "1 of 3" and {back[r] for r in rest} == {"2 of 3", "3 of 3"}, back
    for run_id in rest:
        assert [m["Position"] for m in event_metadata(instance, run_id) if "Position" in m][-1] == back[run_id]


def _workloads(cluster, namespace: str) -> list[dict]:
    custom = kubernetes.client.CustomObjectsApi(cluster.api_client())
    return custom.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", namespace, "workloads")["items"]


def test_a_run_accepting_two_classes_is_admitted_on_the_first_flavor_with_quota_and_lands_on_its_pool(
        cluster, core, namespace, kueue, kueue_classes, instance, watcher):
    default = kueue_classes / "default.yaml"
    default.write_text(default.read_text() + yaml.safe_dump({"kueue": {"local_queue": "gpu-default"}}))
    core.patch_namespace(namespace, {"metadata": {"labels": {KUEUE_NAMESPACE_LABEL: "true"}}})
    # l4 has no quota left (none at all here); default has room: the choice's ClusterQueue borrows it.
    objects = kueue_manifests(load_gpu_classes(kueue_classes).values(), {"l4": 0, "default": 4}, namespace,
                              [("l4", "default")])
    suffix = uuid.uuid4().hex[:6]
    renamed = {o["metadata"]["name"]: f"{o['metadata']['name']}-{suffix}" for o in objects if o["kind"] == "ClusterQueue"}
    for body in objects:  # this test's own ClusterQueues, in a cohort of their own
        if body["kind"] == "ClusterQueue":
            body["metadata"]["name"] = renamed[body["metadata"]["name"]]
            body["spec"]["cohortName"] = f"gpufn-{suffix}"
        elif body["kind"] == "LocalQueue":
            body["spec"]["clusterQueue"] = renamed[body["spec"]["clusterQueue"]]
        try:
            apply_objects(cluster, [body])
        except kubernetes.client.ApiException as err:
            if err.status != 409:  # flavors and priority classes are cluster-wide, made by an earlier test
                raise
    custom = kubernetes.client.CustomObjectsApi(cluster.api_client())
    try:
        run_id = materialize(instance, "frames__emb_either")
        job = kubernetes.client.BatchV1Api(cluster.api_client()).read_namespaced_job(f"dagster-run-{run_id}", namespace)
        assert job.metadata.labels["kueue.x-k8s.io/queue-name"] == "gpufn-l4-or-default"
        admitted = condition(cluster, namespace, run_id, "Admitted")
        assert admitted
        (assignment,) = workload(cluster, namespace, run_id)["status"]["admission"]["podSetAssignments"]
        assert assignment["flavors"]["nvidia.com/gpu"] == "default"  # l4's flavor first, but it had no quota
        pod = running_pod(core, namespace, run_id)
        assert core.read_node(pod.spec.node_name).metadata.labels["gpufn.dev/pool"] == "default"
        watcher.tick()
        assert instance.get_run_by_id(run_id).tags["gpufn/gpu-class-got"] == "default"
    finally:
        kubernetes.client.BatchV1Api(cluster.api_client()).delete_collection_namespaced_job(
            namespace, propagation_policy="Background")
        for name in renamed.values():
            custom.delete_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "clusterqueues", name)
