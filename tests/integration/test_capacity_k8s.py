"""Runs waiting on GPU capacity, on the real control plane: the run waits (never fails, never falls
back), the UI's tags and events say why with the scheduler's own words, it starts when capacity
frees, and max_wait / never-fits / ended runs leave no Job behind."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import kubernetes
import pytest
import yaml
from dagster import DagsterInstance, DagsterRunStatus
from dagster._core.test_utils import instance_for_test

from gpufn_dagster.run.k8s.watch import CapacityWatcher
from gpufn_dagster.class_files import load_gpu_classes

from ..conftest import CLASSES, NODES_PER_CLASS, REPO, wait_for
from gpufn_dagster.tags import CAPACITY_REASON_TAG, GPU_CLASS_TAG, CapacityReason

from ..helpers import (a100, class_gauges, event_metadata, fanned_out_run, gpu_pod, launcher_config, materialize,
                       run_pod, shard_step_pods, unschedulable)

pytestmark = pytest.mark.k8s


@pytest.fixture
def instance(cluster, namespace, classes_dir, request) -> Iterator[DagsterInstance]:
    """The launcher's instance, stored in SQLite files -- or, for a test parametrized with
    `instance="postgres"`, in a real PostgreSQL database, as a Kubernetes deployment stores it."""
    postgres = getattr(request, "param", "sqlite") == "postgres"
    overrides = {**({"storage": {"postgres": {"postgres_url": request.getfixturevalue("postgres_url")}}}
                    if postgres else {}),
                 "run_launcher": launcher_config(cluster, namespace, classes_dir),
                 "run_coordinator": {"module": "dagster._core.run_coordinator", "class": "DefaultRunCoordinator"},
                 # The shipped Kubernetes config: run monitoring on, but no start timeout (capacity
                 # waits are bounded per class by max_wait instead).
                 "run_monitoring": {"enabled": True, "start_timeout_seconds": 0}}
    with instance_for_test(overrides=overrides) as instance:
        yield instance


@pytest.fixture
def watcher(cluster, instance, namespace, classes_dir) -> CapacityWatcher:
    client = cluster.api_client()
    return CapacityWatcher(instance, kubernetes.client.CoreV1Api(client), kubernetes.client.BatchV1Api(client),
                           load_gpu_classes(classes_dir), namespace)


@pytest.fixture
def full_a100_pool(core, namespace) -> list[str]:
    names = [f"fill-{i}" for i in range(NODES_PER_CLASS)]
    for name in names:
        core.create_namespaced_pod(namespace, gpu_pod(name, a100(), a100().max_gpu_count_per_worker))
    for name in names:
        wait_for(lambda n=name: core.read_namespaced_pod(n, namespace).status.phase == "Running", what=name)
    return names


def messages(instance: DagsterInstance, run_id: str) -> list[str]:
    return [e.message for e in instance.all_logs(run_id) if e.is_dagster_event and e.message]


def wait_reasons(instance: DagsterInstance, run_id: str) -> list[str]:
    """The scheduler's reasons each "Waiting for GPU capacity" event of the run reported."""
    return [e.dagster_event.engine_event_data.metadata["Reasons"].value for e in instance.all_logs(run_id)
            if e.is_dagster_event and "Waiting for GPU capacity" in (e.message or "")]


@pytest.mark.parametrize("instance", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)
def test_full_pool_run_waits_says_why_and_starts_when_capacity_frees(core, namespace, instance, watcher,
                                                                     full_a100_pool):
    run_id = materialize(instance, "frames__emb_a100")
    wait_for(lambda: unschedulable(core, namespace, run_id), what="Unschedulable")
    report = watcher.tick()
    run = instance.get_run_by_id(run_id)
    assert run.status == DagsterRunStatus.STARTING  # waiting, not failed, not moved elsewhere
    assert run.tags["gpufn/capacity"] == "waiting" and ".dagster/gpufn-waiting-since" in run.tags
    (event,) = [m for m in event_metadata(instance, run_id) if "Requested" in m]
    assert (event["GPU class"], event["Requested"], event["Position"]) == ("a100-80gb", "2 x nvidia.com/gpu", "1 of 1")
    assert f"{NODES_PER_CLASS} Insufficient nvidia.com/gpu" in event["Scheduler message"]
    assert "nodes are available" in event["Scheduler message"]
    assert f"Insufficient nvidia.com/gpu: {NODES_PER_CLASS} of" in event["Reasons"]  # the same, counted per reason
    assert report.classes["a100-80gb"].waiting == 1
    assert run_pod(core, namespace, run_id).spec.node_name is None  # no fallback to any other node
    # The tick's gauges, as `gpufn serve`'s /metrics reads them from the instance.
    gpus = sum(int((n.status.allocatable or {}).get("nvidia.com/gpu", "0")) for n in core.list_node().items
               if all((n.metadata.labels or {}).get(k) == v for k, v in a100().node_selector.items()))
    assert gpus == NODES_PER_CLASS * a100().max_gpu_count_per_worker  # the pool the fillers fill
    assert class_gauges(instance, "a100-80gb") == ("gpu", gpus, 0, 1, 1)  # the fillers are not GPU runs

    watcher.tick()  # nothing changed: no second event
    # (On a loaded machine the scheduler's reasons can really change between ticks -- a KWOK node
    # late with its heartbeat is tainted not-ready -- and then a second event is right.)
    reasons = wait_reasons(instance, run_id)
    assert len(reasons) == 1 or all(a != b for a, b in zip(reasons, reasons[1:])), reasons

    core.patch_namespaced_pod("fill-1", namespace, {"metadata": {"labels": {"gpufn.dev/fake-outcome": "succeed"}}})
    node = wait_for(lambda: run_pod(core, namespace, run_id).spec.node_name, timeout=60, what="scheduled")
    watcher.tick()
    run = instance.get_run_by_id(run_id)
    assert run.tags["gpufn/capacity"] == "scheduled"
    assert [m["Node"] for m in event_metadata(instance, run_id) if "Node" in m] == [node]
    assert class_gauges(instance, "a100-80gb") == ("gpu", gpus, 2, 0, 0)  # its 2 GPUs in use, none waiting


def test_an_autoscalers_reaction_to_a_waiting_pod_is_reported_from_its_event(core, namespace, instance, watcher,
                                                                           full_a100_pool):
    """The tick lists a pod's events less the scheduler's FailedScheduling (one per waiting pod, whose
    words the pod's condition carries): the autoscalers' reactions still reach the run's page."""
    run_id = materialize(instance, "frames__emb_a100")
    wait_for(lambda: unschedulable(core, namespace, run_id), what="Unschedulable")
    watcher.tick()
    (first,) = [m for m in event_metadata(instance, run_id) if "Requested" in m]
    assert first["Autoscaler"] == "no reaction"
    pod = run_pod(core, namespace, run_id)
    core.create_namespaced_event(namespace, {
        "metadata": {"name": f"{pod.metadata.name}.scaleup"}, "reason": "TriggeredScaleUp", "type": "Normal",
        "message": "pod triggered scale-up: [{gpu-pool 0->1 (max: 4)}]", "source": {"component": "cluster-autoscaler"},
        "involvedObject": {"kind": "Pod", "name": pod.metadata.name, "namespace": namespace, "uid": pod.metadata.uid}})
    watcher.tick()
    waits = [m for m in event_metadata(instance, run_id) if "Requested" in m]
    assert [m["Autoscaler"] for m in waits] == ["no reaction", "TriggeredScaleUp"], waits


def test_second_waiting_run_gets_position_two(core, namespace, instance, watcher, full_a100_pool):
    first = materialize(instance, "frames__emb_a100")
    wait_for(lambda: unschedulable(core, namespace, first), what="first Unschedulable")
    watcher.tick(now=time.time())
    second = materialize(instance, "frames__emb_a100")
    wait_for(lambda: unschedulable(core, namespace, second), what="second Unschedulable")
    watcher.tick(now=time.time() + 1)
    waits = [m for m in event_metadata(instance, second) if "Requested" in m]
    assert [(m["Position"], m["Runs ahead"]) for m in waits] == [("2 of 2", first)], waits


def test_max_wait_fails_the_run_and_deletes_its_job(cluster, core, namespace, instance, watcher, classes_dir,
                                                    full_a100_pool):
    spec = yaml.safe_load((classes_dir / "a100-80gb.yaml").read_text())
    spec["max_wait"] = "30s"
    (classes_dir / "a100-80gb.yaml").write_text(yaml.safe_dump(spec))
    watcher.classes = load_gpu_classes(classes_dir)
    run_id = materialize(instance, "frames__emb_a100")
    wait_for(lambda: unschedulable(core, namespace, run_id), what="Unschedulable")
    started = time.time()
    watcher.tick(now=started)
    assert instance.get_run_by_id(run_id).status == DagsterRunStatus.STARTING
    report = watcher.tick(now=started + 31)
    run = instance.get_run_by_id(run_id)
    assert run.status == DagsterRunStatus.FAILURE and run.tags["gpufn/capacity"] == "timed-out"
    assert report.failed_runs == [run_id]
    batch = kubernetes.client.BatchV1Api(cluster.api_client())
    wait_for(lambda: not [j for j in batch.list_namespaced_job(namespace).items
                          if j.metadata.labels.get("dagster/run-id") == run_id], what="Job deleted")
    wait_for(lambda: not core.list_namespaced_pod(namespace, label_selector=f"dagster/run-id={run_id}").items,
             what="pod deleted")
    assert run.tags[CAPACITY_REASON_TAG] == CapacityReason.MAX_WAIT_EXCEEDED and run.tags[GPU_CLASS_TAG] == "a100-80gb"


def test_request_no_node_could_hold_fails_fast(core, namespace, instance, watcher, classes_dir):
    # The class names a resource none of its nodes has: waiting would be forever.
    path = classes_dir / "l4.yaml"
    path.write_text(path.read_text().replace("resource_name: nvidia.com/gpu", "resource_name: nvidia.com/mig-2g.20gb"))
    watcher.classes = load_gpu_classes(classes_dir)
    run_id = materialize(instance, "frames__emb_l4")
    wait_for(lambda: unschedulable(core, namespace, run_id), what="Unschedulable")
    watcher.tick()
    run = instance.get_run_by_id(run_id)
    assert run.status == DagsterRunStatus.FAILURE and run.tags["gpufn/capacity"] == "never-fits"
    assert any("no node of GPU class 'l4' has 1 x nvidia.com/mig-2g.20gb allocatable" in m
               for m in messages(instance, run_id))


def test_run_failed_elsewhere_leaves_no_job_behind(cluster, core, namespace, instance, watcher, full_a100_pool):
    """E.g. run monitoring's start timeout, which fails a STARTING run without deleting its Job."""
    run_id = materialize(instance, "frames__emb_a100")
    wait_for(lambda: unschedulable(core, namespace, run_id), what="Unschedulable")
    watcher.tick()
    assert instance.get_run_by_id(run_id).tags["gpufn/capacity"] == "waiting"
    instance.report_run_failed(instance.get_run_by_id(run_id), "Run timed out due to taking longer than 180 seconds")
    report = watcher.tick()
    assert len(report.deleted_jobs) == 1
    assert instance.get_run_by_id(run_id).tags["gpufn/capacity"] == "released"  # the present, not its last wait
    wait_for(lambda: not core.list_namespaced_pod(namespace, label_selector=f"dagster/run-id={run_id}").items,
             what="orphan pod deleted")


def test_start_timeout_does_not_fail_a_capacity_wait(core, namespace, instance, watcher, full_a100_pool):
    from dagster._daemon.monitoring.run_monitoring import monitor_starting_run

    run_id = materialize(instance, "frames__emb_a100")
    wait_for(lambda: unschedulable(core, namespace, run_id), what="Unschedulable")
    assert instance.run_monitoring_start_timeout_seconds == 0  # the shipped configuration
    if instance.run_monitoring_start_timeout_seconds > 0:
        monitor_starting_run(instance, instance.get_run_by_id(run_id), None)
    watcher.tick()
    assert instance.get_run_by_id(run_id).status == DagsterRunStatus.STARTING




def test_a_gpu_run_whose_job_and_pod_vanish_fails_with_that_reason(cluster, core, namespace, instance, watcher,
                                                                  full_a100_pool):
    """A spot node lost, or the Job deleted by hand, before the run worker started: never STARTING forever."""
    run_id = materialize(instance, "frames__emb_a100")
    wait_for(lambda: unschedulable(core, namespace, run_id), what="Unschedulable")
    watcher.tick()
    assert instance.get_run_by_id(run_id).tags["gpufn/capacity"] == "waiting"
    batch = kubernetes.client.BatchV1Api(cluster.api_client())
    batch.delete_collection_namespaced_job(namespace, label_selector=f"dagster/run-id={run_id}",
                                           propagation_policy="Background")
    core.delete_collection_namespaced_pod(namespace, label_selector=f"dagster/run-id={run_id}", grace_period_seconds=0)
    wait_for(lambda: not core.list_namespaced_pod(namespace, label_selector=f"dagster/run-id={run_id}").items
             and not batch.list_namespaced_job(namespace, label_selector=f"dagster/run-id={run_id}").items,
             what="Job and pod gone")
    report = watcher.tick()
    run = instance.get_run_by_id(run_id)
    assert run.status == DagsterRunStatus.FAILURE and run.tags["gpufn/capacity"] == "lost"
    assert report.failed_runs == [run_id]
    assert run.tags[CAPACITY_REASON_TAG] == CapacityReason.POD_LOST


def test_a_freshly_launched_run_without_a_pod_yet_is_left_alone(core, namespace, instance, watcher):
    run_id = materialize(instance, "frames__emb_l4")
    watcher.tick()  # whether or not its pod exists yet, the run is not failed
    assert instance.get_run_by_id(run_id).status == DagsterRunStatus.STARTING


def test_terminating_a_waiting_gpu_run_cancels_it_at_once(cluster, core, namespace, instance, full_a100_pool):
    run_id = materialize(instance, "frames__emb_a100")
    wait_for(lambda: unschedulable(core, namespace, run_id), what="Unschedulable")
    assert instance.run_coordinator.cancel_run(run_id)
    run = instance.get_run_by_id(run_id)
    assert run.status == DagsterRunStatus.CANCELED  # not CANCELING until Dagster's 180 s cancel timeout
    assert any("Canceled before its run worker started" in m for m in messages(instance, run_id))
    wait_for(lambda: not core.list_namespaced_pod(namespace, label_selector=f"dagster/run-id={run_id}").items,
             what="pod deleted")


def test_a_pod_its_job_is_replacing_is_reported_not_failed(cluster, core, namespace, instance, watcher,
                                                           full_a100_pool):
    # dagster-k8s gives a run's Job backoff_limit 0, so a lost pod fails its Job at once (reported as
    # `lost`); a Job allowed retries makes a replacement instead, which is what this test is about.
    run_id = materialize(instance, "frames__emb_a100",
                         tags={"dagster-k8s/config": json.dumps({"job_spec_config": {"backoff_limit": 2}})})
    wait_for(lambda: unschedulable(core, namespace, run_id), what="Unschedulable")
    (job,) = kubernetes.client.BatchV1Api(cluster.api_client()).list_namespaced_job(
        namespace, label_selector=f"dagster/run-id={run_id}").items
    assert job.spec.backoff_limit == 2
    watcher.tick()
    # A quota that admits no further pod holds the Job's replacement back, so the tick sees the Job
    # alive with no pod (as right after a spot node is lost), deterministically.
    core.create_namespaced_resource_quota(namespace, {"metadata": {"name": "no-more-pods"},
                                                      "spec": {"hard": {"pods": str(len(full_a100_pool))}}})
    wait_for(lambda: (core.read_namespaced_resource_quota("no-more-pods", namespace).status.used or {}).get("pods"),
             what="quota usage computed")
    core.delete_collection_namespaced_pod(namespace, label_selector=f"dagster/run-id={run_id}", grace_period_seconds=0)
    wait_for(lambda: not core.list_namespaced_pod(namespace, label_selector=f"dagster/run-id={run_id}").items,
             what="run pod gone")
    report = watcher.tick()
    run = instance.get_run_by_id(run_id)
    assert run.status == DagsterRunStatus.STARTING and run.tags["gpufn/capacity"] == "replacing"
    assert report.failed_runs == []
    assert run.tags[CAPACITY_REASON_TAG] == CapacityReason.POD_REPLACING
    assert [m["Job"] for m in event_metadata(instance, run_id) if "Job" in m] == [job.metadata.name]
    core.delete_namespaced_resource_quota("no-more-pods", namespace)


def test_a_shard_pod_waiting_for_its_class_is_reported_on_the_run_naming_the_shard(cluster, core, namespace, instance,
                                                                                   watcher):
    l4 = load_gpu_classes(CLASSES)["l4"]
    # Every GPU of the l4 pool but one is taken: one shard fits, the other three wait.
    fills = [f"fill-l4-{i}" for i in range(NODES_PER_CLASS)]
    for i, name in enumerate(fills):
        core.create_namespaced_pod(namespace, gpu_pod(name, l4, l4.max_gpu_count_per_worker - (1 if i == 0 else 0)))
    for name in fills:
        wait_for(lambda n=name: core.read_namespaced_pod(n, namespace).status.phase == "Running", what=name)
    run = fanned_out_run(cluster, namespace, instance)
    pods = shard_step_pods(cluster, namespace, instance, run, range(4))
    unbound = lambda: [p for p in pods if not core.read_namespaced_pod(p, namespace).spec.node_name]  # noqa: E731
    wait_for(lambda: len(unbound()) == 3 and all(
        any(c.reason == "Unschedulable" for c in core.read_namespaced_pod(p, namespace).status.conditions or [])
        for p in unbound()), what="three shards Unschedulable")
    watcher.tick()
    run = instance.get_run_by_id(run.run_id)
    assert run.tags["gpufn/capacity"] == "waiting" and run.status != DagsterRunStatus.FAILURE
    (event,) = [m for m in event_metadata(instance, run.run_id) if "Waiting steps" in m]
    assert event["Waiting steps"].count("frames__emb_wide.frames__emb_wide_shard-shard_") == 3, event
    assert event["GPU class"] == "l4" and event["Waiting since"], event

    core.delete_namespaced_pod(fills[1], namespace)  # a node frees: the waiting shards are placed
    wait_for(lambda: not unbound(), what="the waiting shards scheduled")
    watcher.tick()
    assert instance.get_run_by_id(run.run_id).tags["gpufn/capacity"] == "scheduled"
    (arrived,) = [m for m in event_metadata(instance, run.run_id) if "Node" in m]
    assert arrived["GPU class"] == "l4" and arrived["Node"] in {n.metadata.name for n in core.list_node().items}


def _waiting_run(core, namespace, instance, watcher) -> tuple[str, dict, int]:
    """A GPU run reported waiting on the full a100 pool: (its id, its tags, how many events it has)."""
    run_id = materialize(instance, "frames__emb_a100")
    wait_for(lambda: unschedulable(core, namespace, run_id), what="Unschedulable")
    watcher.tick()
    run = instance.get_run_by_id(run_id)
    assert run.tags["gpufn/capacity"] == "waiting"
    return run_id, dict(run.tags), len(instance.all_logs(run_id))


def test_a_frozen_api_server_ends_the_sensor_tick_within_its_deadline_and_touches_no_run(
        cluster, core, namespace, instance, watcher, full_a100_pool):
    import os
    import signal

    import dagster as dg

    from gpufn_dagster.errors import KubernetesUnavailable
    from gpufn_dagster.run.k8s.watch import capacity_sensor

    run_id, tags, logged = _waiting_run(core, namespace, instance, watcher)
    sensor = capacity_sensor()  # the shipped deadline: 10 s of API time per tick
    apiserver = cluster.processes["apiserver"].pid
    os.kill(apiserver, signal.SIGSTOP)  # it keeps its connections and answers nothing
    try:
        started = time.monotonic()
        with pytest.raises(KubernetesUnavailable) as err:
            sensor(dg.build_sensor_context(instance=instance))
        took = time.monotonic() - started
    finally:
        os.kill(apiserver, signal.SIGCONT)
    # Within its deadline plus a margin; before, the pool's own retries made it 20 s and more (40 s seen).
    assert took < 15, f"the tick took {took:.0f}s against a frozen API (deadline 10 s)"
    assert "did not answer" in str(err.value) and "at most 10s on the API" in str(err.value), err.value
    run = instance.get_run_by_id(run_id)
    assert dict(run.tags) == tags and len(instance.all_logs(run_id)) == logged  # no run touched
    wait_for(lambda: core.list_namespaced_pod(namespace).items is not None, what="the API answering again")


def test_broken_class_files_skip_the_sensor_tick_refuse_new_gpu_runs_and_let_cpu_runs_launch(
        cluster, core, namespace, instance, watcher, classes_dir, full_a100_pool):
    import dagster as dg

    from gpufn_dagster.run.k8s.watch import capacity_sensor

    run_id, tags, logged = _waiting_run(core, namespace, instance, watcher)
    l4 = classes_dir / "l4.yaml"
    good = l4.read_text()
    l4.write_text(good + "gpu_memroy: 24GiB\n")
    skipped = capacity_sensor()(dg.build_sensor_context(instance=instance))
    assert "GPU class files do not load" in skipped.skip_message
    assert "field 'gpu_memroy': unknown field (did you mean 'gpu_memory'?)" in skipped.skip_message
    assert dict(instance.get_run_by_id(run_id).tags) == tags and len(instance.all_logs(run_id)) == logged

    refused = instance.get_run_by_id(materialize(instance, "frames__emb_l4"))
    assert refused.status == DagsterRunStatus.FAILURE
    assert any("field 'gpu_memroy'" in m for m in messages(instance, refused.run_id)), messages(instance, refused.run_id)
    cpu = materialize(instance, "frames__words")  # needs no class: launched as ever
    wait_for(lambda: core.list_namespaced_pod(namespace, label_selector=f"dagster/run-id={cpu}").items,
             what="the CPU run's pod")

    l4.write_text(good)  # fixed: the next tick judges the waiting run again
    result = capacity_sensor()(dg.build_sensor_context(instance=instance))
    assert "a100-80gb: 1 waiting" in result.skip_reason.skip_message, result.skip_reason.skip_message
    observed = {e.asset_key.to_user_string(): e.metadata["runs_waiting"].value for e in result.asset_events}
    assert observed["gpu_capacity/a100-80gb"] == 1  # the tick's gauges, as observations of each class's asset


def test_orphan_cleanup_leaves_a_job_being_deleted_alone_and_a_job_already_gone_is_deleted(
        cluster, namespace, instance, watcher):
    from dagster._core.test_utils import create_run_for_test

    batch = kubernetes.client.BatchV1Api(cluster.api_client())
    run = create_run_for_test(instance, job_name="gone")
    instance.report_run_failed(run, "ended while its Job was still there")
    name = f"dagster-run-{run.run_id}"
    batch.create_namespaced_job(namespace, {
        "metadata": {"name": name, "finalizers": ["gpufn.test/hold"],  # its deletion stays under way
                     "labels": {"gpufn.dev/gpu-class": "l4", "dagster/run-id": run.run_id}},
        "spec": {"suspend": True, "template": {"spec": {"restartPolicy": "Never", "containers": [
            {"name": "c", "image": "gpufn/worker:test"}]}}}})
    try:
        batch.delete_namespaced_job(name, namespace, propagation_policy="Background")  # as terminate does
        wait_for(lambda: batch.read_namespaced_job(name, namespace).metadata.deletion_timestamp, what="deleting")
        report = watcher.tick()  # before: deleted again, and a race with terminate ended the tick on a 404
        assert name not in report.deleted_jobs
        assert not [m for m in event_metadata(instance, run.run_id) if m.get("Job") == name]
    finally:
        batch.patch_namespaced_job(name, namespace, {"metadata": {"finalizers": None}})
    wait_for(lambda: name not in {j.metadata.name for j in batch.list_namespaced_job(namespace).items}, what="gone")
    from gpufn_dagster.run.k8s.watch import TickReport

    gone = TickReport()
    watcher._delete_job(name, namespace, gone)  # deleting a Job that is already gone counts as done
    assert gone.deleted_jobs == [name]


@pytest.mark.postgres
def test_the_shipped_kubernetes_instance_config_stores_runs_in_postgres_and_its_watcher_reads_them(
        cluster, core, namespace, classes_dir, postgres_server, monkeypatch, full_a100_pool):
    """deploy/dagster-k8s.yaml as shipped, only its addresses pointed at this machine's servers."""
    from urllib.parse import urlparse

    shipped = yaml.safe_load((REPO / "deploy" / "dagster-k8s.yaml").read_text())
    database = urlparse(postgres_server.database())
    shipped["storage"]["postgres"]["postgres_db"].update(
        {"username": database.username, "hostname": database.hostname, "port": database.port,
         "db_name": database.path.lstrip("/")})
    monkeypatch.setenv("DAGSTER_PG_PASSWORD", "unused")  # the server trusts local connections
    shipped["run_launcher"] = launcher_config(cluster, namespace, classes_dir)
    del shipped["run_queue"]  # no daemon here to dequeue: launch at once
    shipped["run_coordinator"] = {"module": "dagster._core.run_coordinator", "class": "DefaultRunCoordinator"}
    with instance_for_test(overrides=shipped) as instance:
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        run_id = materialize(instance, "frames__emb_a100")
        wait_for(lambda: unschedulable(core, namespace, run_id), what="Unschedulable")
        client = cluster.api_client()
        CapacityWatcher(instance, kubernetes.client.CoreV1Api(client), kubernetes.client.BatchV1Api(client),
                        load_gpu_classes(classes_dir), namespace).tick()
        assert instance.get_run_by_id(run_id).tags["gpufn/capacity"] == "waiting"
        assert [m["Requested"] for m in event_metadata(instance, run_id) if "Requested" in m and m["GPU class"] == "a100-80gb"] \
            == ["2 x nvidia.com/gpu"]


def h100():
    return load_gpu_classes(CLASSES)["h100-80gb"]


def placed_pod(core, namespace: str, run_id: str):
    pod = wait_for(lambda: (p := run_pod(core, namespace, run_id)).spec.node_name and p, timeout=120, what="placed")
    return pod, core.read_node(pod.spec.node_name)


def test_a_run_accepting_two_classes_lands_on_the_first_with_room_and_says_which(core, namespace, instance, watcher,
                                                                                 full_a100_pool):
    run_id = materialize(instance, "frames__emb_any")  # a100-80gb, else h100-80gb; the A100 pool is full
    pod, node = placed_pod(core, namespace, run_id)
    assert node.metadata.labels["gpufn.dev/pool"] == "h100-80gb"  # not waiting behind the full first choice
    assert pod.spec.containers[0].resources.limits["nvidia.com/gpu"] == "2"
    run = instance.get_run_by_id(run_id)
    assert run.tags[GPU_CLASS_TAG] == "a100-80gb|h100-80gb" and "gpufn/gpu-class-got" not in run.tags
    (placed,) = [m for m in event_metadata(instance, run_id) if "GPU model" in m]
    assert placed["GPU model"] == "NVIDIA-A100-SXM4-80GB or NVIDIA-H100-80GB-HBM3"

    watcher.tick()
    assert instance.get_run_by_id(run_id).tags["gpufn/gpu-class-got"] == "h100-80gb"
    (got,) = [m for m in event_metadata(instance, run_id) if "GPU class got" in m]
    assert (got["GPU class got"], got["Node"]) == ("h100-80gb", node.metadata.name)
    said = [e.message for e in instance.all_logs(run_id) if e.message and "GPU class 'h100-80gb' got" in e.message]
    assert said and "(choice 2 of a100-80gb, h100-80gb: a100-80gb had no room)" in said[0]
    assert class_gauges(instance, "h100-80gb")[2] == 2  # its 2 GPUs counted in use on the class it got
    assert class_gauges(instance, "a100-80gb")[2] == 0
    watcher.tick()  # said once
    assert len([m for m in event_metadata(instance, run_id) if "GPU class got" in m]) == 1


def test_a_run_accepting_two_classes_prefers_the_first_when_both_have_room(core, namespace, instance, watcher):
    run_id = materialize(instance, "frames__emb_any")
    _, node = placed_pod(core, namespace, run_id)
    assert node.metadata.labels["gpufn.dev/pool"] == "a100-80gb"
    watcher.tick()
    assert instance.get_run_by_id(run_id).tags["gpufn/gpu-class-got"] == "a100-80gb"


def test_a_run_accepting_two_full_classes_waits_on_both_and_starts_on_the_first_to_free(core, namespace, instance,
                                                                                        watcher, full_a100_pool):
    fillers = [f"fill-h100-{i}" for i in range(NODES_PER_CLASS)]
    for name in fillers:
        core.create_namespaced_pod(namespace, gpu_pod(name, h100(), h100().max_gpu_count_per_worker))
    for name in fillers:
        wait_for(lambda n=name: core.read_namespaced_pod(n, namespace).status.phase == "Running", what=name)
    run_id = materialize(instance, "frames__emb_any")
    wait_for(lambda: unschedulable(core, namespace, run_id), what="Unschedulable")
    watcher.tick()
    run = instance.get_run_by_id(run_id)
    assert run.status == DagsterRunStatus.STARTING and run.tags["gpufn/capacity"] == "waiting"  # never a CPU
    (event,) = [m for m in event_metadata(instance, run_id) if "Requested" in m]
    assert event["GPU class"] == "a100-80gb|h100-80gb"
    assert f"{2 * NODES_PER_CLASS} Insufficient nvidia.com/gpu" in event["Scheduler message"]  # both pools looked at
    capacity = NODES_PER_CLASS * (a100().max_gpu_count_per_worker + h100().max_gpu_count_per_worker)
    assert class_gauges(instance, "a100-80gb|h100-80gb") == ("gpu", capacity, 0, 1, 1)  # the choice's own line
    core.patch_namespaced_pod("fill-h100-0", namespace, {"metadata": {"labels": {"gpufn.dev/fake-outcome": "succeed"}}})
    _, node = placed_pod(core, namespace, run_id)
    assert node.metadata.labels["gpufn.dev/pool"] == "h100-80gb"
    watcher.tick()
    assert instance.get_run_by_id(run_id).tags["gpufn/gpu-class-got"] == "h100-80gb"


def test_the_shards_of_a_refresh_accepting_two_classes_fill_the_first_pool_then_the_second(
        cluster, core, namespace, instance, watcher):
    run_id = materialize(instance, "frames__emb_wide_any", job="fanned_any")
    run = instance.get_run_by_id(run_id)
    assert run.tags["gpufn/placement"] == "per-step"
    pools = []
    for name in shard_step_pods(cluster, namespace, instance, run, range(4)):  # one after another, as launched
        node = wait_for(lambda p=name: core.read_namespaced_pod(p, namespace).spec.node_name, what=f"{name} placed")
        pools.append(core.read_node(node).metadata.labels["gpufn.dev/pool"])
    assert pools == ["a100-80gb", "a100-80gb", "h100-80gb", "h100-80gb"]  # 8 GPUs each: one node per shard
    watcher.tick()
    assert instance.get_run_by_id(run_id).tags["gpufn/gpu-class-got"] == "a100-80gb,h100-80gb"
    got = sorted((m["Step"], m["GPU class got"]) for m in event_metadata(instance, run_id) if "GPU class got" in m)
    assert [c for _, c in got] == ["a100-80gb", "a100-80gb", "h100-80gb", "h100-80gb"], got
    assert class_gauges(instance, "a100-80gb")[2] == class_gauges(instance, "h100-80gb")[2] == 16


class _CountedCore(kubernetes.client.CoreV1Api):
    """The real core API, counting the pod lists made through it (a watch is not a list)."""

    pod_lists = 0

    def list_namespaced_pod(self, *args, **kwargs):
        if not kwargs.get("watch"):
            self.pod_lists += 1
        return super().list_namespaced_pod(*args, **kwargs)


def test_a_watchers_kept_lists_follow_its_pods_between_ticks_without_listing_them_again(
        cluster, core, namespace, instance, classes_dir, full_a100_pool):
    """Under the sensor, ticks after the first judge pods the watches kept current: a run that waits
    is still seen waiting, and seen scheduled once room frees, with no pod listed again; a watch
    that ended makes the next tick list afresh."""
    from gpufn_dagster.run.k8s.informers import Informers

    counted, informers = _CountedCore(cluster.api_client()), Informers()  # the sensor keeps one
    watcher = CapacityWatcher(instance, counted, kubernetes.client.BatchV1Api(cluster.api_client()),
                              load_gpu_classes(classes_dir), namespace, informers=informers)
    try:
        run_id = materialize(instance, "frames__emb_a100")
        wait_for(lambda: unschedulable(core, namespace, run_id), what="Unschedulable")
        watcher.tick()
        assert instance.get_run_by_id(run_id).tags["gpufn/capacity"] == "waiting"
        assert counted.pod_lists == 1
        for _ in range(3):
            report = watcher.tick()
            assert report.classes["a100-80gb"].waiting == 1, report.summary()
        assert counted.pod_lists == 1 and len(wait_reasons(instance, run_id)) >= 1

        core.patch_namespaced_pod("fill-1", namespace, {"metadata": {"labels": {"gpufn.dev/fake-outcome": "succeed"}}})
        node = wait_for(lambda: run_pod(core, namespace, run_id).spec.node_name, timeout=60, what="scheduled")
        # The watch brings the pod's binding: a tick or a few (its latency) see it, none lists pods.
        wait_for(lambda: watcher.tick() and instance.get_run_by_id(run_id).tags["gpufn/capacity"] == "scheduled",
                 what="a tick seeing the pod scheduled from its kept list")
        assert [m["Node"] for m in event_metadata(instance, run_id) if "Node" in m] == [node]
        assert counted.pod_lists == 1

        informers.stop()  # a watch that ended (expired, failed, quiet): the next tick lists afresh
        watcher.tick()
        assert counted.pod_lists == 2
    finally:
        informers.stop()


def test_a_kept_list_follows_its_watch_and_is_not_trusted_once_the_watch_expired_or_went_quiet(
        cluster, core, namespace):
    """A kept list is read once, then follows the watch (objects without their managedFields); a watch
    the API server expired (its 410 Gone) or that was not heard from lately leaves no list to trust,
    so the tick starts a new one."""
    import urllib3

    from gpufn_dagster.run.k8s import informers as kept

    now = [time.monotonic()]
    informer = kept.Informer(core.list_namespaced_pod, (namespace,), {}, clock=lambda: now[0])
    try:
        assert informer.wait(30) == []
        core.create_namespaced_pod(namespace, {"metadata": {"name": "p", "labels": {"gpufn.dev/fake-outcome": "hold"}},
                                               "spec": {"containers": [{"name": "c", "image": "img"}]}})
        wait_for(lambda: [p.metadata.name for p in informer.wait(1)] == ["p"], what="the added pod kept")
        assert "managedFields" not in informer.wait(1)[0]["metadata"]
        core.delete_namespaced_pod("p", namespace, grace_period_seconds=0)
        wait_for(lambda: informer.wait(1) == [], what="the deleted pod gone from the kept list")

        now[0] += kept.FRESH_SECONDS + 1  # nothing heard since (the clock moved on, not the watch)
        assert not informer.alive
        with pytest.raises(urllib3.exceptions.ProtocolError):
            informer.wait(1)
    finally:
        informer.stop()

    expired = kept.Informer(core.list_namespaced_pod, (namespace,), {})
    try:
        expired.wait(30)
        assert expired._apply({"type": "ERROR", "object": {"code": 410, "reason": "Expired",
                                                         "message": "too old resource version"}}) is False
        assert "410 Expired" in expired.ended
    finally:
        expired.stop()
