"""Shared fixtures: the shipped GPU classes, a fresh LanceDB directory per test, and (for tests
marked `k8s`) one real control plane per session with fake node pools built from classes/."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CLASSES = REPO / "classes"
BUILD_SCRIPT = REPO / "tools" / "k8s" / "build.sh"
# Marks every process this test session starts (they inherit it), so the end-of-suite check of
# leftover warm run workers finds this session's, not those of a bench on the same machine.
SESSION_ENV = "GPUFN_TEST_SESSION"
os.environ.setdefault(SESSION_ENV, f"{os.getpid()}-{uuid.uuid4().hex[:8]}")
os.environ["GPUFN_CLASSES_DIR"] = str(CLASSES)


# Debian's packages the real-part tests need: headless Chromium for the UI tests, containerd, runc
# and the CNI plugins for the real kubelet node, PostgreSQL for instances stored as on Kubernetes.
DEBIAN_PACKAGES = {"chromium": "/usr/bin/chromium", "chromium-driver": "/usr/bin/chromedriver",
                   "containerd": "/usr/bin/containerd", "runc": "/usr/sbin/runc",
                   "containernetworking-plugins": "/usr/lib/cni/loopback", "postgresql": "/usr/lib/postgresql"}


def _missing_packages() -> list[str]:
    return [name for name, path in DEBIAN_PACKAGES.items()
            if not Path(path).exists() and not shutil.which(Path(path).name)]


def _install_debian_packages(say: Callable[[str], object]) -> None:
    """Install what the real-part tests need, as root (as on CI); otherwise stop at once naming the
    one line to run, so no real-part test skips on a machine that only lacks a package."""
    missing = _missing_packages()
    if not missing:
        return
    line = f"apt-get update && apt-get install -y {' '.join(missing)}"
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.exit(f"the real-part tests need Debian packages this machine lacks; run as root: {line}", returncode=4)
    say(f"installing {', '.join(missing)} for the browser and real-node tests ({line})")
    started = time.monotonic()
    done = subprocess.run(["bash", "-c", f"apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y "
                                         f"-qq {' '.join(missing)}"], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.exit(f"{line} failed ({done.returncode}):\n{done.stderr[-3000:]}", returncode=4)
    say(f"installed in {time.monotonic() - started:.0f} s")


_SKIPPED: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped:
        _SKIPPED.append(report.nodeid)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Install the Debian packages the real-part tests need (when one is selected), and build (or
    find built) the control plane before any test runs, when a `k8s` test is selected.

    A cold build takes minutes (half an hour on a busy 2-core machine); done here it is outside
    every per-test timeout, and its progress is printed as it goes.
    """
    from gpufn_devcluster.cluster import BIN_DIR_ENV, DRA_BIN_ENV

    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    say = reporter.write_line if reporter else print
    if any(item.path.name in ("test_real_node.py", "test_dra_k8s.py", "test_deployment.py", "test_ui_capacity.py",
                              "test_ui_materialize_all.py", "test_bench_smoke.py")
           or item.get_closest_marker("postgres") for item in session.items):
        _install_debian_packages(say)
    if not any(item.get_closest_marker("k8s") or item.get_closest_marker("s3") for item in session.items):
        return
    _build(BUILD_SCRIPT, BIN_DIR_ENV, "control plane", say)
    if any(item.path.name == "test_dra_k8s.py" for item in session.items):  # its real node's DRA driver
        _build(REPO / "tools" / "dra" / "build.sh", DRA_BIN_ENV, "DRA driver", say)


def _build(script: Path, env: str, what: str, say: Callable[[str], object]) -> None:
    """Run a build script of tools/ (printing its progress), and put the directory it prints in $`env`."""
    if os.environ.get(env):
        return
    say(f"{what}: running {script.relative_to(REPO)} (a no-op when its cache is warm)")
    started = time.monotonic()
    process = subprocess.Popen(["bash", str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    done = threading.Event()

    def heartbeat() -> None:
        while not done.wait(60):
            say(f"{what}: still building after {time.monotonic() - started:.0f} s")

    threading.Thread(target=heartbeat, daemon=True).start()
    for line in process.stdout:
        lines.append(line.rstrip())
        if not line.startswith("go: downloading"):
            say(f"{what}: {line.rstrip()}")
    done.set()
    if process.wait() != 0:
        pytest.exit(f"{script} failed ({process.returncode}) after {time.monotonic() - started:.0f} s:\n"
                    + "\n".join(lines[-40:]), returncode=1)
    os.environ[env] = lines[-1]
    say(f"{what}: binaries in {lines[-1]} ({time.monotonic() - started:.0f} s)")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the suite when a server or cluster process a test started is still alive at the end (and
    kill it): a helper that lets one outlive its test leaves a machine with strays running."""
    from gpufn_devcluster.processes import kill_survivors, survivors
    from gpufn_devcluster.realnode import shims

    if os.environ.get("CI", "").lower() == "true" and _SKIPPED:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        (reporter.write_line if reporter else print)(
            "\nCI=true: a real-part test that skips is not evidence, and these skipped:\n  " + "\n  ".join(_SKIPPED))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    stray_shims = shims(orphaned=True)  # a stopped node's; they run in sessions of their own
    warm = _warm_instances_left()  # they run in sessions of their own too, and end with their code server
    workers = _warm_run_workers_left()
    alive = (survivors() + [f"pid {pid}: a stopped real node's containerd shim" for pid in stray_shims]
             + [f"pid {pid}: a warm Function instance's process" for pid in warm]
             + [f"pid {pid}: a warm run worker (its launcher was never disposed, or its run never ended)"
                for pid in workers])
    if alive:
        kill_survivors()
        for pid in stray_shims + warm + workers:
            os.kill(pid, signal.SIGKILL)
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        (reporter.write_line if reporter else print)(
            "\nprocesses started by the suite were still alive at its end (killed now):\n  " + "\n  ".join(alive))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _ours(pid: int) -> bool:
    """Whether process `pid` was started by this test session (it inherited `SESSION_ENV`): another
    suite's or a bench's on the same machine is not this session's to judge or kill."""
    mark = f"{SESSION_ENV}={os.environ[SESSION_ENV]}".encode()
    try:
        return mark in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def _warm_instances_left(grace: float = 10.0) -> list[int]:
    """Warm instances' processes this session started (under the temporary directory) still running
    after `grace` seconds: each ends within a second of its owner (the code server that launched its
    run) or its idle time, so one still alive was left behind."""
    import tempfile

    from gpufn_dagster.embedded.warm import host_processes

    deadline = time.monotonic() + grace
    while (left := [pid for pid in host_processes(Path(tempfile.gettempdir())) if _ours(pid)]) \
            and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def _warm_run_workers_left(grace: float = 10.0) -> list[int]:
    """Warm run workers (`gpufn_dagster.embedded.warm_worker`) started by this session still running
    after `grace` seconds: one waiting ends with its launcher's instance, one handed a run with its run."""
    from gpufn_dagster.embedded.procfs import running_module
    from gpufn_dagster.embedded.warm_worker import MODULE

    deadline = time.monotonic() + grace
    while (found := [pid for pid in running_module(MODULE) if _ours(pid)]) and time.monotonic() < deadline:
        time.sleep(0.5)
    return found


@pytest.fixture(autouse=True)
def _no_defs_state_storage_left_behind() -> Iterator[None]:
    """A test that leaves a Dagster instance unclosed leaves its defs-state storage as the current
    one (a context variable), and the next test that loads components finds it dead ("undefined
    DagsterInstance weakref"); reset it so tests do not depend on their order."""
    yield
    from dagster._core.storage.defs_state.base import _current_storage

    _current_storage.set(None)


@pytest.fixture
def classes_dir(tmp_path: Path) -> Path:
    """A writable copy of the shipped classes, for tests that add or break one."""
    target = tmp_path / "classes"
    shutil.copytree(CLASSES, target)
    return target


@pytest.fixture(scope="session")
def postgres_server() -> Iterator:
    """A real PostgreSQL server (Debian's package), once per session."""
    from gpufn_devcluster.postgres import Postgres

    with Postgres() as running:
        yield running


@pytest.fixture
def postgres_url(postgres_server) -> str:
    """A new, empty database on the suite's PostgreSQL server, for one test's instance."""
    return postgres_server.database()


@pytest.fixture(scope="session")
def object_store() -> Iterator:
    """A real S3-compatible server (SeaweedFS, built by tools/k8s/build.sh), once per session."""
    from gpufn_devcluster.cluster import binaries_dir
    from gpufn_devcluster.objectstore import ObjectStore

    with ObjectStore(binaries_dir()) as running:
        yield running


@pytest.fixture
def db_uri(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh LanceDB database: a local directory, or (parametrized "s3") a folder of the suite's
    object store, reached the way a pod reaches it (the `AWS_*` variables of a Secret)."""
    if getattr(request, "param", "local") == "local":
        return str(tmp_path / "lancedb")
    store = request.getfixturevalue("object_store")
    for name, value in store.environment.items():
        monkeypatch.setenv(name, value)
    return store.uri(f"{re.sub('[^A-Za-z0-9_-]', '-', request.node.name)[:60]}-{uuid.uuid4().hex[:8]}")


NODES_PER_CLASS = 2
CPU_NODES = 2


@pytest.fixture(scope="session")
def cluster() -> Iterator:
    """The real control plane (etcd, apiserver, controller-manager, scheduler, KWOK), once per session."""
    from gpufn_dagster.class_files import list_gpu_classes
    from gpufn_devcluster.cluster import DevCluster, binaries_dir

    with DevCluster(binaries_dir()) as running:
        running.add_pools(list_gpu_classes(CLASSES), nodes_per_class=NODES_PER_CLASS, cpu=CPU_NODES)
        yield running


def launcher_at(tmp_path: Path, server: str, classes_dir: Path) -> dict:
    """A GpuK8sRunLauncher config whose kubeconfig points at `server` (an API server that is down or frozen)."""
    import yaml

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    return {"module": "gpufn_dagster", "class": "GpuK8sRunLauncher", "config": {
        "instance_config_map": "dagster-instance", "service_account_name": "default", "job_namespace": "default",
        "load_incluster_config": False, "kubeconfig_file": str(kubeconfig), "job_image": "img",
        "classes_dir": str(classes_dir)}}


def wait_for(predicate: Callable[[], object], timeout: float = 30.0, what: str = "condition") -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture
def core(cluster):
    import kubernetes

    return kubernetes.client.CoreV1Api(cluster.api_client())


@pytest.fixture
def namespace(cluster, core) -> Iterator[str]:
    """A namespace per test; its Jobs and pods are deleted (and gone) afterwards so pools are free again."""
    import kubernetes

    name = f"t-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    wait_for(lambda: any(sa.metadata.name == "default" for sa in core.list_namespaced_service_account(name).items),
             what="default service account")
    yield name
    kubernetes.client.BatchV1Api(cluster.api_client()).delete_collection_namespaced_job(
        name, propagation_policy="Background")
    core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    wait_for(lambda: not core.list_namespaced_pod(name).items, what="pods deleted")
    core.delete_namespace(name)
