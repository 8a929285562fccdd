"""Dagster deployed as users deploy it on Kubernetes, on the suite's cluster, every process a pod:
the code server (`dagster api grpc`) and the daemon (`dagster-daemon run`: run queue, sensors
including gpu_capacity, run monitoring) run as pods, as Dagster's Helm chart runs them; the
instance is stored in PostgreSQL, the table on SeaweedFS. A fanned-out refresh launched through the
webserver's GraphQL API, as the Launchpad does, runs as run worker pod -> plan pod -> shard pods ->
commit pod, each placed as the launcher decided at launch.

Two real nodes (kubelet + containerd each): a CPU node, untainted, where the code server, the
daemon, the run worker, plan and commit land, and a GPU node of class l4 (its taint, its labels,
its GPU resource) where only the shards, which tolerate it, go. Needs Debian's containerd, runc,
containernetworking-plugins and postgresql (the test command installs them as root).
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import kubernetes
import lancedb
import pyarrow as pa
import pytest
import yaml
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import GrpcServerTarget
from dagster_graphql.client.query import LAUNCH_PIPELINE_EXECUTION_MUTATION
from dagster_graphql.test.utils import execute_dagster_graphql

from gpufn_dagster.classes import load_gpu_classes
from gpufn_dagster.refresh.files import TableFiles
from gpufn_devcluster.cluster import binaries_dir
from gpufn_devcluster.processes import free_port
from gpufn_devcluster.realnode import REAL_NODE_LABEL, WORKER_IMAGE, RealNode, host_mounts, missing_runtime

from ..conftest import wait_for

pytestmark = [pytest.mark.k8s, pytest.mark.s3, pytest.mark.postgres]
DEFS = Path(__file__).with_name("realnode_defs.py")
FRAGMENT_ROWS = 1200  # a shard takes at least 1,024 rows
ROW_SECONDS = 0.02  # each call's time, so a shard can be caught while it computes


@pytest.fixture(scope="module")
def deploy_classes(tmp_path_factory) -> Path:
    """The shipped classes, l4 asking little enough CPU and memory for this machine's one node."""
    from ..conftest import CLASSES

    target = tmp_path_factory.mktemp("deploy-classes")
    for path in CLASSES.glob("*.yaml"):
        text = path.read_text()
        if path.name == "l4.yaml":
            text = text.replace('cpu: "4"', 'cpu: "100m"').replace("memory: 16Gi", "memory: 512Mi")
        (target / path.name).write_text(text)
    return target


@pytest.fixture(scope="module")
def real_node(cluster, deploy_classes):
    """The GPU node: class l4, 2 GPUs."""
    why = missing_runtime()
    if why:
        pytest.skip(f"no real node on this machine: {why}")
    with RealNode(binaries_dir(), cluster, load_gpu_classes(deploy_classes)["l4"], gpus=2, name="real-l4-deploy") as node:
        yield node


@pytest.fixture(scope="module")
def cpu_node(cluster, real_node):
    """The CPU node beside it: no taint, no GPU."""
    with RealNode(binaries_dir(), cluster, None, name="real-cpu-deploy") as node:
        yield node


def host_pod_spec(env: dict[str, str]) -> dict:
    """What every pod of this deployment shares (the launcher's config, so run and step pods get it):
    the worker image running this machine's Python from host mounts, the host's network, and a
    real node (not a KWOK one). No toleration: CPU pods stay off the GPU node; a shard gets its
    class's toleration from its placement."""
    mounts = host_mounts()
    return {
        "env_vars": [f"{k}={v}" for k, v in env.items()],
        "volumes": [{"name": f"host{i}", "host_path": {"path": p}} for i, p in enumerate(mounts)],
        "volume_mounts": [{"name": f"host{i}", "mount_path": p} for i, p in enumerate(mounts)],
        "run_k8s_config": {"pod_spec_config": {"host_network": True, "node_selector": {REAL_NODE_LABEL: "true"}}},
    }


def server_pod(name: str, args: list[str], env: dict[str, str]) -> dict:
    """A pod that runs a Dagster server process (code server, daemon), as the Helm chart's Deployments do."""
    mounts = host_mounts()
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": name}},
            "spec": {"hostNetwork": True, "nodeSelector": {REAL_NODE_LABEL: "true"}, "restartPolicy": "Never",
                     "volumes": [{"name": f"host{i}", "hostPath": {"path": p}} for i, p in enumerate(mounts)],
                     "containers": [{"name": "dagster", "image": WORKER_IMAGE, "imagePullPolicy": "Never",
                                     "command": [sys.executable, *args], "workingDir": str(DEFS.parent),
                                     "env": [{"name": k, "value": v} for k, v in env.items()],
                                     "volumeMounts": [{"name": f"host{i}", "mountPath": p}
                                                      for i, p in enumerate(mounts)]}]}}


@dataclass
class Deployment:
    """What the tests drive: the webserver's side (instance and workspace, as its process has them)
    and where the table and the Function's call log are."""

    instance: dg.DagsterInstance
    context: WorkspaceProcessContext
    namespace: str
    db_uri: str
    log: Path
    node: RealNode  # the GPU node
    cpu_node: RealNode

    def launch(self) -> str:
        """Launch the fanned-out Function as the UI's Materialize does; returns the run id (QUEUED)."""
        result = execute_dagster_graphql(self.context.create_request_context(), LAUNCH_PIPELINE_EXECUTION_MUTATION,
                                         variables={"executionParams": {
                                             "selector": {"repositoryLocationName": "deploy",
                                                          "repositoryName": "__repository__",
                                                          "pipelineName": "__ASSET_JOB",
                                                          "assetSelection": [{"path": ["docs__shout"]}]},
                                             "mode": "default"}})
        launched = result.data["launchPipelineExecution"]
        assert launched["__typename"] == "LaunchRunSuccess", launched
        return launched["run"]["runId"]

    def finished(self, run_id: str, core, timeout: float = 600) -> dg.DagsterRun:
        deadline = time.monotonic() + timeout  # a hang guard only
        while (run := self.instance.get_run_by_id(run_id)).status not in (dg.DagsterRunStatus.SUCCESS,
                                                                            dg.DagsterRunStatus.FAILURE):
            assert time.monotonic() < deadline, _pods_text(core, self.namespace, self.node, self.cpu_node)
            time.sleep(2)
        return run

    def computed(self) -> list[str]:
        """The texts of the rows the Function computed, one line per call, in order."""
        return [line.rsplit("|", 1)[0] for line in self.log.read_text().splitlines()] if self.log.exists() else []

    def table_version(self, storage_options) -> int:
        return TableFiles(f"{self.db_uri}/docs.lance", storage_options).dataset().version


@pytest.fixture(scope="module")
def deployment(real_node, cpu_node, deploy_classes, cluster, object_store, postgres_server,
               tmp_path_factory) -> Iterator[Deployment]:
    """The deployment: PostgreSQL storage, the GPU launcher, the code server and daemon as pods."""
    core = kubernetes.client.CoreV1Api(cluster.api_client())
    namespace = f"deploy-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace}})
    wait_for(lambda: any(sa.metadata.name == "default" for sa in core.list_namespaced_service_account(namespace).items),
             what="default service account")
    work = tmp_path_factory.mktemp("deployment")
    db_uri = object_store.uri(f"deploy-{work.name}")
    log = work / "calls.log"
    # The table exists before the code server loads (a Function on a missing table fails the load);
    # two fragments, so the first refresh spreads over two shards.
    table = lancedb.connect(db_uri, storage_options=object_store.storage_options).create_table(
        "docs", _docs(0, FRAGMENT_ROWS))
    table.add(_docs(FRAGMENT_ROWS, FRAGMENT_ROWS))
    env = {**object_store.environment, "GPUFN_LANCEDB_URI": db_uri, "GPUFN_TEST_LOG": str(log),
           "GPUFN_CLASSES_DIR": str(deploy_classes), "GPUFN_TEST_ROW_SECONDS": str(ROW_SECONDS),
           "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"),
           "PYTHONUNBUFFERED": "1"}
    home = work / "dagster_home"
    home.mkdir()
    instance_yaml = {
        "storage": {"postgres": {"postgres_url": postgres_server.database()}},
        "run_coordinator": {"module": "dagster._core.run_coordinator", "class": "QueuedRunCoordinator"},
        "run_launcher": {"module": "gpufn_dagster.launcher", "class": "GpuK8sRunLauncher", "config": {
            "instance_config_map": "dagster-instance", "service_account_name": "default", "job_namespace": namespace,
            "load_incluster_config": False, "kubeconfig_file": str(cluster.kubeconfig), "job_image": WORKER_IMAGE,
            "image_pull_policy": "Never", "classes_dir": str(deploy_classes), **host_pod_spec(env)}},
        "run_monitoring": {"enabled": True, "start_timeout_seconds": 0, "poll_interval_seconds": 5},
        "telemetry": {"enabled": False},
    }
    (home / "dagster.yaml").write_text(yaml.safe_dump(instance_yaml))
    port = free_port()
    (home / "workspace.yaml").write_text(yaml.safe_dump(
        {"load_from": [{"grpc_server": {"host": "127.0.0.1", "port": port, "location_name": "deploy"}}]}))
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "dagster-instance"},
                                                  "data": {"dagster.yaml": yaml.safe_dump(instance_yaml)}})
    server_env = {**env, "DAGSTER_HOME": str(home)}
    core.create_namespaced_pod(namespace, server_pod("code-server", [
        "-m", "dagster", "api", "grpc", "-h", "127.0.0.1", "-p", str(port), "-f", str(DEFS), "-d", str(DEFS.parent)],
        server_env))
    core.create_namespaced_pod(namespace, server_pod("daemon", [
        "-m", "dagster._daemon", "run", "-w", str(home / "workspace.yaml")], server_env))
    try:
        for name in ("code-server", "daemon"):
            wait_for(lambda n=name: core.read_namespaced_pod(n, namespace).status.phase == "Running", timeout=120,
                     what=f"the {name} pod running")
        with dg.DagsterInstance.from_config(str(home)) as instance, \
                WorkspaceProcessContext(instance, GrpcServerTarget(host="127.0.0.1", port=port, socket=None,
                                                                   location_name="deploy")) as context:
            try:
                wait_for(lambda: _loaded(context), timeout=180, what="the code server answering")
            except AssertionError as err:
                raise AssertionError(f"{err}\n{_pods_text(core, namespace, real_node, cpu_node)}") from None
            for name in ("code-server", "daemon"):
                assert core.read_namespaced_pod(name, namespace).spec.node_name == cpu_node.name
            yield Deployment(instance, context, namespace, db_uri, log, real_node, cpu_node)
    finally:
        core.delete_namespace(namespace, grace_period_seconds=0)
        wait_for(lambda: not core.list_namespaced_pod(namespace).items, timeout=120, what="the deployment's pods gone")


def _docs(start: int, count: int) -> pa.Table:
    return pa.table({"id": list(range(start, start + count)), "text": [f"doc {i}" for i in range(start, start + count)]})


def test_a_fanned_out_refresh_runs_through_a_deployment_of_pods_on_postgres_and_the_next_computes_nothing(
        deployment, core, object_store):
    run = deployment.finished(deployment.launch(), core)
    assert run.status == dg.DagsterRunStatus.SUCCESS, _pods_text(core, deployment.namespace, deployment.node, deployment.cpu_node)
    assert run.tags["gpufn/placement"] == "per-step"
    pods = {p.metadata.name: p for p in core.list_namespaced_pod(deployment.namespace,
                                                                 label_selector=f"dagster/run-id={run.run_id}").items}
    on_gpus = [p for p in pods.values() if (p.spec.containers[0].resources.limits or {}).get("nvidia.com/gpu") == "1"]
    assert len(pods) == 5 and len(on_gpus) == 2, sorted(pods)  # run worker, plan, 2 shards, commit
    assert {p.spec.node_name for p in on_gpus} == {deployment.node.name}  # the shards on the GPU node...
    assert {p.spec.node_name for p in pods.values() if p not in on_gpus} == {deployment.cpu_node.name}  # the rest not
    wait_for(lambda: all(core.read_namespaced_pod(name, deployment.namespace).status.phase == "Succeeded"
                         for name in pods), timeout=120, what="every pod of the run exited 0")
    computed = deployment.computed()
    assert len(computed) == 2 * FRAGMENT_ROWS and len(set(computed)) == 2 * FRAGMENT_ROWS  # each row once
    assert all(line.endswith("|True") for line in deployment.log.read_text().splitlines())  # inside the pods
    version = deployment.table_version(object_store.storage_options)

    again = deployment.finished(deployment.launch(), core)
    assert again.status == dg.DagsterRunStatus.SUCCESS
    assert len(deployment.computed()) == 2 * FRAGMENT_ROWS  # nothing computed again
    assert deployment.table_version(object_store.storage_options) == version


def test_a_shard_waiting_for_the_gpu_is_reported_by_the_daemons_sensor_and_a_deleted_shard_pod_is_retried(
        deployment, core, object_store):
    node = deployment.node.name
    core.patch_node_status(node, {"status": {"capacity": {"nvidia.com/gpu": "1"}}})  # one shard at a time
    wait_for(lambda: core.read_node(node).status.allocatable.get("nvidia.com/gpu") == "1", what="one GPU left")
    try:
        table = lancedb.connect(deployment.db_uri, storage_options=object_store.storage_options).open_table("docs")
        start = table.count_rows()
        fragments = [_docs(start, FRAGMENT_ROWS), _docs(start + FRAGMENT_ROWS, FRAGMENT_ROWS)]
        for rows in fragments:
            table.add(rows)
        before = len(deployment.computed())
        run_id = deployment.launch()

        def said(text: str) -> list[str]:
            return [e.message for e in deployment.instance.all_logs(run_id) if e.is_dagster_event and text in (e.message or "")]

        # One shard holds the node's only GPU; the daemon's gpu_capacity sensor says the other waits, naming it.
        waiting = wait_for(lambda: said("Waiting for GPU capacity"), timeout=300, what="the waiting shard reported")
        assert "docs__shout_shard" in waiting[0] and "class 'l4'" in waiting[0], waiting
        assert deployment.instance.get_run_by_id(run_id).tags["gpufn/capacity"] == "waiting"

        # The shard that computes loses its pod mid-way (a preempted or evicted pod).
        victim = wait_for(lambda: len(deployment.computed()) > before + 100 and next(
            (p.metadata.name for p in core.list_namespaced_pod(deployment.namespace,
                                                               label_selector=f"dagster/run-id={run_id}").items
             if p.status.phase == "Running" and (p.spec.containers[0].resources.limits or {}).get("nvidia.com/gpu")),
            None), timeout=300, what="a shard computing")
        done_by_victim = set(deployment.computed()[before:])
        core.delete_namespaced_pod(victim, deployment.namespace, grace_period_seconds=0)

        run = deployment.finished(run_id, core)
        assert run.status == dg.DagsterRunStatus.SUCCESS, _pods_text(core, deployment.namespace, deployment.node, deployment.cpu_node)
        assert said("GPU capacity arrived"), said("")
        retried = [e for e in deployment.instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_UP_FOR_RETRY)]
        assert [e.step_key for e in retried] and all("_shard" in e.step_key for e in retried), retried
        new = deployment.computed()[before:]
        texts = [set(rows.column("text").to_pylist()) for rows in fragments]
        victims, other = (texts[0], texts[1]) if done_by_victim <= texts[0] else (texts[1], texts[0])
        assert done_by_victim <= victims
        assert set(new) == victims | other  # every new row computed...
        assert all(new.count(text) == 1 for text in other)  # ...and the other shard's rows once, not redone
        data = TableFiles(f"{deployment.db_uri}/docs.lance", object_store.storage_options).dataset().to_table(
            columns=["text", "shout"]).to_pydict()  # the committed table, every row of it
        assert all(value == text.upper() for text, value in zip(data["text"], data["shout"], strict=True))
    finally:
        core.patch_node_status(node, {"status": {"capacity": {"nvidia.com/gpu": "2"}}})


def _loaded(context: WorkspaceProcessContext) -> bool:
    context.reload_code_location("deploy")
    return "deploy" in context.create_request_context().get_code_location_entries() and \
        context.create_request_context().get_code_location_entries()["deploy"].code_location is not None


def _pods_text(core, namespace: str, *nodes: RealNode) -> str:
    """Every pod of the namespace with its phase and what it said (on the node it ran on), for a
    failing assertion."""
    by_name = {node.name: node for node in nodes}
    return "\n\n".join(by_name[p.spec.node_name].why_failed(p.metadata.name, namespace) if p.spec.node_name in by_name
                        else f"pod {p.metadata.name}: {p.status.phase}, not on a real node"
                        for p in core.list_namespaced_pod(namespace).items)
