"""GpuK8sRunLauncher on the real control plane: Dagster runs created like the UI's Materialize
button (GraphQL launchRun of the asset job with an asset selection) become Jobs whose pods the
real scheduler places on the class's pool -- or, for a CPU run, exactly K8sRunLauncher's Job."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import dagster as dg
import kubernetes
import pytest
import yaml
from dagster import DagsterInstance
from dagster._core.test_utils import instance_for_test

from gpufn_dagster.errors import PlacementError

from ..conftest import launcher_at, wait_for
from ..helpers import create_step_job, event_metadata, fanned_out_run, job_pod, launcher_config, materialize, shard_step_pods, step_handler

pytestmark = pytest.mark.k8s
@pytest.fixture
def instance(cluster, namespace, classes_dir) -> Iterator[DagsterInstance]:
    overrides = {"run_launcher": launcher_config(cluster, namespace, classes_dir),
                 "run_coordinator": {"module": "dagster._core.run_coordinator", "class": "DefaultRunCoordinator"}}
    with instance_for_test(overrides=overrides) as instance:
        yield instance


def jobs(cluster, namespace: str) -> list:
    return kubernetes.client.BatchV1Api(cluster.api_client()).list_namespaced_job(namespace).items


def test_gpu_run_lands_on_its_class_pool_with_limits_and_tolerations(cluster, namespace, instance):
    run_id = materialize(instance, "frames__emb_a100")
    run = instance.get_run_by_id(run_id)
    assert run.tags.get("gpufn/gpu-class") == "a100-80gb", (run.status, run.tags, [e.message for e in instance.all_logs(run_id)])
    assert run.tags[".dagster/gpufn-gpu-count"] == "2"
    pod, node = job_pod(cluster, namespace, run_id)
    assert node.metadata.labels["gpufn.dev/pool"] == "a100-80gb"
    container = pod.spec.containers[0]
    assert container.resources.limits["nvidia.com/gpu"] == "2"
    assert container.resources.requests["nvidia.com/gpu"] == "2"
    assert container.resources.requests["cpu"] == "8" and container.resources.limits["memory"] == "64Gi"
    tolerations = {(t.key, t.operator, t.value, t.effect) for t in pod.spec.tolerations}
    assert ("gpufn.dev/pool", "Equal", "a100-80gb", "NoSchedule") in tolerations
    assert ("nvidia.com/gpu", "Exists", None, "NoSchedule") in tolerations
    assert pod.spec.node_selector["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    assert [source.secret_ref.name for source in container.env_from] == ["gpufn-object-store"]
    (placed,) = [m for m in event_metadata(instance, run_id) if "GPU model" in m]
    assert (placed["GPU class"], placed["GPU count"], placed["Resource"]) == ("a100-80gb", 2, "nvidia.com/gpu")


def test_mig_run_gets_the_mig_resource_on_the_mig_pool(cluster, namespace, instance):
    run_id = materialize(instance, "frames__caption")
    pod, node = job_pod(cluster, namespace, run_id)
    assert node.metadata.labels["gpufn.dev/pool"] == "a100-mig-1g-10gb"
    assert pod.spec.containers[0].resources.limits == {"nvidia.com/mig-1g.10gb": "1", "memory": "8Gi"}


def test_required_node_affinity_of_the_class_is_written(cluster, namespace, instance, classes_dir):
    path = classes_dir / "l4.yaml"
    spec = yaml.safe_load(path.read_text())
    spec["node_affinity"] = [{"match_expressions": [{"key": "gpufn.dev/pool", "operator": "In", "values": ["l4"]}]}]
    path.write_text(yaml.safe_dump(spec))
    run_id = materialize(instance, "frames__emb_l4")
    pod, node = job_pod(cluster, namespace, run_id)
    terms = pod.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms
    assert [(e.key, e.operator, e.values) for e in terms[0].match_expressions] == [("gpufn.dev/pool", "In", ["l4"])]
    assert node.metadata.labels["gpufn.dev/pool"] == "l4"


def test_run_tags_cannot_move_or_widen_a_gpu_run(cluster, namespace, instance):
    user_config = {
        "container_config": {"resources": {"limits": {"nvidia.com/gpu": "8", "amd.com/gpu": "1", "cpu": "3"}}},
        "pod_spec_config": {"node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "team": "vision"},
                            "node_name": "h100-80gb-0"},
    }
    run_id = materialize(instance, "frames__emb_a100", tags={"dagster-k8s/config": json.dumps(user_config),
                                                             "gpufn/gpu-class": "h100-80gb"})
    core = kubernetes.client.CoreV1Api(cluster.api_client())
    pod = wait_for(lambda: core.list_namespaced_pod(namespace, label_selector=f"dagster/run-id={run_id}").items,
                   what="pod")[0]
    limits = pod.spec.containers[0].resources.limits
    assert limits["nvidia.com/gpu"] == "2" and "amd.com/gpu" not in limits
    assert limits["cpu"] == "8"  # a CPU limit below the class's request is raised to it
    assert pod.spec.node_selector["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    assert pod.spec.node_selector["team"] == "vision"  # narrowing is the user's right
    assert pod.spec.node_name is None or pod.spec.node_name.startswith("a100-80gb")
    assert instance.get_run_by_id(run_id).tags["gpufn/gpu-class"] == "a100-80gb"


# What a run pod's and a step pod's refusal of GPUs in another container both say.
GIVES_A100 = "class 'a100-80gb' gives the pod's Dagster container 2 x nvidia.com/gpu"
GIVES_L4 = "class 'l4' gives the pod's Dagster container 1 x nvidia.com/gpu"


@pytest.mark.parametrize("section", ["containers", "init_containers"])
def test_run_tags_cannot_add_gpus_through_other_containers(cluster, namespace, instance, section):
    """The class bounds the GPUs of the whole pod: a sidecar or init container asking for GPUs is refused."""
    user_config = {"pod_spec_config": {section: [
        {"name": "greedy", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "3"}}},
        {"name": "greedy2", "image": "busybox", "resources": {"requests": {"nvidia.com/gpu": "3"},
                                                               "limits": {"nvidia.com/gpu": "3"}}}]}}
    run_id = materialize(instance, "frames__emb_a100", tags={"dagster-k8s/config": json.dumps(user_config)})
    run = instance.get_run_by_id(run_id)
    assert run.status.value == "FAILURE" and run.tags["gpufn/placement"] == "rejected"
    text = " ".join(str(e.dagster_event.event_specific_data) for e in instance.all_logs(run_id) if e.is_dagster_event)
    kind = "init container" if section == "init_containers" else "container"
    assert f"{kind} 'greedy' asks for nvidia.com/gpu=3; {GIVES_A100}" in text
    assert jobs(cluster, namespace) == []
    # A sidecar that asks for no GPU is the user's to add.
    fine = {"pod_spec_config": {section: [{"name": "log", "image": "busybox",
                                            "resources": {"limits": {"cpu": "100m"}}}]}}
    ok_id = materialize(instance, "frames__emb_a100", tags={"dagster-k8s/config": json.dumps(fine)})
    pod, _node = job_pod(cluster, namespace, ok_id)
    containers = pod.spec.init_containers if section == "init_containers" else pod.spec.containers[1:]
    assert [c.name for c in containers] == ["log"]


def test_cpu_run_job_is_exactly_k8s_run_launchers(cluster, namespace, instance, classes_dir):
    run_id = materialize(instance, "frames__words")
    pod, node = job_pod(cluster, namespace, run_id)
    assert node.metadata.labels["gpufn.dev/pool"] == "cpu"
    assert not (pod.spec.containers[0].resources.limits or {})
    assert not pod.spec.node_selector and "gpufn/gpu-class" not in instance.get_run_by_id(run_id).tags
    ours = next(j for j in jobs(cluster, namespace) if j.metadata.labels["dagster/run-id"] == run_id)

    # The same run through dagster-k8s's own launcher builds the same Job (names and run ids aside).
    from dagster._core.launcher import LaunchRunContext

    plain_config = launcher_config(cluster, namespace, classes_dir, cls="K8sRunLauncher")["config"]
    from dagster_k8s import K8sRunLauncher

    plain = K8sRunLauncher(**plain_config, dagster_home="/opt/dagster/dagster_home")
    plain.register_instance(instance)
    run = instance.get_run_by_id(run_id)
    captured = {}
    plain._api_client.create_namespaced_job_with_retries = lambda body, namespace: captured.update(job=body)
    plain.launch_run(LaunchRunContext(dagster_run=run, workspace=None))
    api = kubernetes.client.ApiClient()
    theirs = api.sanitize_for_serialization(captured["job"])
    mine = api.sanitize_for_serialization(ours)
    assert mine["spec"]["template"]["spec"]["containers"][0]["resources"] == \
        theirs["spec"]["template"]["spec"]["containers"][0].get("resources", {})
    for key in ("nodeSelector", "tolerations", "affinity"):
        assert mine["spec"]["template"]["spec"].get(key) == theirs["spec"]["template"]["spec"].get(key)
    assert mine["metadata"]["labels"] == theirs["metadata"]["labels"]
    assert mine["spec"]["template"]["spec"]["containers"][0]["args"] == \
        theirs["spec"]["template"]["spec"]["containers"][0]["args"]


def test_mixed_classes_without_step_pods_are_rejected_before_any_job_saying_how(cluster, namespace, instance):
    run_id = materialize(instance, "frames__emb_a100", "frames__emb_l4")
    run = instance.get_run_by_id(run_id)
    assert run.status.value == "FAILURE"
    messages = " ".join(str(e.message) + str(getattr(e.dagster_event, "event_specific_data", ""))
                        for e in instance.all_logs(run_id))
    assert "2 GPU classes: a100-80gb (2 GPU), l4 (1 GPU)" in messages
    assert "executor_def=gpu_classes_executor" in messages  # the way to run it
    assert jobs(cluster, namespace) == []


@pytest.mark.parametrize(("change", "expected"), [
    (lambda d: (d / "l4.yaml").unlink(), "unknown GPU class 'l4'; configured classes: a100-80gb"),
    (lambda d: (d / "l4.yaml").write_text((d / "l4.yaml").read_text().replace("max_gpu_count_per_worker: 4",
                                                                                "max_gpu_count_per_worker: 0")),
     "l4.yaml: class 'l4': field 'max_gpu_count_per_worker'"),
])
def test_invalid_request_fails_the_run_and_creates_no_job(cluster, namespace, instance, classes_dir, change, expected):
    change(classes_dir)
    run_id = materialize(instance, "frames__emb_l4")
    run = instance.get_run_by_id(run_id)
    assert run.status.value == "FAILURE" and run.tags["gpufn/placement"] == "rejected"
    text = " ".join(str(e.dagster_event.event_specific_data) for e in instance.all_logs(run_id) if e.is_dagster_event)
    assert expected in text and "no Kubernetes Job was created" in text
    assert jobs(cluster, namespace) == []


def test_too_many_gpus_for_the_class_fails_the_run(cluster, namespace, instance, classes_dir):
    path = classes_dir / "a100-80gb.yaml"
    path.write_text(path.read_text().replace("max_gpu_count_per_worker: 8", "max_gpu_count_per_worker: 1"))
    run_id = materialize(instance, "frames__emb_a100")
    assert instance.get_run_by_id(run_id).status.value == "FAILURE"
    text = " ".join(str(e.dagster_event.event_specific_data) for e in instance.all_logs(run_id) if e.is_dagster_event)
    assert "2 GPUs exceeds class 'a100-80gb''s max_gpu_count_per_worker of 1" in text
    assert jobs(cluster, namespace) == []


def mixed_run_on_a_cpu_worker(cluster, namespace: str, instance: DagsterInstance, job: str):
    """Materialize two GPU classes and a CPU Function through `job`: placed per step, its worker a CPU pod."""
    run_id = materialize(instance, "frames__emb_a100", "frames__emb_l4", "frames__words", job=job)
    run = instance.get_run_by_id(run_id)
    assert run.tags["gpufn/placement"] == "per-step" and "gpufn/gpu-class" not in run.tags
    pod, node = job_pod(cluster, namespace, run_id)
    assert node.metadata.labels["gpufn.dev/pool"] == "cpu" and not pod.spec.containers[0].resources.limits
    return run


def test_gpufn_executor_runs_a_run_mixing_classes_per_step_and_says_why(cluster, namespace, instance):
    # build_definitions' default executor: Materialize all over two classes and a CPU Function runs.
    run = mixed_run_on_a_cpu_worker(cluster, namespace, instance, job="auto")
    events = [e.message for e in instance.all_logs(run.run_id) if e.is_dagster_event and e.message]
    assert any("GPU placement per step (the run mixes GPU classes a100-80gb, l4, which one worker pod cannot serve)"
               in m for m in events), events
    # In the run worker, the executor sends a run placed per step to k8s_job_executor.
    from gpufn_dagster.assets.executor import placed_per_step, step_pods_config

    assert placed_per_step(run.tags)
    config = step_pods_config({"retries": {"enabled": {}}, "max_concurrent": 3,
                               "gpu_step_pods": {"job_image": "my/image:1"}})
    assert config["job_image"] == "my/image:1" and config["max_concurrent"] == 3
    with pytest.raises(dg.DagsterInvalidConfigError, match="execution.config.gpu_step_pods"):
        step_pods_config({"retries": {"enabled": {}}, "gpu_step_pods": {"job_imag": "typo"}})


def test_gpufn_executor_keeps_a_one_class_run_on_its_gpu_worker(cluster, namespace, instance):
    run_id = materialize(instance, "frames__emb_l4", "frames__words", job="auto")
    run = instance.get_run_by_id(run_id)
    assert run.tags["gpufn/placement"] == "gpu" and run.tags["gpufn/gpu-class"] == "l4"
    pod, node = job_pod(cluster, namespace, run_id)
    assert node.metadata.labels["gpufn.dev/pool"] == "l4" and pod.spec.containers[0].resources.limits["nvidia.com/gpu"] == "1"
    from gpufn_dagster.assets.executor import placed_per_step

    assert not placed_per_step(run.tags)


def test_a_job_on_k8s_job_executor_with_gpu_steps_is_refused_saying_to_use_gpufns_executor(cluster, namespace,
                                                                                            instance):
    # Its step pods would be built from op tags alone, with no class placement.
    run_id = materialize(instance, "frames__emb_a100", "frames__emb_l4", "frames__words", job="per_step")
    run = instance.get_run_by_id(run_id)
    assert run.status.value == "FAILURE" and run.tags["gpufn/placement"] == "rejected"
    text = _launch_error_text(instance, run_id)
    assert "k8s_job_executor, which would build its GPU steps' pods from op tags alone" in text, text
    assert "executor_def=gpu_classes_executor" in text
    assert jobs(cluster, namespace) == []


def step_pod(cluster, namespace: str, job_name: str):
    """The pod of a step's Job, once scheduled, and its node."""
    core = kubernetes.client.CoreV1Api(cluster.api_client())
    name = wait_for(lambda: core.list_namespaced_pod(namespace, label_selector=f"step={job_name}").items,
                    what=f"{job_name} pod")[0].metadata.name
    node_name = wait_for(lambda: core.read_namespaced_pod(name, namespace).spec.node_name, what=f"{job_name} scheduled")
    return core.read_namespaced_pod(name, namespace), core.read_node(node_name)


def test_each_gpu_step_pod_of_a_run_placed_per_step_lands_on_its_own_class(cluster, namespace, instance):
    # Two classes in one run are fine when each step has its own pod; the run worker is a CPU pod.
    run = mixed_run_on_a_cpu_worker(cluster, namespace, instance, job="auto")
    handler = step_handler(cluster, namespace, instance, run)
    plan = instance.get_execution_plan_snapshot(run.execution_plan_snapshot_id)
    expected = {"frames__emb_a100": ("a100-80gb", "2"), "frames__emb_l4": ("l4", "1"), "frames__words": ("cpu", None)}
    for step in plan.steps:
        job_name = f"step-{step.key.replace('_', '-')}"
        create_step_job(cluster, namespace, instance, run, handler, step.key, step.tags, job_name)
        pod, node = step_pod(cluster, namespace, job_name)
        pool, gpus = expected[step.key]
        assert node.metadata.labels["gpufn.dev/pool"] == pool, step.key
        assert (pod.spec.containers[0].resources.limits or {}).get("nvidia.com/gpu") == gpus, step.key
        assert [source.secret_ref.name for source in pod.spec.containers[0].env_from or []] == ["gpufn-object-store"]
    (said,) = [e.dagster_event for e in instance.all_logs(run.run_id) if e.is_dagster_event and
               "each GPU step's pod goes to its class's node pool as decided now, at launch" in (e.message or "")]
    decided = {k: v.value for k, v in said.event_specific_data.metadata.items() if k.startswith("Step pods")}
    assert decided == {"Step pods a100-80gb x2": "2 x nvidia.com/gpu on GPU class 'a100-80gb'",
                       "Step pods l4 x1": "1 x nvidia.com/gpu on GPU class 'l4'"}, decided


def test_each_shard_of_a_fanned_out_refresh_gets_a_step_pod_on_its_class(cluster, namespace, instance):
    run = fanned_out_run(cluster, namespace, instance)
    events = [e.message for e in instance.all_logs(run.run_id) if e.is_dagster_event and e.message]
    assert any("spreads the refresh of frames__emb_wide over several GPU workers" in m for m in events), events
    core = kubernetes.client.CoreV1Api(cluster.api_client())
    for name in shard_step_pods(cluster, namespace, instance, run, range(4)):
        node_name = wait_for(lambda p=name: core.read_namespaced_pod(p, namespace).spec.node_name,
                             what=f"{name} scheduled")
        assert core.read_node(node_name).metadata.labels["gpufn.dev/pool"] == "l4", name
        spec = core.read_namespaced_pod(name, namespace).spec
        assert spec.containers[0].resources.limits["nvidia.com/gpu"] == "1", name
        assert spec.node_selector["cloud.google.com/gke-accelerator"] == "nvidia-l4", name


def _launch_error_text(instance, run_id: str) -> str:
    """The messages of the run's errors and their causes, as written (not as a repr escapes them)."""
    texts = []
    for entry in instance.all_logs(run_id):
        error = getattr(getattr(entry.dagster_event, "event_specific_data", None), "error", None)
        while error is not None:
            texts.append(f"{error.cls_name}: {error.message}")
            error = error.cause
    return "\n".join(texts)


def test_api_errors_keep_dagster_k8s_exceptions_for_cpu_runs_and_are_explained_for_gpu_runs(
        cluster, classes_dir):
    """A namespace that does not exist: the API answers 404. A CPU run fails as K8sRunLauncher's would;
    a GPU run says the API answered and what 404 means, with the host of the launcher's own client."""
    config = launcher_config(cluster, "no-such-namespace", classes_dir)
    overrides = {"run_launcher": config,
                 "run_coordinator": {"module": "dagster._core.run_coordinator", "class": "DefaultRunCoordinator"}}
    host = cluster.api_client().configuration.host
    with instance_for_test(overrides=overrides) as instance:
        gpu_text = _launch_error_text(instance, materialize(instance, "frames__emb_l4"))
        assert "KubernetesRejected" in gpu_text and "KubernetesUnavailable" not in gpu_text
        assert f"the Kubernetes API at {host} (namespace 'no-such-namespace') answered 404: the namespace " \
               "'no-such-namespace' does not exist" in gpu_text
        assert "Re-executing the run will not help" in gpu_text
        cpu_text = _launch_error_text(instance, materialize(instance, "frames__words"))
        assert "KubernetesUnavailable" not in cpu_text and "KubernetesRejected" not in cpu_text
        assert "DagsterK8sUnrecoverableAPIError" in cpu_text or "ApiException" in cpu_text


def test_the_launcher_takes_k8s_run_launchers_positional_arguments(cluster):
    from gpufn_dagster import GpuK8sRunLauncher

    launcher = GpuK8sRunLauncher("default", "dagster-instance", load_incluster_config=False,
                                 kubeconfig_file=str(cluster.kubeconfig), dagster_home="/opt/dagster",
                                 job_image="img", classes_dir="/opt/classes")
    assert launcher._service_account_name == "default" and launcher.instance_config_map == "dagster-instance"
    assert launcher.classes_dir == "/opt/classes"


def test_kubernetes_api_down_fails_the_run_with_a_clear_reason(tmp_path, classes_dir):
    """A kubeconfig whose API server does not answer: the run fails saying so, nothing half-made."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    config = launcher_at(tmp_path, f"https://127.0.0.1:{port}", classes_dir)
    overrides = {"run_launcher": config,
                 "run_coordinator": {"module": "dagster._core.run_coordinator", "class": "DefaultRunCoordinator"}}
    with instance_for_test(overrides=overrides) as instance:
        run_id = materialize(instance, "frames__emb_l4")
        run = instance.get_run_by_id(run_id)
        assert run.status.value == "FAILURE"
        text = " ".join(str(e.dagster_event.event_specific_data) for e in instance.all_logs(run_id) if e.is_dagster_event)
        assert "KubernetesUnavailable" in text and f"the Kubernetes API at https://127.0.0.1:{port}" in text
        assert "did not answer" in text and "re-execute the run once the API answers" in text


def test_a_class_file_edited_after_the_code_loaded_governs_the_next_runs_step_pods(cluster, namespace, instance,
                                                                                   classes_dir):
    core = kubernetes.client.CoreV1Api(cluster.api_client())
    first = fanned_out_run(cluster, namespace, instance)  # the code location is loaded from here on
    (before,) = shard_step_pods(cluster, namespace, instance, first, range(1))
    assert core.read_namespaced_pod(before, namespace).spec.containers[0].resources.limits["memory"] == "16Gi"
    l4 = classes_dir / "l4.yaml"
    l4.write_text(l4.read_text().replace("memory: 16Gi", "memory: 8Gi").replace('cpu: "4"', 'cpu: "3"'))
    second = fanned_out_run(cluster, namespace, instance)
    (after,) = shard_step_pods(cluster, namespace, instance, second, range(1))
    resources = core.read_namespaced_pod(after, namespace).spec.containers[0].resources
    assert resources.limits["memory"] == "8Gi" and resources.requests["cpu"] == "3"
    assert resources.limits["nvidia.com/gpu"] == "1"


def _step_pod_config_refusal(cluster, namespace, instance, run_config: dict) -> str:
    """Launch the fanned-out Function with this run config; the text its refusal says."""
    run_id = materialize(instance, "frames__emb_wide", job="fanned", run_config=run_config)
    run = instance.get_run_by_id(run_id)
    assert run.status.value == "FAILURE" and run.tags["gpufn/placement"] == "rejected", run.tags
    assert jobs(cluster, namespace) == []  # refused before any Job existed
    return _launch_error_text(instance, run_id)


@pytest.mark.parametrize("section", ["containers", "init_containers"])
def test_step_pod_config_cannot_add_gpus_through_other_containers_same_message_as_a_run_pod(
        cluster, namespace, instance, section):
    greedy = {"pod_spec_config": {section: [{"name": "greedy", "image": "busybox",
                                             "resources": {"limits": {"nvidia.com/gpu": "3"}}}]}}
    kind = "init container" if section == "init_containers" else "container"
    refusal = f"{kind} 'greedy' asks for nvidia.com/gpu=3; {GIVES_L4}"
    # In the run config, for every step pod or for the shard op: refused at launch.
    for step_pods in ({"step_k8s_config": greedy}, {"per_step_k8s_config": {"frames__emb_wide_shard": greedy}}):
        text = _step_pod_config_refusal(cluster, namespace, instance,
                                        {"execution": {"config": {"gpu_step_pods": step_pods}}})
        assert refusal in text, text
    # From a layer the launcher does not see (the executor's own step config): refused when the
    # step pod is built, with the same words, and no Job is made for it.
    run = fanned_out_run(cluster, namespace, instance)
    with pytest.raises(PlacementError, match=re.escape(refusal)):
        shard_step_pods(cluster, namespace, instance, run, range(1), step_k8s_config=greedy)
    assert [j.metadata.name for j in jobs(cluster, namespace) if "shard" in j.metadata.name] == []


def test_step_pod_config_cannot_move_or_widen_a_gpu_step_pod(cluster, namespace, instance):
    widening = {
        "container_config": {"resources": {"limits": {"nvidia.com/gpu": "4", "amd.com/gpu": "1"}}},
        "pod_spec_config": {"node_name": "a100-80gb-0", "node_selector": {"cloud.google.com/gke-accelerator": "other"},
                            "affinity": {"node_affinity": {"required_during_scheduling_ignored_during_execution": {
                                "node_selector_terms": [{"match_expressions": [
                                    {"key": "gpufn.dev/pool", "operator": "In", "values": ["l4"]}]}]}}}},
    }
    run = fanned_out_run(cluster, namespace, instance)
    core = kubernetes.client.CoreV1Api(cluster.api_client())
    (name,) = shard_step_pods(cluster, namespace, instance, run, range(1), step_k8s_config=widening)
    pod = core.read_namespaced_pod(name, namespace)
    limits = pod.spec.containers[0].resources.limits
    assert limits["nvidia.com/gpu"] == "1" and "amd.com/gpu" not in limits  # the class's resource and count
    assert pod.spec.node_selector["cloud.google.com/gke-accelerator"] == "nvidia-l4"  # the class's value
    node = wait_for(lambda: core.read_namespaced_pod(name, namespace).spec.node_name, what="shard scheduled")
    assert node.startswith("l4-"), node  # not pinned to the a100 node it named
