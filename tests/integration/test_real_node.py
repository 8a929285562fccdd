"""A shard that really runs in a pod: on the suite's one real node (kubelet + containerd + runc,
`gpufn_devcluster.realnode`), the shard step's pod -- built as gpufn's step handler builds it,
placed as the launcher decides at launch -- executes Dagster's own step worker
(`dagster api execute_step`) against the table on the object store; the rows it filled are its own.

Needs Debian's containerd, runc and containernetworking-plugins; without them it is skipped,
saying so.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import kubernetes
import lancedb
import pyarrow as pa
import pytest
from dagster._core.definitions.reconstruct import ReconstructableRepository
from dagster._core.execution.plan.state import KnownExecutionState
from dagster._core.test_utils import instance_for_test
from dagster._grpc.types import ExecuteStepArgs
from dagster._serdes import serialize_value

from gpufn_dagster.class_files import load_gpu_classes
from gpufn_dagster.refresh.files import TableFiles
from gpufn_devcluster.cluster import binaries_dir
from gpufn_devcluster.realnode import REAL_NODE_LABEL, WORKER_IMAGE, RealNode, host_mounts, missing_runtime

from ..conftest import CLASSES, wait_for

pytestmark = [pytest.mark.k8s, pytest.mark.s3]
DEFS = Path(__file__).with_name("realnode_defs.py")
PLAN, COMMIT = "docs__shout.docs__shout_plan", "docs__shout.docs__shout_commit"


@pytest.fixture(scope="module")
def real_node(cluster):
    why = missing_runtime()
    if why:
        pytest.skip(f"no real node on this machine: {why}")
    with RealNode(binaries_dir(), cluster, load_gpu_classes(CLASSES)["l4"], gpus=1, name="real-l4-0") as node:
        yield node


def shard(index: int) -> str:
    return f"docs__shout.docs__shout_shard[shard_{index}]"


def test_a_shard_pod_on_a_real_node_runs_the_step_worker_and_fills_its_rows(real_node, cluster, namespace,
                                                                             object_store, tmp_path, monkeypatch,
                                                                             classes_dir):
    from dagster_k8s.container_context import K8sContainerContext
    from dagster_k8s.job import DagsterK8sJobConfig, UserDefinedDagsterK8sConfig, construct_dagster_k8s_job

    from gpufn_dagster.run.k8s.pods import placed_context
    from gpufn_dagster.run.placement import step_gpu_request
    from gpufn_dagster.run.run_plan import plan_run
    from gpufn_dagster.tags import RunKind

    # The shipped l4 class asks 4 CPUs and 16Gi per worker; this machine's node has 2 CPUs.
    l4 = classes_dir / "l4.yaml"
    l4.write_text(l4.read_text().replace('cpu: "4"', 'cpu: "1"').replace("memory: 16Gi", "memory: 1Gi"))
    db_uri = object_store.uri(f"real-node-{tmp_path.name}")
    log = tmp_path / "calls.log"
    env = {**object_store.environment, "GPUFN_LANCEDB_URI": db_uri, "GPUFN_CLASSES_DIR": str(classes_dir),
           "GPUFN_TEST_LOG": str(log)}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    lancedb.connect(db_uri).create_table("docs", pa.table({"id": list(range(4000)),
                                                           "text": [f"doc {i}" for i in range(4000)]}))
    home = tmp_path / "home"  # under /tmp: the pod mounts it, so its step worker writes to this instance
    home.mkdir()
    with instance_for_test(temp_dir=str(home)) as instance:
        job = ReconstructableRepository.for_file(str(DEFS), "defs", working_directory=str(DEFS.parent)) \
            .get_reconstructable_job("__ASSET_JOB")
        run = instance.create_run_for_job(job_def=job.get_definition(), job_code_origin=job.get_python_origin(),
                                          asset_selection=frozenset({dg.AssetKey("docs__shout")}))
        known = KnownExecutionState(dynamic_mappings={PLAN: {"shards": ["shard_0", "shard_1"]}})

        def step_args(key: str) -> str:
            return serialize_value(ExecuteStepArgs(job_origin=job.get_python_origin(), run_id=run.run_id,
                                                   step_keys_to_execute=[key], instance_ref=instance.get_ref(),
                                                   known_state=None if key == PLAN else known))

        def on_this_host(key: str) -> None:
            done = subprocess.run([sys.executable, "-m", "dagster", "api", "execute_step", step_args(key)],
                                  capture_output=True, text=True, env=os.environ)
            assert done.returncode == 0, done.stderr[-3000:]

        on_this_host(PLAN)

        # shard_0: its pod as gpufn's step handler makes it -- dagster-k8s's layers, then the placement the
        # launcher decides at launch for the shard's GPU request -- plus what a pod of this machine
        # needs: the host's Python and checkout, its network.
        plan = instance.get_execution_plan_snapshot(run.execution_plan_snapshot_id)
        tags = next(step.tags for step in plan.steps if "_shard" in step.key)
        decided = plan_run(instance, run, classes_dir)
        assert decided.kind is RunKind.PER_STEP
        context = placed_context(K8sContainerContext(
            namespace=namespace, image_pull_policy="Never",
            env_vars=[f"{k}={v}" for k, v in {**env, "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
                                              "HOME": os.environ.get("HOME", "/root")}.items()],
            volumes=[{"name": f"host{i}", "host_path": {"path": p}} for i, p in enumerate(host_mounts())],
            volume_mounts=[{"name": f"host{i}", "mount_path": p} for i, p in enumerate(host_mounts())],
            run_k8s_config=UserDefinedDagsterK8sConfig.from_dict(
                {"pod_spec_config": {"host_network": True, "node_selector": {REAL_NODE_LABEL: "true"}}}),
        ), decided.step_placements[step_gpu_request(tags)])  # as the step handler does
        job_name = f"real-shard-0-{run.run_id[:8]}"
        core = kubernetes.client.CoreV1Api(cluster.api_client())
        # dagster-k8s mounts the instance's config map; the step worker uses the instance ref in its args.
        core.create_namespaced_config_map(namespace, {"metadata": {"name": "dagster-instance"},
                                                      "data": {"dagster.yaml": ""}})
        kubernetes.client.BatchV1Api(cluster.api_client()).create_namespaced_job(namespace, construct_dagster_k8s_job(
            job_config=DagsterK8sJobConfig(job_image=WORKER_IMAGE, dagster_home="/opt/dagster/dagster_home",
                                           instance_config_map="dagster-instance"),
            args=["dagster", "api", "execute_step", step_args(shard(0))], job_name=job_name, pod_name=job_name,
            component="step_worker", user_defined_k8s_config=context.run_k8s_config,
            labels={"dagster/run-id": run.run_id, "shard": job_name}))
        pod = wait_for(lambda: core.list_namespaced_pod(namespace, label_selector=f"shard={job_name}").items,
                       what="the shard's pod")[0].metadata.name
        deadline = time.monotonic() + 240  # a hang guard only
        while core.read_namespaced_pod(pod, namespace).status.phase not in ("Succeeded", "Failed"):
            assert time.monotonic() < deadline, [(c.type, c.reason, c.message) for c in
                                                 core.read_namespaced_pod(pod, namespace).status.conditions or []]
            time.sleep(1)
        placed = core.read_namespaced_pod(pod, namespace)
        assert placed.status.phase == "Succeeded", real_node.why_failed(pod, namespace)
        assert placed.spec.node_name == "real-l4-0"
        assert placed.spec.containers[0].resources.limits["nvidia.com/gpu"] == "1"  # the class's placement

        on_this_host(shard(1))
        on_this_host(COMMIT)
        successes = {e.step_key for e in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_SUCCESS)}
        assert {PLAN, shard(0), shard(1), COMMIT} <= successes  # shard_0's success came from the pod

    calls = [line.rsplit("|", 1) for line in log.read_text().splitlines()]
    in_pod = {text for text, inside in calls if inside == "True"}
    assert len(in_pod) == 2000 and len(calls) == 4000  # half the rows, each once, computed inside the pod
    data = TableFiles(f"{db_uri}/docs.lance").dataset().to_table(columns=["text", "shout"]).to_pydict()
    assert all(value == text.upper() for text, value in zip(data["text"], data["shout"], strict=True))
