"""Dagster deployed on the development cluster as its Helm chart deploys it, every process a pod:
the code server (`dagster api grpc`) and the daemon (`dagster-daemon run`) on a real node, the
instance in PostgreSQL, tables on the object store, GpuK8sRunLauncher placing run and step pods.
The webserver's side (instance and workspace) stays in the calling process, as a test or
benchmark drives it through GraphQL, the way the Launchpad does.

Pods run this machine's Python from host mounts on the worker image and use the host's network
(`realnode`), so they reach PostgreSQL, the object store and the API server on 127.0.0.1. CPU pods
get no toleration and so stay off GPU nodes; a GPU step's pod gets its class's from its placement.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .cluster import DevCluster
from .objectstore import ObjectStore
from .postgres import Postgres
from .processes import ClusterError, free_port
from .realnode import REAL_NODE_LABEL, WORKER_IMAGE, host_mounts

LOCATION = "deploy"


def small_classes(source: Path, target: Path) -> Path:
    """A copy of the class files in `source`, class l4 asking little enough CPU and memory that its
    pods fit this machine's real nodes (the shipped l4 asks 4 CPUs and 16Gi a worker)."""
    for path in source.glob("*.yaml"):
        text = path.read_text()
        if path.name == "l4.yaml":
            text = text.replace('cpu: "4"', 'cpu: "100m"').replace("memory: 16Gi", "memory: 512Mi")
        (target / path.name).write_text(text)
    return target


def host_pod_config(env: dict[str, str]) -> dict[str, Any]:
    """The launcher config every run and step pod inherits: this machine's Python from host
    mounts on the worker image, the host's network, a real node (not a KWOK one)."""
    mounts = host_mounts()
    return {
        "env_vars": [f"{k}={v}" for k, v in env.items()],
        "volumes": [{"name": f"host{i}", "host_path": {"path": p}} for i, p in enumerate(mounts)],
        "volume_mounts": [{"name": f"host{i}", "mount_path": p} for i, p in enumerate(mounts)],
        "run_k8s_config": {"pod_spec_config": {"host_network": True, "node_selector": {REAL_NODE_LABEL: "true"}}},
    }


def server_pod(name: str, args: list[str], env: dict[str, str], working_dir: Path) -> dict[str, Any]:
    """A pod running a Dagster server process (code server, daemon), as the Helm chart's Deployments do."""
    mounts = host_mounts()
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": name}},
            "spec": {"hostNetwork": True, "nodeSelector": {REAL_NODE_LABEL: "true"}, "restartPolicy": "Never",
                     "volumes": [{"name": f"host{i}", "hostPath": {"path": p}} for i, p in enumerate(mounts)],
                     "containers": [{"name": "dagster", "image": WORKER_IMAGE, "imagePullPolicy": "Never",
                                     "command": [sys.executable, *args], "workingDir": str(working_dir),
                                     "env": [{"name": k, "value": v} for k, v in env.items()],
                                     "volumeMounts": [{"name": f"host{i}", "mountPath": p}
                                                      for i, p in enumerate(mounts)]}]}}


@dataclass
class Deployment:
    """Dagster on `cluster`, serving the definitions in `defs`; use as a context manager.

    `env` reaches every pod (the code server, the daemon, run and step pods); the table the
    definitions read must exist before `start()` (a Function on a missing table fails the load).
    """

    cluster: DevCluster
    object_store: ObjectStore
    postgres: Postgres
    classes_dir: Path
    defs: Path
    workdir: Path
    env: dict[str, str] = field(default_factory=dict)
    namespace: str = field(default_factory=lambda: f"deploy-{uuid.uuid4().hex[:6]}")
    instance: Any = None
    context: Any = None
    _open: ExitStack = field(default_factory=ExitStack)  # the instance and workspace, closed in stop()

    def __enter__(self) -> Deployment:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def core(self) -> Any:
        import kubernetes

        return kubernetes.client.CoreV1Api(self.cluster.api_client())

    def start(self, timeout: float = 180.0) -> None:
        import dagster as dg
        from dagster._core.workspace.context import WorkspaceProcessContext
        from dagster._core.workspace.load_target import GrpcServerTarget

        core = self.core
        core.create_namespace({"metadata": {"name": self.namespace}})
        _until(lambda: any(sa.metadata.name == "default" for sa in core.list_namespaced_service_account(
            self.namespace).items), 60, "the namespace's default service account")
        env = {**self.object_store.environment, "GPUFN_CLASSES_DIR": str(self.classes_dir),
               "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"),
               "PYTHONUNBUFFERED": "1", **self.env}
        home = self.workdir / "dagster_home"
        home.mkdir(parents=True, exist_ok=True)
        instance_yaml = {
            "storage": {"postgres": {"postgres_url": self.postgres.database()}},
            "run_coordinator": {"module": "dagster._core.run_coordinator", "class": "QueuedRunCoordinator"},
            "run_launcher": {"module": "gpufn_dagster", "class": "GpuK8sRunLauncher", "config": {
                "instance_config_map": "dagster-instance", "service_account_name": "default",
                "job_namespace": self.namespace, "load_incluster_config": False,
                "kubeconfig_file": str(self.cluster.kubeconfig), "job_image": WORKER_IMAGE, "image_pull_policy": "Never",
                "classes_dir": str(self.classes_dir), **host_pod_config(env)}},
            "run_monitoring": {"enabled": True, "start_timeout_seconds": 0, "poll_interval_seconds": 5},
            "telemetry": {"enabled": False},
        }
        (home / "dagster.yaml").write_text(yaml.safe_dump(instance_yaml))
        port = free_port()
        (home / "workspace.yaml").write_text(yaml.safe_dump(
            {"load_from": [{"grpc_server": {"host": "127.0.0.1", "port": port, "location_name": LOCATION}}]}))
        core.create_namespaced_config_map(self.namespace, {"metadata": {"name": "dagster-instance"},
                                                           "data": {"dagster.yaml": yaml.safe_dump(instance_yaml)}})
        server_env = {**env, "DAGSTER_HOME": str(home)}
        core.create_namespaced_pod(self.namespace, server_pod("code-server", [
            "-m", "dagster", "api", "grpc", "-h", "127.0.0.1", "-p", str(port), "-f", str(self.defs),
            "-d", str(self.defs.parent)], server_env, self.defs.parent))
        core.create_namespaced_pod(self.namespace, server_pod("daemon", [
            "-m", "dagster._daemon", "run", "-w", str(home / "workspace.yaml")], server_env, self.defs.parent))
        for name in ("code-server", "daemon"):
            _until(lambda n=name: core.read_namespaced_pod(n, self.namespace).status.phase == "Running", 120,
                   f"the {name} pod running")
        self.instance = self._open.enter_context(dg.DagsterInstance.from_config(str(home)))
        self.context = self._open.enter_context(WorkspaceProcessContext(self.instance, GrpcServerTarget(
            host="127.0.0.1", port=port, socket=None, location_name=LOCATION)))
        _until(self._loaded, timeout, "the code server answering")

    def _loaded(self) -> bool:
        self.context.reload_code_location(LOCATION)
        entry = self.context.create_request_context().get_code_location_entries().get(LOCATION)
        return entry is not None and entry.code_location is not None

    def launch(self, asset: str, run_config: dict | None = None) -> str:
        """Launch a materialization of `asset` as the UI's Materialize does; returns the run id (QUEUED)."""
        from dagster_graphql.client.query import LAUNCH_PIPELINE_EXECUTION_MUTATION
        from dagster_graphql.test.utils import execute_dagster_graphql

        result = execute_dagster_graphql(self.context.create_request_context(), LAUNCH_PIPELINE_EXECUTION_MUTATION,
                                         variables={"executionParams": {
                                             "selector": {"repositoryLocationName": LOCATION,
                                                          "repositoryName": "__repository__",
                                                          "pipelineName": "__ASSET_JOB",
                                                          "assetSelection": [{"path": [asset]}]},
                                             "mode": "default", **({"runConfigData": run_config} if run_config else {})}})
        launched = result.data["launchPipelineExecution"]
        if launched["__typename"] != "LaunchRunSuccess":
            raise ClusterError(f"launching {asset} failed: {launched}")
        return launched["run"]["runId"]

    def finished(self, run_id: str, timeout: float = 600.0) -> Any:
        """The run once it succeeded or failed (ClusterError naming its state after `timeout` s)."""
        import dagster as dg

        ended = (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)
        _until(lambda: self.instance.get_run_by_id(run_id).status in ended, timeout, f"run {run_id} to end")
        return self.instance.get_run_by_id(run_id)

    def stop(self) -> None:
        self._open.close()
        core = self.core
        try:
            core.delete_collection_namespaced_pod(self.namespace, grace_period_seconds=0)
            core.delete_namespace(self.namespace, grace_period_seconds=0)
        except Exception:  # noqa: BLE001 - never created
            return
        _until(lambda: not core.list_namespaced_pod(self.namespace).items, 300, "the deployment's pods gone")


def _until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}")
