"""One real node for the test control plane: a kubelet (built from the pinned Kubernetes module)
with Debian's containerd and runc, so a pod the launcher or `k8s_job_executor` built really runs.

No registry is reachable here, so the two images it needs are made locally and imported into
containerd: the pod sandbox's `pause` (built by tools/k8s/build.sh) and `gpufn.local/worker:1`,
an empty image whose pods mount the host's Python, virtualenv and checkout (hostPath) and use the
host's network, so they reach the suite's object store on 127.0.0.1. The node carries a GPU class's
labels and taint, and the class's GPU resource is advertised as an extended resource.

Settings this machine needs, each found by trying: cgroup v1 (`failCgroupV1: false`, cgroupfs);
`restrict_oom_score_adj` in containerd (lowering a sandbox's OOM score is refused here, and runc
then dies with "can't get final child's PID from pipe"); a loopback-only CNI config (pods use the
host network, but the runtime reports its network ready only with one).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufn_dagster.classes import GpuClass

from .cluster import REPO, DevCluster
from .nodes import CPU_POOL
from .processes import ClusterError, free_port, spawn, stop_all, wait_ready

PAUSE_IMAGE = "gpufn.local/pause:1"
WORKER_IMAGE = "gpufn.local/worker:1"
REAL_NODE_LABEL = "gpufn.dev/real-node"
CNI_BIN = Path("/usr/lib/cni")
SYSTEM_MOUNTS = ("/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc/ssl", "/tmp")


def missing_runtime() -> str | None:
    """What this machine lacks to run a real node (None: nothing)."""
    absent = [name for name in ("containerd", "runc") if shutil.which(name) is None]
    if not (CNI_BIN / "loopback").exists():
        absent.append("containernetworking-plugins")
    if absent:
        return (f"{', '.join(absent)} not installed (Debian: apt-get install containerd runc "
                "containernetworking-plugins)")
    return None


def shims(address_part: str = "gpufn-node-", orphaned: bool = False) -> list[int]:
    """The containerd shims alive whose containerd socket's path holds `address_part` (by default,
    those of any real node started here); with `orphaned`, only those whose socket is gone with
    its node (a node still running, another session's too, keeps its socket)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            words = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if not words or "containerd-shim" not in words[0] or "-address" not in words[:-1]:
            continue
        address = words[words.index("-address") + 1]
        if address_part in address and not (orphaned and Path(address).exists()):
            found.append(int(proc.name))
    return found


def host_mounts() -> tuple[str, ...]:
    """The host paths a worker pod mounts to run this very Python: the system's directories plus
    wherever this interpreter, its virtualenv, the checkout and HOME are (CI checks out under
    /check, a workstation anywhere), each once, none inside another, only those that exist."""
    wanted = [*SYSTEM_MOUNTS, sys.prefix, sys.base_prefix, str(Path(sys.executable).resolve().parent),
              str(REPO), str(Path.home())]
    paths = sorted({os.path.normpath(p) for p in wanted if Path(p).exists()})  # /lib stays /lib: ld.so is found there
    return tuple(p for p in paths if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in paths))


def _blob(data: bytes) -> tuple[str, bytes]:
    return "sha256:" + hashlib.sha256(data).hexdigest(), data


def oci_archive(files: dict[str, bytes], name: str, entrypoint: list[str]) -> bytes:
    """A one-layer OCI image archive (what `ctr images import` takes) holding `files` (path -> bytes)."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        for path, data in sorted(files.items()):
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    layer_digest, layer_data = _blob(layer.getvalue())
    config_digest, config_data = _blob(json.dumps({
        "architecture": "amd64", "os": "linux", "config": {"Entrypoint": entrypoint},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]}}).encode())
    manifest_digest, manifest_data = _blob(json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest,
                   "size": len(config_data)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest,
                    "size": len(layer_data)}]}).encode())
    index = {"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest_digest,
        "size": len(manifest_data), "platform": {"architecture": "amd64", "os": "linux"},
        "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]}}]}
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for path, data in [("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
                           ("index.json", json.dumps(index).encode()),
                           *((f"blobs/sha256/{d.split(':')[1]}", b) for d, b in
                             [(layer_digest, layer_data), (config_digest, config_data),
                              (manifest_digest, manifest_data)])]:
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


@dataclass(frozen=True)
class DraDriver:
    """The suite's DRA driver on a real node (`tools/dra/draplugin`, its kubelet plugin, from
    `dra_binaries_dir`): it publishes the node's `gpus` fake GPUs of `product` in a ResourceSlice,
    and gives a container each device of its claim as `GPU_DEVICE_<index>=<device>` through CDI,
    which the node's containerd (1.7, built beside it: Debian's 1.6 has no CDI) applies."""

    bin_dir: Path
    name: str = "gpu.example.com"
    product: str = "NVIDIA H100 80GB HBM3"


@dataclass
class RealNode:
    """A kubelet + containerd node named `name`, joined to `cluster` as a node of `gpu_class`
    (its labels, its taint, `gpus` of its GPU resource -- or, with `dra`, `gpus` devices its DRA
    driver publishes), or with `gpu_class=None` as a CPU node (pool `cpu`, no taint, no GPU):
    several run side by side on one machine."""

    bin_dir: Path
    cluster: DevCluster
    gpu_class: GpuClass | None
    gpus: int = 1
    name: str = "real-0"
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="gpufn-node-")))
    processes: dict = field(default_factory=dict)
    dra: DraDriver | None = None

    @property
    def socket(self) -> Path:
        return self.workdir / "containerd.sock"

    def __enter__(self) -> RealNode:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 120.0) -> None:
        self._containerd()
        for name, files, entrypoint in [
                (PAUSE_IMAGE, {"pause": (self.bin_dir / "pause").read_bytes()}, ["/pause"]),
                (WORKER_IMAGE, {"etc/gpufn-worker-image": b"a pod of the suite's real node\n"}, [])]:
            archive = self.workdir / f"{name.split('/')[1].replace(':', '-')}.tar"
            archive.write_bytes(oci_archive(files, name, entrypoint))
            self._ctr("images", "import", str(archive))
        self._kubelet()
        core = self.cluster_api()
        kubelet, log = self.processes["kubelet"], self.workdir / "kubelet.log"
        wait_ready(f"kubelet (node {self.name} Ready)", kubelet, lambda: self._ready(core), log, timeout, poll=0.5)
        if self.gpu_class is None:
            return
        if self.dra is not None:
            self._dra_plugin(timeout)
            return
        core.patch_node_status(self.name, {"status": {"capacity": {self.gpu_class.resource_name: str(self.gpus)}}})
        wait_ready(f"node {self.name} showing {self.gpus} {self.gpu_class.resource_name}", kubelet,
                   lambda: (core.read_node(self.name).status.allocatable or {}).get(self.gpu_class.resource_name)
                   == str(self.gpus), log, timeout, poll=0.5)

    def _dra_plugin(self, timeout: float) -> None:
        """Start the DRA driver's kubelet plugin; return once its ResourceSlice is published."""
        import kubernetes

        assert self.dra is not None
        kubelet_dir = self.workdir / "kubelet"
        log = self.workdir / "draplugin.log"
        self.processes["draplugin"] = spawn(self.dra.bin_dir / "draplugin", [
            f"--driver={self.dra.name}", f"--node={self.name}", f"--kubeconfig={self.cluster.kubeconfig}",
            f"--registry={kubelet_dir / 'plugins_registry'}", f"--data={kubelet_dir / 'plugins' / self.dra.name}",
            f"--cdi={self.workdir / 'cdi'}", f"--gpus={self.gpus}", f"--product={self.dra.product}"], log, self.workdir)
        resource = kubernetes.client.ResourceV1Api(self.cluster.api_client())
        wait_ready(f"the DRA driver's ResourceSlice of node {self.name}", self.processes["draplugin"],
                   lambda: any(s.spec.node_name == self.name for s in resource.list_resource_slice().items), log,
                   timeout, poll=0.5)

    def why_failed(self, pod: str, namespace: str) -> str:
        """Why `pod` failed, for a test's message: each container's state as the kubelet reports it
        (a container that could not start -- a missing mount, an unknown command -- writes no log,
        only this) and what the containers wrote (the kubelet's log files)."""
        status = self.cluster_api().read_namespaced_pod(pod, namespace).status
        states = [f"{c.name}: {c.state}" for c in status.container_statuses or []]
        logs = [path.read_text(errors="replace")[-3000:] for path in (self.workdir / "pods").glob(f"*_{pod}_*/*/*.log")]
        return "\n".join([f"pod {pod}: {status.phase} {status.reason or ''} {status.message or ''}", *states, *logs])

    def cluster_api(self) -> Any:
        import kubernetes

        return kubernetes.client.CoreV1Api(self.cluster.api_client())

    def _ready(self, core: Any) -> bool:
        try:
            node = core.read_node(self.name)
        except Exception:  # noqa: BLE001 - not registered yet
            return False
        return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])

    def _ctr(self, *args: str) -> None:
        done = subprocess.run(["ctr", "--address", str(self.socket), "-n", "k8s.io", *args],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise ClusterError(f"ctr {' '.join(args)} failed: {done.stderr[-2000:]}")

    def _containerd(self, timeout: float = 30.0) -> None:
        (self.workdir / "cni").mkdir(parents=True, exist_ok=True)
        (self.workdir / "cni" / "10-loopback.conflist").write_text(json.dumps(
            {"cniVersion": "1.0.0", "name": "gpufn-host", "plugins": [{"type": "loopback"}]}))
        config = self.workdir / "containerd.toml"
        config.write_text(f"""version = 2
root = "{self.workdir}/containerd/root"
state = "{self.workdir}/containerd/state"
[grpc]
  address = "{self.socket}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{self.workdir}/cni"
""")
        if self.dra is not None:  # CDI: the devices of a pod's claim reach its containers
            config.write_text(config.read_text().replace(
                '  restrict_oom_score_adj = true\n',
                f'  restrict_oom_score_adj = true\n  enable_cdi = true\n  cdi_spec_dirs = ["{self.workdir / "cdi"}"]\n'))
        binary = self.dra.bin_dir / "containerd" if self.dra is not None else Path(shutil.which("containerd") or "containerd")
        self.processes["containerd"] = spawn(binary, ["--config", str(config)], self.workdir / "containerd.log",
                                             self.workdir)
        wait_ready("containerd", self.processes["containerd"], self.socket.exists, self.workdir / "containerd.log",
                   timeout)

    def _kubelet(self) -> None:
        tolerations = self.gpu_class.tolerations if self.gpu_class else []
        taints = "".join(f"\n  - {{key: {t.key}, value: {json.dumps(t.value or '')}, effect: {t.effect}}}"
                         for t in tolerations if t.key and t.operator == "Equal")
        config = self.workdir / "kubelet.yaml"
        config.write_text(f"""apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
cgroupsPerQOS: false
enforceNodeAllocatable: []
authentication:
  anonymous: {{enabled: true}}
  webhook: {{enabled: false}}
authorization: {{mode: AlwaysAllow}}
port: {free_port()}
readOnlyPort: 0
healthzPort: 0
containerRuntimeEndpoint: unix://{self.socket}
evictionHard: {{}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
localStorageCapacityIsolation: false
podLogsDir: {self.workdir / "pods"}
registerWithTaints:{taints or " []"}
""")
        pool = {**self.gpu_class.node_selector, "gpufn.dev/pool": self.gpu_class.name} if self.gpu_class else \
            {"gpufn.dev/pool": CPU_POOL}
        labels = {**pool, REAL_NODE_LABEL: "true"}
        self.processes["kubelet"] = spawn(self.bin_dir / "kubelet", [
            f"--config={config}", f"--kubeconfig={self.cluster.kubeconfig}", f"--root-dir={self.workdir / 'kubelet'}",
            f"--cert-dir={self.workdir / 'pki'}", f"--hostname-override={self.name}", "--node-ip=127.0.0.1",
            "--node-labels=" + ",".join(f"{k}={v}" for k, v in labels.items())],
            self.workdir / "kubelet.log", self.workdir)

    def _kill_shims(self) -> None:
        """SIGKILL this node's containerd shims that outlived containerd: each runs in a session of
        its own (so no process group of ours holds it) and one whose task was torn down while
        containerd stopped stays, idle, for good."""
        for pid in shims(str(self.socket)):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:  # gone meanwhile
                pass

    def stop(self) -> None:
        """Stop the kubelet, then every pod's containers and containerd; remove the node and the workdir."""
        kubelet = {k: v for k, v in self.processes.items() if k == "kubelet"}
        stop_all(kubelet)
        if "containerd" in self.processes:
            subprocess.run(["bash", "-c", f"for t in $(ctr --address {self.socket} -n k8s.io tasks ls -q); do "
                                          f"ctr --address {self.socket} -n k8s.io tasks kill -s KILL $t; done"],
                           capture_output=True)
        stop_all({k: v for k, v in self.processes.items() if k != "kubelet"})
        self.processes.clear()
        self._kill_shims()
        try:  # the Node object too: a later test counting the cluster's nodes sees only its own
            self.cluster_api().delete_node(self.name)
        except Exception:  # noqa: BLE001 - never registered, or the control plane is already gone
            pass
        subprocess.run(["bash", "-c", f"grep -o '{self.workdir}[^ ]*' /proc/mounts | sort -r | xargs -r umount -l"],
                       capture_output=True)
        shutil.rmtree(self.workdir, ignore_errors=True)
