"""Helpers the tests share: tables refreshed in-process, pods on the suite's control plane, runs
launched through gpufn's launcher as the UI launches them, and hostile class files. Tests import
them from here, never from one another."""

from __future__ import annotations

import json
import random
import time
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import kubernetes
import lancedb
import pyarrow as pa
import yaml
from dagster import DagsterInstance
from dagster._core.test_utils import in_process_test_workspace
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster_graphql.client.query import LAUNCH_PIPELINE_EXECUTION_MUTATION
from dagster_graphql.test.utils import execute_dagster_graphql
from dagster._core.test_utils import create_test_daemon_workspace_context, instance_for_test
from dagster._core.workspace.load_target import PythonFileTarget
from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import QueuedRunCoordinatorDaemon

from gpufn_dagster import GpuClassError, build_definitions
from gpufn_dagster.assets.resources import STABLE_ROW_IDS
from gpufn_dagster.class_files import load_gpu_classes
from gpufn_dagster.classes import GpuClass
from gpufn_dagster.run.gauges import stored_gauges

from .conftest import CLASSES, wait_for


# --- Function tables, refreshed in-process ---

def open_table(db_uri: str):
    return lancedb.connect(db_uri).open_table("docs")


def values(db_uri: str, column: str = "shout") -> dict[int, object]:
    data = open_table(db_uri).to_lance().to_table(columns=["id", column]).to_pydict()
    return dict(zip(data["id"], data[column], strict=True))


def make_docs(db_uri: str, rows: int, *, start: int = 0):
    table = pa.table({"id": list(range(start, start + rows)), "text": [f"doc {i}" for i in range(start, start + rows)],
                      "tag": ["x"] * rows})
    db = lancedb.connect(db_uri)
    if "docs" in db.list_tables().tables:
        db.open_table("docs").add(table)
    else:
        db.create_table("docs", table, storage_options=STABLE_ROW_IDS)


def run(db_uri: str, asset, instance=None) -> dg.ExecuteInProcessResult:
    defs = build_definitions(assets=[asset], db_uri=db_uri)
    return dg.materialize([asset], resources=defs.resources, instance=instance or dg.DagsterInstance.ephemeral(),
                          raise_on_error=False)


def metadata(result: dg.ExecuteInProcessResult) -> dict[str, object]:
    (event,) = result.get_asset_materialization_events()
    return {k: v.value for k, v in event.materialization.metadata.items()}


# --- pods on the suite's control plane ---

def a100() -> GpuClass:
    return load_gpu_classes(CLASSES)["a100-80gb"]


def gpu_pod(name: str, gpu_class: GpuClass, gpus: int, outcome: str = "hold") -> dict:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"gpufn.dev/fake-outcome": outcome}},
        "spec": {
            "nodeSelector": dict(gpu_class.node_selector),
            "tolerations": [t.to_k8s() for t in gpu_class.tolerations],
            "restartPolicy": "Never",
            "containers": [{"name": "worker", "image": "gpufn/worker:test",
                            "resources": {"limits": {gpu_class.resource_name: str(gpus)}}}],
        },
    }


# --- runs launched through GpuK8sRunLauncher, as the UI launches them ---

DEFS = Path(__file__).parent / "integration" / "k8s_defs.py"  # the code location of the launcher tests


def launcher_config(cluster, namespace: str, classes_dir: Path, cls: str = "GpuK8sRunLauncher") -> dict:
    return {
        "module": "gpufn_dagster" if cls == "GpuK8sRunLauncher" else "dagster_k8s",
        "class": cls,
        "config": {
            "instance_config_map": "dagster-instance", "service_account_name": "default", "job_namespace": namespace,
            "load_incluster_config": False,
            "kubeconfig_file": str(cluster.kubeconfig), "job_image": "gpufn/worker:test",
            "labels": {"gpufn.dev/fake-outcome": "hold"},
            # Tables on object storage: the store's settings reach every run and step pod from a Secret.
            "env_secrets": ["gpufn-object-store"],
            **({"classes_dir": str(classes_dir)} if cls == "GpuK8sRunLauncher" else {}),
        },
    }


def materialize(instance: DagsterInstance, *assets: str, tags: dict[str, str] | None = None,
                job: str = "__ASSET_JOB", run_config: dict | None = None, defs: Path = DEFS) -> str:
    """Launch a run the way the UI's Materialize button does (of the code location `defs`); returns the run id."""
    origin = LoadableTargetOrigin(python_file=str(defs), attribute="defs")
    with in_process_test_workspace(instance, origin) as context:
        (location,) = context.code_location_names
        result = execute_dagster_graphql(context, LAUNCH_PIPELINE_EXECUTION_MUTATION, variables={"executionParams": {
            "selector": {"repositoryLocationName": location, "repositoryName": "__repository__",
                         "pipelineName": job, "assetSelection": [{"path": [a]} for a in assets]},
            "mode": "default",
            **({"runConfigData": run_config} if run_config else {}),
            "executionMetadata": {"tags": [{"key": k, "value": v} for k, v in (tags or {}).items()]},
        }})
    launched = result.data["launchPipelineExecution"]
    if launched["__typename"] == "LaunchRunSuccess":
        return launched["run"]["runId"]
    assert launched["__typename"] == "PythonError", launched
    runs = instance.get_runs(limit=1)
    return runs[0].run_id


def event_metadata(instance: DagsterInstance, run_id: str) -> list[dict[str, object]]:
    """The metadata of each engine event of the run (what the run page's event shows beside its sentence),
    as plain values: tests assert on these facts, not on the sentence's wording."""
    found = []
    for entry in instance.all_logs(run_id):
        data = entry.dagster_event.engine_event_data if entry.is_dagster_event and entry.dagster_event.is_engine_event \
            else None
        if data is not None:
            found.append({k: v.value for k, v in data.metadata.items()})
    return found


def run_pod(core, namespace: str, run_id: str):
    """The run worker pod of the run (waiting for it to exist)."""
    return wait_for(lambda: core.list_namespaced_pod(namespace, label_selector=f"dagster/run-id={run_id}").items,
                    what="run pod")[0]


def unschedulable(core, namespace: str, run_id: str) -> bool:
    pod = run_pod(core, namespace, run_id)
    return any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in pod.status.conditions or [])


def class_gauges(instance: DagsterInstance, gpu_class: str) -> tuple:
    """(unit, capacity, in use, steps waiting, runs waiting) of the class, as the last tick stored them."""
    gauges, _ = stored_gauges(instance)
    (g,) = [g for g in gauges if g.gpu_class == gpu_class]
    return g.unit, g.capacity, g.in_use, g.steps_waiting, g.runs_waiting


def job_pod(cluster, namespace: str, run_id: str):
    core = kubernetes.client.CoreV1Api(cluster.api_client())
    pods = wait_for(lambda: core.list_namespaced_pod(namespace, label_selector=f"dagster/run-id={run_id}").items,
                    what="run worker pod")
    name = pods[0].metadata.name
    node = wait_for(lambda: core.read_namespaced_pod(name, namespace).spec.node_name, what="pod scheduled")
    return core.read_namespaced_pod(name, namespace), core.read_node(node)


def step_handler(cluster, namespace: str, instance, run, step_k8s_config: dict | None = None, defs: Path = DEFS):
    """The step handler gpufn's executor builds in the run worker (`step_pods_executor`, its config
    as a run config's `gpu_step_pods` gives it), with the environment the launcher gave the run worker pod."""
    from dagster._core.definitions.reconstruct import ReconstructableRepository
    from dagster._core.executor.init import InitExecutorContext

    from gpufn_dagster.assets.executor import gpu_classes_executor, step_pods_executor
    from gpufn_dagster.run.k8s.pods import GpuStepHandler

    pod, _node = job_pod(cluster, namespace, run.run_id)
    environment = {e.name: e.value for e in pod.spec.containers[0].env or [] if e.value is not None}
    job = ReconstructableRepository.for_file(str(defs), "defs").get_reconstructable_job(run.job_name)
    config = {"retries": {"enabled": {}},
              "gpu_step_pods": {"job_image": "gpufn/worker:test", "step_k8s_config": step_k8s_config or {}}}
    pods = step_pods_executor(InitExecutorContext(job=job, executor_def=gpu_classes_executor, executor_config=config,
                                                  instance=instance), environment)
    assert isinstance(pods._step_handler, GpuStepHandler)
    return pods._step_handler


def create_step_job(cluster, namespace: str, instance, run, handler, key: str, tags, job_name: str) -> None:
    """The step's Job as the handler's launch_step builds it (KWOK runs no run worker to launch it)."""
    from types import SimpleNamespace

    from dagster_k8s.job import construct_dagster_k8s_job

    context = SimpleNamespace(
        dagster_run=run, instance=instance, step_tags={key: tags},
        execute_step_args=SimpleNamespace(step_keys_to_execute=[key]),
        get_step_context=lambda k: SimpleNamespace(step=SimpleNamespace(op_name=k)))
    container_context = handler._get_container_context(context)
    kubernetes.client.BatchV1Api(cluster.api_client()).create_namespaced_job(namespace, construct_dagster_k8s_job(
        job_config=container_context.get_k8s_job_config(job_image="gpufn/worker:test",
                                                        run_launcher=instance.run_launcher),
        args=["dagster", "api", "execute_step"], job_name=job_name, pod_name=job_name, component="step_worker",
        user_defined_k8s_config=container_context.run_k8s_config,
        labels={"dagster/run-id": run.run_id, "dagster/op": key, "step": job_name}))


def shard_step_pods(cluster, namespace: str, instance, run, shards: range, pods: bool = True,
                    step_k8s_config: dict | None = None, defs: Path = DEFS) -> list[str]:
    """Create the shard steps' Jobs as gpufn's step handler makes them, with the placement the launcher
    decided at launch (KWOK runs no step worker to launch them); returns their pods' names (with
    `pods=False`, the Jobs' names, not waiting for pods: Kueue may hold a Job back)."""
    handler = step_handler(cluster, namespace, instance, run, step_k8s_config, defs)
    plan = instance.get_execution_plan_snapshot(run.execution_plan_snapshot_id)
    (shard_step,) = [step for step in plan.steps if "_shard" in step.key]
    core = kubernetes.client.CoreV1Api(cluster.api_client())
    names = []
    for index in shards:
        key = shard_step.key.replace("[?]", f"[shard_{index}]")
        job_name = f"shard-{index}-{run.run_id[:8]}"
        create_step_job(cluster, namespace, instance, run, handler, key, shard_step.tags, job_name)
        if not pods:
            names.append(job_name)
            continue
        names.append(wait_for(lambda n=job_name: core.list_namespaced_pod(namespace, label_selector=f"step={n}").items,
                              what=f"{job_name} pod")[0].metadata.name)
    return names


def fanned_out_run(cluster, namespace: str, instance, tags: dict[str, str] | None = None):
    """Materialize the Function spread over 4 workers: placed per step, its run worker a CPU pod."""
    run_id = materialize(instance, "frames__emb_wide", job="fanned", tags=tags)
    run = instance.get_run_by_id(run_id)
    assert run.tags["gpufn/placement"] == "per-step", [e.message for e in instance.all_logs(run_id)]
    pod, node = job_pod(cluster, namespace, run_id)
    assert node.metadata.labels["gpufn.dev/pool"] == "cpu" and not pod.spec.containers[0].resources.limits
    return run


# --- hostile class files: a fixed-seed fuzz of one field at a time, and whole files no editor writes ---

SEED = 15
BASE = {"name": "fuzz", "gpu_model": "X", "gpu_memory": "8GiB", "max_gpu_count_per_worker": 2,
        "resource_name": "nvidia.com/gpu", "node_selector": {"pool": "fuzz"},
        "tolerations": [{"key": "pool", "operator": "Equal", "value": "fuzz", "effect": "NoSchedule"}],
        "price_per_gpu_hour": 1.5, "max_wait": "2h", "local": {"slots": 1}}
HOSTILE_VALUES = [
    ".inf", "-.inf", ".nan", "1e999999999999", "9" * 5000, "-1", "0", "99999999999999d", "1e3Gi", "64 Gi",
    "1_000", "Infinity", "NaN", "１２", "[]", "{}", "null", "true", "''", "'\\x00'", "[[[[[[[[1]]]]]]]]",
    "9223372036854775808", "-9223372036854775809", "{a: {b: {c: d}}}", "'" + "x" * 3000 + "'",
]
FIELDS = ["name", "gpu_model", "gpu_memory", "max_gpu_count_per_worker", "resource_name", "node_selector",
          "tolerations", "price_per_gpu_hour", "max_wait", "local", "cpu", "memory", "node_affinity"]
BILLION_LAUGHS = "\n".join(["a: &a [x, x, x, x, x, x, x, x, x]"]
                           + [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]"
                              for i in range(8)]) + "\nname: *i\n"


def field_cases(rng: random.Random) -> list[str]:
    """One field of a valid class replaced by a hostile value (as YAML text)."""
    cases = []
    for field in FIELDS:
        for value in HOSTILE_VALUES:
            lines = [f"{k}: {json.dumps(v)}" for k, v in BASE.items() if k != field]
            cases.append("\n".join([*lines, f"{field}: {value}"]) + "\n")
    rng.shuffle(cases)
    return cases[:260]


def whole_file_cases() -> dict[str, bytes | str | None]:
    deep = "name: fuzz\nnode_affinity: " + "[" * 1000 + "]" * 1000 + "\n"
    return {
        "alias bomb in name": BILLION_LAUGHS,
        "alias bomb in node_affinity": BILLION_LAUGHS.replace("name: *i", "name: fuzz\nnode_affinity: *i"),
        "nested 1000 deep": deep,
        "nested mappings 1000 deep": "name: fuzz\nlocal: " + "{a: " * 1000 + "1" + "}" * 1000 + "\n",
        "non-UTF-8 bytes": b"name: fuzz\ngpu_model: \xff\xfe\n",
        "a huge file": "name: fuzz\n" + "# padding\n" * 20000,
        "a list, not a mapping": "- name: fuzz\n",
        "an empty file": "",
        "a directory": None,
        "a dangling symlink": None,
        "unclosed": "name: [fuzz\n",
        "tabs": "name:\tfuzz\n\tgpu_model: X\n",
    }


def place(directory: Path, label: str, content: bytes | str | None) -> Path:
    path = directory / "fuzz.yaml"
    if label == "a directory":
        path.mkdir()
    elif label == "a dangling symlink":
        path.symlink_to(directory / "gone.yaml")
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


def outcome(directory: Path) -> tuple[str, float]:
    """'valid', 'error' (a GpuClassError naming the file), or the kind of exception that escaped."""
    started = time.monotonic()
    try:
        load_gpu_classes(directory)
        result = "valid"
    except GpuClassError as err:
        result = "error" if "fuzz.yaml" in str(err) else f"error without the file: {err}"
    except Exception as err:  # noqa: BLE001 -- what the test is looking for
        result = f"traceback: {type(err).__name__}: {str(err)[:200]}"
    return result, time.monotonic() - started


# --- `gpufn serve`, a real process ---

@contextmanager
def gpufn_serve(classes_dir: Path, token: str, dagster_home: str | None = None):
    """`gpufn serve` on a free loopback port, answering; yields its base URL and stops it after."""
    import socket
    import sys
    import urllib.error
    import urllib.request

    from gpufn_devcluster import processes

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    import os

    env = {**os.environ, **({"DAGSTER_HOME": dagster_home} if dagster_home else {})}
    process = processes.start([sys.executable, "-m", "gpufn_dagster.cli", "serve", "--port", str(port), "--dir",
                               str(classes_dir), "--token", token], env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        def up() -> bool:
            try:
                urllib.request.urlopen(f"{base}/v1/gpu/classes", timeout=1)
            except urllib.error.HTTPError:
                return True  # answering (401 without the token)
            except OSError:
                return False
            return True

        wait_for(up, timeout=60, what="gpufn serve answering")
        yield base
    finally:
        processes.stop(process, grace=10)


# --- the embedded mode on a real instance, its queue daemon and a code location ---

LOCAL_DEFS = Path(__file__).with_name("integration") / "local_defs.py"


def submit(workspace, *assets: str, tags: dict[str, str] | None = None, run_config: dict | None = None) -> str:
    context = workspace.create_request_context()
    result = execute_dagster_graphql(context, LAUNCH_PIPELINE_EXECUTION_MUTATION, variables={"executionParams": {
        "selector": {"repositoryLocationName": "local_slots", "repositoryName": "__repository__",
                     "pipelineName": "__ASSET_JOB", "assetSelection": [{"path": [a]} for a in assets]},
        "executionMetadata": {"tags": [{"key": k, "value": v} for k, v in (tags or {}).items()]},
        "runConfigData": run_config or {}, "mode": "default"}})
    launched = result.data["launchPipelineExecution"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    return launched["run"]["runId"]


@contextmanager
def embedded(tmp_path, monkeypatch, classes_dir, rows: int = 6, defs: Path = LOCAL_DEFS, postgres_url: str | None = None,
             warm: dict | None = None, warm_run_workers: bool = True, **settings):
    """The embedded coordinator on a real instance and workspace; class `default` gets `settings`,
    and `warm` as its `local.warm` block (default `{idle: 0}`: each step loads its Function itself,
    so a test of slots sees one process per step; a warm-instance test gives its own). Runs start
    in warm run workers, as the shipped deploy/dagster-embedded.yaml has them (`warm_run_workers`).
    Every other class keeps no warm instance (`{idle: 0}`) unless its file says otherwise.
    The instance is stored in SQLite files, or with `postgres_url` in that PostgreSQL database
    (dagster-postgres: runs, events, schedules and the concurrency pools), as on Kubernetes.

    Yields (instance, workspace, a queue-daemon pass, open(n): let the n-th `docs__slow` step to get the
    slot finish; see integration/local_defs.py).
    """
    db_uri = str(tmp_path / "lancedb")
    gates = tmp_path / "gates"
    gates.mkdir()
    monkeypatch.setenv("GPUFN_LANCEDB_URI", db_uri)
    monkeypatch.setenv("GPUFN_CLASSES_DIR", str(classes_dir))
    monkeypatch.setenv("GPUFN_TEST_GATES", str(gates))
    spec = yaml.safe_load((classes_dir / "default.yaml").read_text())
    spec.update(settings)
    spec["local"] = {**spec.get("local", {}), "warm": warm if warm is not None else {"idle": 0}}
    (classes_dir / "default.yaml").write_text(yaml.safe_dump(spec))
    for other in sorted(classes_dir.glob("*.yaml")):  # the other classes keep no instance either: one owned by
        spec = yaml.safe_load(other.read_text())      # this test process would outlive the test (idle 10 min)
        if other.name != "default.yaml" and isinstance(spec, dict) and "warm" not in spec.get("local", {}):
            spec["local"] = {**spec.get("local", {}), "warm": {"idle": 0}}
            other.write_text(yaml.safe_dump(spec))
    lancedb.connect(db_uri).create_table("docs", pa.table({"id": list(range(rows)), "text": [f"d{i}" for i in range(rows)]}),
                                         storage_options=STABLE_ROW_IDS)
    overrides = {"run_coordinator": {"module": "gpufn_dagster", "class": "GpuQueuedRunCoordinator",
                                     "config": {"classes_dir": str(classes_dir)}},
                 # as deploy/dagster-embedded.yaml: runs start in warm run workers (embedded.launcher)
                 "run_launcher": {"module": "gpufn_dagster", "class": "GpuLocalRunLauncher",
                                  "config": {"warm_run_workers": warm_run_workers}},
                 **({"storage": {"postgres": {"postgres_url": postgres_url}}} if postgres_url else {})}
    target = PythonFileTarget(python_file=str(defs), attribute="defs", working_directory=str(defs.parent),
                              location_name="local_slots")
    with instance_for_test(overrides=overrides) as instance, \
            create_test_daemon_workspace_context(target, instance) as workspace:
        daemon = QueuedRunCoordinatorDaemon(interval_seconds=1)
        try:
            yield instance, workspace, lambda: list(daemon.run_iteration(workspace)), lambda n: (gates / f"open-{n}").touch()
        finally:
            (gates / "open-all").touch()  # whatever happened, no run worker is left holding a slot


def said(instance, run_id: str) -> str:
    """Everything the run's event log says, one message a line."""
    return "\n".join(e.message for e in instance.all_logs(run_id) if e.message)


def finish(instance, queue_pass, run_id: str, timeout: float = 300) -> object:
    """The run once it ended, passing the queue daemon meanwhile (embedded)."""
    def ended():
        queue_pass()
        return instance.get_run_by_id(run_id).is_finished

    wait_for(ended, timeout=timeout, what=f"run {run_id[:8]} ended")
    return instance.get_run_by_id(run_id)


def docs_column(name: str) -> list:
    """The `docs` table's column in row order, in $GPUFN_LANCEDB_URI ([] while it does not exist)."""
    import os

    table = lancedb.connect(os.environ["GPUFN_LANCEDB_URI"]).open_table("docs").to_arrow()
    return table.column(name).to_pylist() if name in table.column_names else []
