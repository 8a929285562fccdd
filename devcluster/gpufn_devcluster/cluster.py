"""A real Kubernetes control plane on this machine: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and KWOK as plain processes bound to 127.0.0.1, with fake GPU node pools.

The binaries come from `tools/k8s/build.sh` (built from pinned Go modules, cached by version).
Every process is started in its own session with a parent-death signal, so nothing outlives the
Python process that started it, even when that process is killed.
"""

from __future__ import annotations

import os
import secrets
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpufn_dagster.classes import GpuClass
from .nodes import FAKE_NODE_LABEL, cpu_nodes, gpu_nodes
from .pki import write_pki
from .processes import ClusterError, free_port, log_tail, spawn, stop_all, wait_ready

REPO = Path(__file__).resolve().parents[2]  # devcluster/gpufn_devcluster/cluster.py in a checkout
BUILD_SCRIPT = REPO / "tools" / "k8s" / "build.sh"
STAGES = Path(__file__).with_name("stages.yaml")
BIN_DIR_ENV = "GPUFN_K8S_BIN"
DRA_BIN_ENV = "GPUFN_DRA_BIN"


def _built(script: Path, env: str) -> Path:
    """The directory `script` builds (or finds cached) and prints last; $`env` names one instead."""
    if os.environ.get(env):
        return Path(os.environ[env])
    if not script.is_file():
        raise ClusterError(f"{script} not found: the test binaries are built from a checkout of gpufn-dagster; "
                           f"run from one, or point ${env} at prebuilt binaries")
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True)
    if done.returncode != 0:
        raise ClusterError(f"{script} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def binaries_dir() -> Path:
    """The directory with the control-plane binaries: $GPUFN_K8S_BIN, else build (or reuse) them."""
    return _built(BUILD_SCRIPT, BIN_DIR_ENV)


def dra_binaries_dir() -> Path:
    """The directory with the real node's DRA binaries (containerd 1.7, the suite's DRA driver):
    $GPUFN_DRA_BIN, else build (or reuse) them with tools/dra/build.sh."""
    return _built(REPO / "tools" / "dra" / "build.sh", DRA_BIN_ENV)


@dataclass
class DevCluster:
    """A running control plane; use as a context manager or call start()/stop()."""

    bin_dir: Path
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="gpufn-k8s-")))
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    started_seconds: float = 0.0

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    def __enter__(self) -> DevCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _spawn(self, name: str, args: list[str]) -> None:
        self.processes[name] = spawn(self.bin_dir / args[0], args[1:], self.workdir / f"{name}.log", self.workdir)

    def log_tail(self, name: str, lines: int = 30) -> str:
        return log_tail(self.workdir / f"{name}.log", lines)

    def _wait(self, name: str, probe, timeout: float = 60.0) -> None:
        wait_ready(name, self.processes[name], probe, self.workdir / f"{name}.log", timeout)

    def _get(self, url: str, *, token: bool = True) -> bool:
        ctx = ssl.create_default_context(cafile=str(self.workdir / "pki" / "ca.crt"))
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {self.token}"} if token else {})
        with urllib.request.urlopen(request, context=ctx, timeout=2) as response:
            return response.status == 200

    def start(self) -> None:
        """Start every component in dependency order and wait until each is ready."""
        started = time.monotonic()
        pki = write_pki(self.workdir / "pki")
        (self.workdir / "tokens.csv").write_text(f'{self.token},gpufn-admin,gpufn-admin,"system:masters"\n')
        self.ports = {name: free_port() for name in ("etcd", "etcd-peer", "apiserver", "kcm", "scheduler", "kwok")}
        etcd_url = f"http://127.0.0.1:{self.ports['etcd']}"
        peer_url = f"http://127.0.0.1:{self.ports['etcd-peer']}"
        self._spawn("etcd", [
            "etcd", "--name=node0", f"--data-dir={self.workdir / 'etcd'}", f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}", f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}", f"--initial-cluster=node0={peer_url}",
            "--unsafe-no-fsync", "--quota-backend-bytes=4294967296", "--log-level=warn"])
        self._wait("etcd", lambda: urllib.request.urlopen(f"{etcd_url}/health", timeout=2).status == 200)

        self._spawn("apiserver", [
            "kube-apiserver", f"--etcd-servers={etcd_url}", "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={self.ports['apiserver']}", f"--tls-cert-file={pki['admin.crt']}",
            f"--tls-private-key-file={pki['admin.key']}", f"--client-ca-file={pki['ca.crt']}",
            f"--token-auth-file={self.workdir / 'tokens.csv'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki['sa.pub']}", f"--service-account-signing-key-file={pki['sa.key']}",
            "--service-cluster-ip-range=10.96.0.0/24", "--authorization-mode=RBAC", "--allow-privileged=true",
            "--endpoint-reconciler-type=none", "--enable-priority-and-fairness=false", "--v=1"])
        self._wait("apiserver", lambda: self._get(f"{self.server}/readyz"), timeout=90)
        self._write_kubeconfig(pki)

        self._spawn("kcm", [
            "kube-controller-manager", f"--kubeconfig={self.kubeconfig}", "--leader-elect=false",
            "--bind-address=127.0.0.1", f"--secure-port={self.ports['kcm']}", f"--root-ca-file={pki['ca.crt']}",
            f"--service-account-private-key-file={pki['sa.key']}", "--use-service-account-credentials=false",
            "--controllers=*", "--node-monitor-grace-period=120s",
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics"])
        self._spawn("scheduler", [
            "kube-scheduler", f"--kubeconfig={self.kubeconfig}", "--leader-elect=false",
            "--bind-address=127.0.0.1", f"--secure-port={self.ports['scheduler']}",
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics"])
        self._spawn("kwok", [
            "kwok", f"--kubeconfig={self.kubeconfig}", f"--config={STAGES}", "--manage-all-nodes=false",
            f"--manage-nodes-with-label-selector={FAKE_NODE_LABEL}=true", "--node-ip=127.0.0.1",
            "--cidr=10.244.0.0/16", "--node-lease-duration-seconds=0"])
        for name in ("kcm", "scheduler"):
            self._wait(name, lambda n=name: self._healthz(n))
        self._wait("kwok", lambda: (self.workdir / "kwok.log").stat().st_size > 0, timeout=30)
        self._wait("kcm", self._default_service_account, timeout=60)
        self.started_seconds = time.monotonic() - started

    def _healthz(self, name: str) -> bool:
        ctx = ssl._create_unverified_context()  # their serving certs are self-signed at start
        with urllib.request.urlopen(f"https://127.0.0.1:{self.ports[name]}/healthz", context=ctx, timeout=2) as r:
            return r.status == 200

    def _default_service_account(self) -> bool:
        try:
            return self._get(f"{self.server}/api/v1/namespaces/default/serviceaccounts/default")
        except urllib.error.HTTPError:
            return False

    def _write_kubeconfig(self, pki: dict[str, Path]) -> None:
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "gpufn",
            "clusters": [{"name": "gpufn", "cluster": {"server": self.server, "certificate-authority": str(pki["ca.crt"])}}],
            "users": [{"name": "gpufn-admin", "user": {"client-certificate": str(pki["admin.crt"]),
                                                        "client-key": str(pki["admin.key"])}}],
            "contexts": [{"name": "gpufn", "context": {"cluster": "gpufn", "user": "gpufn-admin"}}],
        }
        self.kubeconfig.write_text(yaml.safe_dump(config))

    def stop(self) -> None:
        """Stop every component (reverse order), SIGKILL what has not exited after 10 s, remove the workdir."""
        stop_all(self.processes)
        self.processes.clear()
        if not os.environ.get("GPUFN_K8S_KEEP"):
            shutil.rmtree(self.workdir, ignore_errors=True)

    def api_client(self):
        """A `kubernetes` client authenticated with the static admin token."""
        import kubernetes

        configuration = kubernetes.client.Configuration()
        configuration.host = self.server
        configuration.ssl_ca_cert = str(self.workdir / "pki" / "ca.crt")
        configuration.api_key = {"authorization": f"Bearer {self.token}"}
        return kubernetes.client.ApiClient(configuration)

    def add_nodes(self, manifests: Iterable[dict[str, Any]], *, timeout: float = 60.0) -> list[str]:
        """Create nodes and wait until KWOK reports them Ready."""
        import kubernetes

        core = kubernetes.client.CoreV1Api(self.api_client())
        names = []
        for manifest in manifests:
            core.create_node(manifest)
            names.append(manifest["metadata"]["name"])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready = {n.metadata.name for n in core.list_node().items
                     if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])}
            if ready.issuperset(names):
                return names
            time.sleep(0.3)
        raise ClusterError(f"nodes not Ready after {timeout:.0f}s: {sorted(set(names) - ready)}\n{self.log_tail('kwok')}")

    def add_pools(self, classes: Iterable[GpuClass], *, nodes_per_class: int = 2, cpu: int = 2,
                  gpus_per_node: int | None = None) -> list[str]:
        """Node pools for every class plus plain CPU nodes."""
        manifests = [n for c in classes for n in gpu_nodes(c, nodes_per_class, gpus_per_node=gpus_per_node)]
        return self.add_nodes([*manifests, *cpu_nodes(cpu)])
