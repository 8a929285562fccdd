"""GPU classes on Dynamic Resource Allocation, on the real control plane: the real scheduler allocates
the devices a test driver publishes in ResourceSlices (as NVIDIA's DRA driver would: product name,
memory, index) on KWOK nodes -- an H100 node, an A100 node, a decoy node of A10s and a node of one
H100 beside one A10. A DRA class's run pod claims its devices through a template its Job owns, lands
where they are, waits (never fails, never moves) while they are taken and starts when a claim is
released; a choice of DRA classes is one claim whose firstAvailable falls to the second class; a
request no node's devices can meet never fits; a selector the apiserver refuses stops the launch."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import kubernetes
import pytest
import yaml
from dagster import DagsterInstance, DagsterRunStatus
from dagster._core.test_utils import instance_for_test

from gpufn_dagster.class_files import load_gpu_classes
from gpufn_dagster.classes import GpuClass
from gpufn_dagster.run.k8s.watch import CapacityWatcher
from gpufn_dagster.run.kueue import kueue_manifests
from gpufn_dagster.tags import CAPACITY_TAG, GOT_CLASS_TAG, GPU_CLASS_TAG
from gpufn_devcluster.cluster import binaries_dir, dra_binaries_dir
from gpufn_devcluster.kueue import KUEUE_NAMESPACE_LABEL, Kueue, apply_objects
from gpufn_devcluster.nodes import device_class, gpu_devices, gpu_nodes, resource_slice
from gpufn_devcluster.realnode import REAL_NODE_LABEL, WORKER_IMAGE, DraDriver, RealNode, host_mounts, missing_runtime

from ..conftest import REPO, wait_for
from ..helpers import (class_gauges, event_metadata, launcher_config, materialize, run_pod, shard_step_pods,
                       unschedulable)

pytestmark = pytest.mark.k8s

DEFS = Path(__file__).with_name("dra_defs.py")
DRIVER = "gpu.example.com"
H100, A100, A10 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA A10"
TAINT = {"key": "gpufn.dev/dra", "operator": "Exists", "effect": "NoSchedule"}
# The nodes' pool: every DRA node carries its label and taint (so no other test's pod lands there).
POOL = GpuClass(name="dra", gpu_model="mixed", gpu_memory="80GiB", max_gpu_count_per_worker=2,
                node_selector={"gpufn.dev/dra": "true"}, tolerations=[TAINT], dra={"device_class": DRIVER})
# The real node's pool: its own label and taint, so no KWOK-node test's pod lands there.
REAL_CLASS = {"name": "dra-real", "gpu_model": H100, "gpu_memory": "80GiB", "max_gpu_count_per_worker": 2,
              "cpu": "100m", "memory": "256Mi", "node_selector": {"gpufn.dev/real-dra": "true"},
              "tolerations": [{"key": "gpufn.dev/real-dra", "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
              "dra": {"device_class": DRIVER, "selectors": [f'device.attributes["{DRIVER}"].productName == "{H100}"']}}
DEVICES = {"dra-0": [(H100, 2)], "dra-1": [(A100, 2)], "dra-2": [(A10, 2)], "dra-3": [(H100, 1), (A10, 1)]}


def class_file(name: str, product: str, **extra) -> dict:
    return {"name": name, "gpu_model": product, "gpu_memory": "80GiB", "max_gpu_count_per_worker": 2,
            "node_selector": dict(POOL.node_selector), "tolerations": [TAINT],
            "dra": {"device_class": DRIVER,
                    "selectors": [f'device.attributes["{DRIVER}"].productName == "{product}"'], **extra}}


@pytest.fixture(scope="module")
def dra_pools(cluster) -> Iterator[None]:
    """The DeviceClass, the DRA nodes and the ResourceSlices their driver publishes; all removed after."""
    client = cluster.api_client()
    resource, core = kubernetes.client.ResourceV1Api(client), kubernetes.client.CoreV1Api(client)
    resource.create_device_class(device_class(DRIVER, DRIVER))
    nodes = cluster.add_nodes(gpu_nodes(POOL, len(DEVICES)))
    assert nodes == sorted(DEVICES)
    for node, kinds in DEVICES.items():
        devices, start = [], 0
        for product, count in kinds:
            devices += gpu_devices(product, "80Gi", count, start=start)
            start += count
        resource.create_resource_slice(resource_slice(node, DRIVER, devices))
    yield
    for node in nodes:
        resource.delete_resource_slice(f"{node}-{DRIVER.replace('.', '-')}")
        core.delete_node(node)
    resource.delete_device_class(DRIVER)


@pytest.fixture
def dra_classes(classes_dir, dra_pools, monkeypatch) -> Path:
    """The shipped classes plus two DRA classes on the DRA nodes, as the code location loads them too."""
    for name, product in (("dra-h100", H100), ("dra-a100", A100), ("dra-queued", H100)):
        (classes_dir / f"{name}.yaml").write_text(yaml.safe_dump(class_file(name, product)))
    (classes_dir / "dra-real.yaml").write_text(yaml.safe_dump(REAL_CLASS))
    monkeypatch.setenv("GPUFN_CLASSES_DIR", str(classes_dir))
    return classes_dir


@pytest.fixture
def instance(cluster, namespace, dra_classes) -> Iterator[DagsterInstance]:
    overrides = {"run_launcher": launcher_config(cluster, namespace, dra_classes),
                 "run_coordinator": {"module": "dagster._core.run_coordinator", "class": "DefaultRunCoordinator"},
                 "run_monitoring": {"enabled": True, "start_timeout_seconds": 0}}
    with instance_for_test(overrides=overrides) as instance:
        yield instance


@pytest.fixture
def watcher(cluster, instance, namespace, dra_classes) -> CapacityWatcher:
    client = cluster.api_client()
    return CapacityWatcher(instance, kubernetes.client.CoreV1Api(client), kubernetes.client.BatchV1Api(client),
                           load_gpu_classes(dra_classes), namespace)


def resource_api(cluster):
    return kubernetes.client.ResourceV1Api(cluster.api_client())


def claim_of(cluster, namespace: str, pod) -> dict:
    """The pod's allocated claim, as the API sends it."""
    name = wait_for(lambda: next((s.resource_claim_name for s in (
        kubernetes.client.CoreV1Api(cluster.api_client()).read_namespaced_pod(pod.metadata.name, namespace)
        .status.resource_claim_statuses or []) if s.resource_claim_name), None), what="claim made")
    read = resource_api(cluster).read_namespaced_resource_claim
    return wait_for(lambda: (c := json.loads(read(name, namespace, _preload_content=False).data))["status"].get(
        "allocation") and c, what="claim allocated")


def placed(core, namespace: str, run_id: str):
    return wait_for(lambda: (p := run_pod(core, namespace, run_id)).spec.node_name and p, timeout=120, what="placed")


def test_a_dra_run_pod_claims_its_devices_through_a_template_its_job_owns_and_lands_where_they_are(
        cluster, core, namespace, instance, watcher):
    run_id = materialize(instance, "frames__emb_h100", defs=DEFS)
    pod = placed(core, namespace, run_id)
    assert pod.spec.node_name == "dra-0"  # the one node with 2 H100s; not the decoy, not the A100 node
    (claim_ref,) = pod.spec.resource_claims
    container = pod.spec.containers[0]
    assert [c.name for c in container.resources.claims] == [claim_ref.name]
    assert not any("gpu" in k for k in (container.resources.limits or {}))  # no extended resource at all
    template = json.loads(resource_api(cluster).read_namespaced_resource_claim_template(
        claim_ref.resource_claim_template_name, namespace, _preload_content=False).data)
    (owner,) = template["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("Job", f"dagster-run-{run_id}")  # deleted with the run's Job
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert (request["exactly"]["deviceClassName"], request["exactly"]["count"]) == (DRIVER, 2)
    results = claim_of(cluster, namespace, pod)["status"]["allocation"]["devices"]["results"]
    assert sorted((r["pool"], r["device"]) for r in results) == [("dra-0", "gpu-0"), ("dra-0", "gpu-1")]

    watcher.tick()
    assert instance.get_run_by_id(run_id).tags[CAPACITY_TAG] == "scheduled"
    # The class's GPUs from the ResourceSlices: 2 on dra-0 and the 1 H100 of dra-3; the decoys count nothing.
    assert class_gauges(instance, "dra-h100") == ("gpu", 3, 2, 0, 0)
    assert class_gauges(instance, "dra-a100")[1] == 2


def test_run_tags_cannot_widen_a_dra_claim(cluster, core, namespace, instance):
    more = {"pod_spec_config": {"resource_claims": [{"name": "more", "resource_claim_template_name": "eight-gpus"}]}}
    refused = materialize(instance, "frames__emb_h100", defs=DEFS, tags={"dagster-k8s/config": json.dumps(more)})
    run = instance.get_run_by_id(refused)
    assert run.status == DagsterRunStatus.FAILURE and run.tags["gpufn/placement"] == "rejected"
    assert not kubernetes.client.BatchV1Api(cluster.api_client()).list_namespaced_job(
        namespace, label_selector=f"dagster/run-id={refused}").items
    # Extended GPUs, another claim for its container and another class, in tags: the class's claim alone stands.
    sneaky = {"container_config": {"resources": {"limits": {"nvidia.com/gpu": "8"},
                                                 "claims": [{"name": "gpu"}, {"name": "more"}]}}}
    run_id = materialize(instance, "frames__emb_h100", defs=DEFS,
                         tags={"dagster-k8s/config": json.dumps(sneaky), "gpufn/gpu-class": "dra-a100"})
    pod = placed(core, namespace, run_id)
    container = pod.spec.containers[0]
    assert [c.name for c in container.resources.claims] == ["gpu"]
    assert "nvidia.com/gpu" not in (container.resources.limits or {})
    (claim_ref,) = pod.spec.resource_claims
    template = json.loads(resource_api(cluster).read_namespaced_resource_claim_template(
        claim_ref.resource_claim_template_name, namespace, _preload_content=False).data)
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["count"] == 2 and H100 in request["exactly"]["selectors"][0]["cel"]["expression"]
    assert pod.spec.node_name == "dra-0" and instance.get_run_by_id(run_id).tags[GPU_CLASS_TAG] == "dra-h100"


def test_a_dra_run_waits_while_its_devices_are_claimed_and_starts_when_a_claim_is_released(
        cluster, core, namespace, instance, watcher):
    first = materialize(instance, "frames__emb_h100", defs=DEFS)
    assert placed(core, namespace, first).spec.node_name == "dra-0"
    second = materialize(instance, "frames__emb_h100", defs=DEFS)  # dra-3 has 1 H100: no node has 2 free
    wait_for(lambda: unschedulable(core, namespace, second), what="Unschedulable")
    watcher.tick()
    run = instance.get_run_by_id(second)
    assert run.status == DagsterRunStatus.STARTING and run.tags[CAPACITY_TAG] == "waiting"  # never failed or moved
    (event,) = [m for m in event_metadata(instance, second) if "Requested" in m]
    assert (event["GPU class"], event["Requested"]) == ("dra-h100", f"2 x DRA device class {DRIVER}")
    assert "cannot allocate all claims" in event["Scheduler message"], event  # the allocator's own words
    assert class_gauges(instance, "dra-h100")[3:] == (1, 1)

    first_pod = run_pod(core, namespace, first)
    core.patch_namespaced_pod(first_pod.metadata.name, namespace,
                              {"metadata": {"labels": {"gpufn.dev/fake-outcome": "succeed"}}})
    assert placed(core, namespace, second).spec.node_name == "dra-0"
    watcher.tick()
    assert instance.get_run_by_id(second).tags[CAPACITY_TAG] == "scheduled"


def test_a_choice_of_dra_classes_is_one_claim_whose_first_available_falls_to_the_second_class(
        cluster, core, namespace, instance, watcher):
    holder = materialize(instance, "frames__emb_h100", defs=DEFS)  # takes dra-0's two H100s
    assert placed(core, namespace, holder).spec.node_name == "dra-0"
    run_id = materialize(instance, "frames__emb_any", defs=DEFS)  # dra-h100, else dra-a100
    pod = placed(core, namespace, run_id)
    assert pod.spec.node_name == "dra-1"
    (claim_ref,) = pod.spec.resource_claims
    template = json.loads(resource_api(cluster).read_namespaced_resource_claim_template(
        claim_ref.resource_claim_template_name, namespace, _preload_content=False).data)
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert [s["name"] for s in request["firstAvailable"]] == ["dra-h100", "dra-a100"]  # the Function's order
    (result, _) = claim_of(cluster, namespace, pod)["status"]["allocation"]["devices"]["results"]
    assert result["request"] == "gpu/dra-a100"
    assert instance.get_run_by_id(run_id).tags[GPU_CLASS_TAG] == "dra-h100|dra-a100"
    watcher.tick()
    assert instance.get_run_by_id(run_id).tags[GOT_CLASS_TAG] == "dra-a100"  # read from the allocation
    (got,) = [m for m in event_metadata(instance, run_id) if "GPU class got" in m]
    assert (got["GPU class got"], got["Node"]) == ("dra-a100", "dra-1")


def test_a_dra_request_no_node_publishes_devices_for_never_fits(core, namespace, instance, watcher, dra_classes):
    spec = class_file("dra-h100", "NVIDIA B200")  # no driver publishes a B200 here
    (dra_classes / "dra-h100.yaml").write_text(yaml.safe_dump(spec))
    watcher.classes = load_gpu_classes(dra_classes)
    run_id = materialize(instance, "frames__emb_h100", defs=DEFS)
    wait_for(lambda: unschedulable(core, namespace, run_id), what="Unschedulable")
    watcher.tick()
    run = instance.get_run_by_id(run_id)
    assert run.status == DagsterRunStatus.FAILURE and run.tags[CAPACITY_TAG] == "never-fits"


def test_a_selector_the_apiserver_refuses_stops_the_launch_before_any_job(cluster, namespace, instance, dra_classes):
    # It parses (so the class loads), but names a field the DRA CEL environment does not have.
    spec = class_file("dra-h100", H100)
    spec["dra"]["selectors"] = [f'device.atributes["{DRIVER}"].productName == "{H100}"']
    (dra_classes / "dra-h100.yaml").write_text(yaml.safe_dump(spec))
    run_id = materialize(instance, "frames__emb_h100", defs=DEFS)
    wait_for(lambda: instance.get_run_by_id(run_id).status == DagsterRunStatus.FAILURE, what="launch failed")
    said = "\n".join(e.message or "" for e in instance.all_logs(run_id))
    assert "undefined field 'atributes'" in said, said[-2000:]
    batch = kubernetes.client.BatchV1Api(cluster.api_client())
    assert not batch.list_namespaced_job(namespace, label_selector=f"dagster/run-id={run_id}").items
    assert not resource_api(cluster).list_namespaced_resource_claim_template(namespace).items


def test_the_shard_pods_of_a_dra_refresh_each_claim_a_device(cluster, core, namespace, instance, watcher):
    run_id = materialize(instance, "frames__emb_wide", job="fanned", defs=DEFS)
    run = instance.get_run_by_id(run_id)
    assert run.tags["gpufn/placement"] == "per-step"
    templates = resource_api(cluster).list_namespaced_resource_claim_template(namespace).items
    assert [t.metadata.owner_references[0].name for t in templates] == [f"dagster-run-{run_id}"]
    names = shard_step_pods(cluster, namespace, instance, run, range(3), defs=DEFS)
    nodes = [wait_for(lambda p=name: core.read_namespaced_pod(p, namespace).spec.node_name, what=f"{name} placed")
             for name in names]
    assert sorted(nodes) == ["dra-0", "dra-0", "dra-3"]  # the three H100s, one claim each
    for name in names:
        pod = core.read_namespaced_pod(name, namespace)
        assert pod.spec.resource_claims[0].resource_claim_template_name == templates[0].metadata.name
        assert not any("gpu" in k for k in (pod.spec.containers[0].resources.limits or {}))


# (verb, API group, resource) of every call the launcher and the watcher make for DRA classes and waits.
CALLS = [("create", "resource.k8s.io", "resourceclaimtemplates"), ("patch", "resource.k8s.io", "resourceclaimtemplates"),
         ("delete", "resource.k8s.io", "resourceclaimtemplates"), ("get", "resource.k8s.io", "resourceclaims"),
         ("list", "resource.k8s.io", "resourceslices"), ("list", "resource.k8s.io", "deviceclasses"),
         ("list", "", "nodes"), ("get", "batch", "jobs"), ("delete", "batch", "jobs"), ("patch", "", "pods"),
         ("list", "", "events"),
         # The capacity sensor's kept lists: each listed once, then watched.
         ("list", "", "pods"), ("watch", "", "pods"), ("list", "batch", "jobs"), ("watch", "batch", "jobs"),
         ("watch", "", "events"), ("watch", "", "nodes")]


def test_the_shipped_rbac_lets_dagsters_service_account_make_every_dra_call(cluster, core, namespace):
    text = (REPO / "deploy" / "rbac.yaml").read_text().replace("namespace: dagster", f"namespace: {namespace}")
    client = cluster.api_client()
    rbac = kubernetes.client.RbacAuthorizationV1Api(client)
    documents = list(yaml.safe_load_all(text))
    suffix = namespace  # cluster-wide names made unique per test
    for document in documents:
        kind = document["kind"]
        if kind.startswith("Cluster"):
            document["metadata"]["name"] += f"-{suffix}"
            if kind == "ClusterRoleBinding":
                document["roleRef"]["name"] += f"-{suffix}"
        getattr(rbac, {"ClusterRole": "create_cluster_role", "ClusterRoleBinding": "create_cluster_role_binding",
                       "Role": "create_namespaced_role", "RoleBinding": "create_namespaced_role_binding"}[kind])(
            *([namespace] if not kind.startswith("Cluster") else []), document)
    authorization = kubernetes.client.AuthorizationV1Api(client)
    try:
        def allowed(verb: str, group: str, resource: str) -> bool:
            review = authorization.create_subject_access_review({
                "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                "spec": {"user": f"system:serviceaccount:{namespace}:dagster",
                         "resourceAttributes": {"verb": verb, "group": group, "resource": resource,
                                                "namespace": namespace}}})
            return review.status.allowed

        assert [call for call in CALLS if not wait_for(lambda c=call: allowed(*c), timeout=10, what=str(call))] == []
        assert not allowed("create", "resource.k8s.io", "resourceslices")  # publishing devices is the driver's
    finally:
        for document in documents:
            if document["kind"] == "ClusterRole":
                rbac.delete_cluster_role(document["metadata"]["name"])
            elif document["kind"] == "ClusterRoleBinding":
                rbac.delete_cluster_role_binding(document["metadata"]["name"])


QUOTA = "example.com/gpu"  # what Kueue's deviceClassMappings count the driver's devices as


@pytest.fixture(scope="module")
def kueue(cluster, dra_pools) -> Iterator[Kueue]:
    with Kueue(binaries_dir(), cluster, device_class_mappings={QUOTA: [DRIVER]}) as running:
        yield running


def test_kueue_admits_a_dra_class_by_its_device_quota_and_the_next_run_waits_with_kueues_words(
        cluster, core, namespace, kueue, dra_classes, instance):
    spec = {**class_file("dra-queued", H100), "kueue": {"local_queue": "gpu-dra", "device_resource": QUOTA}}
    (dra_classes / "dra-queued.yaml").write_text(yaml.safe_dump(spec))
    classes = load_gpu_classes(dra_classes)
    core.patch_namespace(namespace, {"metadata": {"labels": {KUEUE_NAMESPACE_LABEL: "true"}}})
    queue = f"gpufn-dra-{uuid.uuid4().hex[:6]}"
    objects = kueue_manifests([classes["dra-queued"]], {"dra-queued": 2}, namespace)  # 2 GPUs: 2 x count_per_gpu devices
    for body in objects:
        if body["kind"] == "ClusterQueue":
            body["metadata"]["name"] = body["spec"]["cohortName"] = queue
            (group,) = body["spec"]["resourceGroups"]
            assert {"name": QUOTA, "nominalQuota": "2"} in group["flavors"][0]["resources"]
        elif body["kind"] == "LocalQueue":
            body["spec"]["clusterQueue"] = queue
        try:
            apply_objects(cluster, [body])
        except kubernetes.client.ApiException as err:
            if err.status != 409:  # the flavor is cluster-wide
                raise
    custom = kubernetes.client.CustomObjectsApi(cluster.api_client())
    watcher = CapacityWatcher(instance, core, kubernetes.client.BatchV1Api(cluster.api_client()), classes, namespace)

    def quota_reserved(run_id: str, status: str):
        items = custom.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", namespace, "workloads")["items"]
        workload = next((w for w in items if any(o["name"] == f"dagster-run-{run_id}"
                                                 for o in w["metadata"].get("ownerReferences", []))), None)
        return next((c for c in ((workload or {}).get("status") or {}).get("conditions") or []
                     if c["type"] == "QuotaReserved" and c["status"] == status), None)

    try:
        first = materialize(instance, "frames__emb_queued", defs=DEFS)
        wait_for(lambda: quota_reserved(first, "True"), timeout=60, what="Kueue admits the first run")
        assert placed(core, namespace, first).spec.node_name == "dra-0"  # its claim's devices, where they are
        second = materialize(instance, "frames__emb_queued", defs=DEFS)
        said = wait_for(lambda: quota_reserved(second, "False"), timeout=60, what="Kueue holds the second run")
        assert f"insufficient unused quota for {QUOTA} in flavor dra-queued" in said["message"], said  # devices counted
        watcher.tick()
        run = instance.get_run_by_id(second)
        assert run.status == DagsterRunStatus.STARTING and run.tags[CAPACITY_TAG] == "waiting"
        assert not core.list_namespaced_pod(namespace, label_selector=f"dagster/run-id={second}").items
        wait = next(m for m in event_metadata(instance, second) if "Position" in m)
        assert (wait["ClusterQueue"], wait["GPU class"]) == (queue, "dra-queued") and said["message"] in wait["Kueue message"]
        instance.run_launcher.terminate(first)  # its Job goes, and with it the quota (and the claim) it held
        wait_for(lambda: quota_reserved(second, "True"), timeout=90, what="Kueue admits the second run")
        assert placed(core, namespace, second).spec.node_name == "dra-0"
        watcher.tick()
        assert instance.get_run_by_id(second).tags[CAPACITY_TAG] == "scheduled"
    finally:
        custom.delete_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "clusterqueues", queue)


@pytest.fixture(scope="module")
def real_dra_node(cluster, dra_pools) -> Iterator[RealNode]:
    """A real kubelet node whose 2 GPUs the suite's DRA driver (a real kubelet plugin) publishes and prepares."""
    why = missing_runtime()
    if why:
        pytest.skip(f"no real node on this machine: {why}")
    with RealNode(binaries_dir(), cluster, GpuClass(**REAL_CLASS), gpus=2, name="real-dra-0",
                  dra=DraDriver(dra_binaries_dir(), DRIVER, H100)) as node:
        yield node


def test_a_shard_pod_on_a_real_node_sees_the_device_a_real_dra_driver_prepared_for_its_claim(
        real_dra_node, cluster, core, namespace, instance):
    run_id = materialize(instance, "frames__emb_real", job="fanned_real", defs=DEFS)
    run = instance.get_run_by_id(run_id)
    mounts = host_mounts()
    # The launcher's pods read the object store's settings from this Secret (none are needed here).
    core.create_namespaced_secret(namespace, {"metadata": {"name": "gpufn-object-store"}, "string_data": {}})
    # The shard's pod as gpufn's step handler builds it (the claim, the class's placement), plus what a pod
    # of this machine needs (the local image, the host's directories, its network); its command says
    # which GPU devices the container was given.
    (name,) = shard_step_pods(cluster, namespace, instance, run, range(1), defs=DEFS, step_k8s_config={
        "container_config": {"image": WORKER_IMAGE, "image_pull_policy": "Never",
                             "command": ["/bin/sh", "-c", "env | grep ^GPU_DEVICE_ | sort; exec sleep 600"],
                             "volume_mounts": [{"name": f"host{i}", "mount_path": p} for i, p in enumerate(mounts)]},
        "pod_spec_config": {"host_network": True, "node_selector": {REAL_NODE_LABEL: "true"},
                            "volumes": [{"name": f"host{i}", "host_path": {"path": p}} for i, p in enumerate(mounts)]}})
    try:  # it says its devices, then holds them (its claim stays allocated) until the namespace goes
        said = wait_for(lambda: "GPU_DEVICE_" in (text := real_dra_node.why_failed(name, namespace)) and text,
                        timeout=120, what="the shard pod said its devices")
    except AssertionError as err:
        pod = core.read_namespaced_pod(name, namespace)
        raise AssertionError(f"{err}: {pod.spec.node_name} {pod.status}\n{real_dra_node.why_failed(name, namespace)}")
    pod = wait_for(lambda: (p := core.read_namespaced_pod(name, namespace)).status.phase == "Running" and p,
                   timeout=60, what="the kubelet reports the pod Running")  # its status may lag its log
    assert pod.spec.node_name == "real-dra-0"
    results = claim_of(cluster, namespace, pod)["status"]["allocation"]["devices"]["results"]
    (device,) = [r["device"] for r in results]  # one device: one GPU of the shard
    assert f"GPU_DEVICE_{device.split('-')[1]}={device}" in said, said  # the container sees its device, only it
    assert said.count("GPU_DEVICE_") == 1, said
