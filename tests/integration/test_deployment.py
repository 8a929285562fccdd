"""Dagster deployed as users deploy it on Kubernetes, on the suite's cluster, every process a pod
(`gpufn_devcluster.deployment`): the code server (`dagster api grpc`) and the daemon
(`dagster-daemon run`: run queue, sensors with gpu_capacity, run monitoring) run as pods, as
Dagster's Helm chart runs them; the instance is stored in PostgreSQL, the table on SeaweedFS. A
fanned-out refresh launched through the webserver's GraphQL API, as the Launchpad does, runs as run
worker pod -> plan pod -> shard pods -> commit pod, each placed as the launcher decided at launch.

Two real nodes (kubelet + containerd each): a CPU node, untainted, where the code server, the
daemon, the run worker, plan and commit land, and a GPU node of class l4 (its taint, its labels,
its GPU resource) where only the shards, which tolerate it, go. Needs Debian's containerd, runc,
containernetworking-plugins and postgresql (the test command installs them as root).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import lancedb
import pyarrow as pa
import pytest

from gpufn_dagster.class_files import load_gpu_classes
from gpufn_dagster.refresh.files import TableFiles
from gpufn_devcluster.cluster import binaries_dir
from gpufn_devcluster.deployment import Deployment, small_classes
from gpufn_devcluster.realnode import RealNode, missing_runtime

from ..conftest import CLASSES, wait_for

pytestmark = [pytest.mark.k8s, pytest.mark.s3, pytest.mark.postgres]
DEFS = Path(__file__).with_name("realnode_defs.py")
FRAGMENT_ROWS = 1200  # a shard takes at least 1,024 rows
ROW_SECONDS = 0.02  # each call's time, so a shard can be caught while it computes


@dataclass
class Deployed:
    """The deployment, and what the tests read: the table, the Function's call log, the nodes."""

    deployment: Deployment
    db_uri: str
    log: Path
    node: RealNode  # the GPU node
    cpu_node: RealNode

    @property
    def namespace(self) -> str:
        return self.deployment.namespace

    @property
    def instance(self) -> dg.DagsterInstance:
        return self.deployment.instance

    def launch(self) -> str:
        return self.deployment.launch("docs__shout")

    def finished(self, run_id: str, core) -> dg.DagsterRun:
        try:
            return self.deployment.finished(run_id)
        except Exception as err:
            raise AssertionError(f"{err}\n{_pods_text(core, self.namespace, self.node, self.cpu_node)}") from None

    def computed(self) -> list[str]:
        """The texts of the rows the Function computed, one line per call, in order."""
        return [line.rsplit("|", 1)[0] for line in self.log.read_text().splitlines()] if self.log.exists() else []

    def table_version(self, storage_options) -> int:
        return TableFiles(f"{self.db_uri}/docs.lance", storage_options).dataset().version


@pytest.fixture(scope="module")
def deployment(cluster, object_store, postgres_server, tmp_path_factory) -> Iterator[Deployed]:
    """The GPU node (class l4, 2 GPUs), the CPU node beside it, and Dagster deployed on them."""
    why = missing_runtime()
    if why:
        pytest.skip(f"no real node on this machine: {why}")
    work = tmp_path_factory.mktemp("deployment")
    classes = small_classes(CLASSES, tmp_path_factory.mktemp("deploy-classes"))
    db_uri = object_store.uri(f"deploy-{work.name}")
    log = work / "calls.log"
    # Two fragments, so the first refresh spreads over two shards.
    table = lancedb.connect(db_uri, storage_options=object_store.storage_options).create_table(
        "docs", _docs(0, FRAGMENT_ROWS))
    table.add(_docs(FRAGMENT_ROWS, FRAGMENT_ROWS))
    env = {"GPUFN_LANCEDB_URI": db_uri, "GPUFN_TEST_LOG": str(log), "GPUFN_TEST_ROW_SECONDS": str(ROW_SECONDS)}
    with RealNode(binaries_dir(), cluster, load_gpu_classes(classes)["l4"], gpus=2, name="real-l4-deploy") as gpu, \
            RealNode(binaries_dir(), cluster, None, name="real-cpu-deploy") as cpu, \
            Deployment(cluster, object_store, postgres_server, classes, DEFS, work, env) as deployed:
        core = deployed.core
        for name in ("code-server", "daemon"):
            assert core.read_namespaced_pod(name, deployed.namespace).spec.node_name == cpu.name
        yield Deployed(deployed, db_uri, log, gpu, cpu)


def _docs(start: int, count: int) -> pa.Table:
    return pa.table({"id": list(range(start, start + count)), "text": [f"doc {i}" for i in range(start, start + count)]})


def test_a_fanned_out_refresh_runs_through_a_deployment_of_pods_on_postgres_and_the_next_computes_nothing(
        deployment, core, object_store):
    run = deployment.finished(deployment.launch(), core)
    assert run.status == dg.DagsterRunStatus.SUCCESS, _pods_text(core, deployment.namespace, deployment.node, deployment.cpu_node)
    assert run.tags["gpufn/placement"] == "per-step"
    # Its Jobs (a Job may make a second pod when the kubelet refuses the first; Kubernetes' way, not a rerun).
    pods = core.list_namespaced_pod(deployment.namespace, label_selector=f"dagster/run-id={run.run_id}").items
    jobs = {p.metadata.labels["job-name"] for p in pods}
    gpu_jobs = {p.metadata.labels["job-name"] for p in pods
                if (p.spec.containers[0].resources.limits or {}).get("nvidia.com/gpu") == "1"}
    assert len(jobs) == 5 and len(gpu_jobs) == 2, sorted(jobs)  # run worker, plan, 2 shards, commit
    assert {p.spec.node_name for p in pods if p.metadata.labels["job-name"] in gpu_jobs} == {deployment.node.name}
    assert {p.spec.node_name for p in pods if p.metadata.labels["job-name"] not in gpu_jobs} == \
        {deployment.cpu_node.name}  # the shards on the GPU node, the rest not

    def each_job_succeeded() -> bool:
        now = core.list_namespaced_pod(deployment.namespace, label_selector=f"dagster/run-id={run.run_id}").items
        return {p.metadata.labels["job-name"] for p in now if p.status.phase == "Succeeded"} == jobs
    wait_for(each_job_succeeded, timeout=120, what="a pod of every Job of the run exited 0")
    _check_gpu_held_from_container_start(deployment.instance, run.run_id, core, deployment.namespace, gpu_jobs)
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
    if not deployment.computed():  # run alone (-k): first the refresh the module's first test makes
        assert deployment.finished(deployment.launch(), core).status == dg.DagsterRunStatus.SUCCESS
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

        # The sensor's ticks observe class l4's gauges on its gpu_capacity/l4 asset: the node's one GPU
        # held by a shard, the other shard's pod not placed, one run waiting.
        def observed_wait() -> dict | None:
            records = deployment.instance.fetch_observations(dg.AssetKey(["gpu_capacity", "l4"]), limit=10).records
            return next(({k: v.value for k, v in r.asset_observation.metadata.items()} for r in records
                         if r.asset_observation.metadata["steps_waiting"].value == 1), None)
        gauges = wait_for(observed_wait, timeout=120, what="a tick's observation of class l4 with a shard waiting")
        l4 = load_gpu_classes(deployment.deployment.classes_dir)["l4"]
        gpus = sum(int((n.status.allocatable or {}).get(l4.resource_name, "0")) for n in core.list_node().items
                   if all((n.metadata.labels or {}).get(k) == v for k, v in l4.node_selector.items()))
        assert (gauges["unit"], gauges["capacity"], gauges["in_use"], gauges["runs_waiting"]) == ("gpu", gpus, 1, 1), \
            gauges
        assert "gpu_capacity/l4" in {k.to_user_string() for k in deployment.instance.get_asset_keys()}

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


TERMINATE = """mutation($runId: String!) { terminateRun(runId: $runId) { __typename
  ... on TerminateRunFailure { message } ... on PythonError { message } } }"""


def _graphql(deployment: Deployed, query: str, variables: dict) -> dict:
    from dagster_graphql.test.utils import execute_dagster_graphql

    return execute_dagster_graphql(deployment.deployment.context.create_request_context(), query,
                                   variables=variables).data


def test_terminating_a_fanned_out_run_mid_refresh_deletes_its_pods_and_reexecution_recomputes_no_checkpointed_row(
        deployment, core, object_store):
    from dagster_graphql.client.query import LAUNCH_PIPELINE_REEXECUTION_MUTATION

    table = lancedb.connect(deployment.db_uri, storage_options=object_store.storage_options).open_table("docs")
    start = table.count_rows()
    for offset in (0, FRAGMENT_ROWS):
        table.add(_docs(start + offset, FRAGMENT_ROWS))

    def uncomputed() -> set[str]:
        data = TableFiles(f"{deployment.db_uri}/docs.lance", object_store.storage_options).dataset()
        if "shout" not in data.schema.names:
            return set(data.to_table(columns=["text"]).column("text").to_pylist())
        return set(data.to_table(columns=["text"], filter="shout IS NULL").column("text").to_pylist())

    pending = uncomputed()  # the rows just added (and all, when this test runs first)
    before = len(deployment.computed())
    run_id = deployment.launch()
    # Both shards compute (0.02 s a row) for more than one checkpoint interval (10 s) before the terminate.
    wait_for(lambda: len(deployment.computed()) > before + 1200, timeout=600, what="the shards 12 s into their rows")
    asked = time.monotonic()
    answer = _graphql(deployment, TERMINATE, {"runId": run_id})
    assert answer["terminateRun"]["__typename"] == "TerminateRunSuccess", answer
    run = deployment.finished(run_id, core)
    canceled_after = time.monotonic() - asked
    assert run.status == dg.DagsterRunStatus.CANCELED, _pods_text(core, deployment.namespace, deployment.node,
                                                                  deployment.cpu_node)

    def no_pod_left() -> bool:  # every Job of the run deleted or done: no pod holds the GPU node
        pods = core.list_namespaced_pod(deployment.namespace, label_selector=f"dagster/run-id={run_id}").items
        return not [p for p in pods if p.status.phase in ("Pending", "Running") and p.metadata.deletion_timestamp is None]
    wait_for(no_pod_left, timeout=120, what="the run's pods gone")
    freed_after = time.monotonic() - asked
    done_by_canceled = deployment.computed()[before:]
    time.sleep(3)
    assert deployment.computed()[before:] == done_by_canceled  # the Function stopped with its pods
    assert uncomputed() == pending  # nothing committed
    print(f"terminate -> CANCELED {canceled_after:.1f} s, pods gone {freed_after:.1f} s, "
          f"{len(done_by_canceled)} rows computed before")
    # What the shards had checkpointed when they stopped (each chunk holds its rows' values: the text, upper).
    files = TableFiles(f"{deployment.db_uri}/docs.lance", object_store.storage_options)
    checkpointed: set[str] = set()
    for name in files.names("_gpufn/checkpoints"):
        if name.endswith(".arrow"):
            reader = pa.ipc.open_file(pa.py_buffer(files.read(f"_gpufn/checkpoints/{name}")))
            checkpointed |= {v.lower() for v in reader.read_all().column("shout").to_pylist() if v is not None}
    assert checkpointed and checkpointed <= set(done_by_canceled)

    launched = _graphql(deployment, LAUNCH_PIPELINE_REEXECUTION_MUTATION, {"reexecutionParams": {
        "parentRunId": run_id, "strategy": "FROM_FAILURE"}})["launchPipelineReexecution"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    again = deployment.finished(launched["run"]["runId"], core)
    assert again.status == dg.DagsterRunStatus.SUCCESS, _pods_text(core, deployment.namespace, deployment.node,
                                                                   deployment.cpu_node)
    redone = deployment.computed()[before + len(done_by_canceled):]
    assert set(done_by_canceled) | set(redone) == pending and not uncomputed()  # every row computed...
    recomputed = set(done_by_canceled) & set(redone)
    assert not recomputed & checkpointed  # ...and no row the canceled run had checkpointed again
    assert recomputed == set(done_by_canceled) - checkpointed  # (only those computed after the last checkpoint)
    print(f"re-execution recomputed {len(recomputed)} of the {len(done_by_canceled)} rows the canceled run computed "
          f"({len(checkpointed)} checkpointed)")


def _check_gpu_held_from_container_start(instance, run_id: str, core, namespace: str, gpu_jobs: set[str]) -> None:
    """Each shard's GPU-seconds held count its pod's time before the step began (its process's
    start, imports, the code location's load: at least half a second more than Dagster's step
    span), and no more than its container ran (the kubelet's start and finish, to the second)."""
    (event,) = instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION)
    meta = {k: v.value for k, v in event.dagster_event.event_specific_data.materialization.metadata.items()}
    held = {r["shard"]: r["gpu_held_seconds"] for r in (dict(row.data) for row in meta["shards"].records)}
    starts = {e.step_key: e.timestamp for e in instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_START)}
    spans = {int(e.step_key.rsplit("shard_", 1)[1].rstrip("]")): e.timestamp - starts[e.step_key]
             for e in instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_SUCCESS) if "_shard[" in e.step_key}
    ran = [(c.state.terminated.finished_at - c.state.terminated.started_at).total_seconds()
           for p in core.list_namespaced_pod(namespace, label_selector=f"dagster/run-id={run_id}").items
           if p.metadata.labels["job-name"] in gpu_jobs and p.status.phase == "Succeeded"
           for c in p.status.container_statuses]
    assert sorted(held) == sorted(spans) == [0, 1], (held, spans)
    assert all(spans[i] + 0.5 <= held[i] <= max(ran) + 2 for i in held), (held, spans, ran)
    assert abs(meta["gpu_held_seconds"] - sum(held.values())) < 0.05, meta


def _pods_text(core, namespace: str, *nodes: RealNode) -> str:
    """Every pod of the namespace with its phase and what it said (on the node it ran on), for a
    failing assertion."""
    by_name = {node.name: node for node in nodes}
    return "\n\n".join(by_name[p.spec.node_name].why_failed(p.metadata.name, namespace) if p.spec.node_name in by_name
                        else f"pod {p.metadata.name}: {p.status.phase}, not on a real node"
                        for p in core.list_namespaced_pod(namespace).items)
