"""Per-run cost of class resolution + pod-spec building in the launcher, side by side with
dagster-k8s's K8sRunLauncher on the same runs (the Kubernetes API call itself is stubbed out, so
this measures the launcher's own work: reading the run's plan, loading classes, merging configs,
building the V1Job, recording tags and events in a real Dagster instance).

    .venv/bin/python bench/placement_bench.py --runs 200
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import yaml
from dagster._core.launcher import LaunchRunContext
from dagster._core.test_utils import in_process_test_workspace, instance_for_test
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster_graphql.client.query import LAUNCH_PIPELINE_EXECUTION_MUTATION
from dagster_graphql.test.utils import execute_dagster_graphql
from dagster_k8s import K8sRunLauncher

from gpufn_dagster import GpuK8sRunLauncher

REPO = Path(__file__).resolve().parents[1]
DEFS = REPO / "tests" / "integration" / "k8s_defs.py"


def queue_runs(instance, asset: str, count: int) -> list:
    origin = LoadableTargetOrigin(python_file=str(DEFS), attribute="defs")
    with in_process_test_workspace(instance, origin) as context:
        (location,) = context.code_location_names
        for _ in range(count):
            execute_dagster_graphql(context, LAUNCH_PIPELINE_EXECUTION_MUTATION, variables={"executionParams": {
                "selector": {"repositoryLocationName": location, "repositoryName": "__repository__",
                             "pipelineName": "__ASSET_JOB", "assetSelection": [{"path": [asset]}]},
                "mode": "default"}})
    return [r for r in instance.get_runs(limit=count)]


def timed_launches(launcher, instance, runs) -> list[float]:
    launcher.register_instance(instance)
    launcher._api_client.create_namespaced_job_with_retries = lambda body, namespace: None
    times = []
    for run in runs:
        started = time.perf_counter()
        launcher.launch_run(LaunchRunContext(dagster_run=run, workspace=None))
        times.append((time.perf_counter() - started) * 1000)
    return times


def timed_pod_specs(launcher, instance, runs) -> list[float]:
    """Class resolution + pod-spec building only: the run's plan, classes, merged config, V1Job."""
    from dagster_k8s.job import construct_dagster_k8s_job

    launcher.register_instance(instance)
    times = []
    for run in runs:
        started = time.perf_counter()
        context = launcher.get_container_context_for_run(run)
        construct_dagster_k8s_job(job_config=context.get_k8s_job_config(job_image="img", run_launcher=launcher),
                                  args=["dagster"], job_name="dagster-run-x", pod_name="dagster-run-x",
                                  component="run_worker", user_defined_k8s_config=context.run_k8s_config)
        times.append((time.perf_counter() - started) * 1000)
    return times


def timed_resolution(instance, runs) -> list[float]:
    """Class resolution only: read the run's execution plan, take its steps' GPU tags, resolve the class."""
    from gpufn_dagster.run.run_plan import plan_run

    times = []
    for run in runs:
        started = time.perf_counter()
        plan_run(instance, run, str(REPO / "classes"))
        times.append((time.perf_counter() - started) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp())
    kubeconfig = work / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "x", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "x", "user": {"token": "x"}}], "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}]}))
    common = {"instance_config_map": "dagster-instance", "service_account_name": "default", "load_incluster_config": False,
              "kubeconfig_file": str(kubeconfig), "job_image": "img", "dagster_home": "/opt/dagster/dagster_home"}
    with instance_for_test() as instance:
        gpu_runs = queue_runs(instance, "frames__emb_a100", args.runs)
        cpu_runs = queue_runs(instance, "frames__words", args.runs)
        rows = [
            ("class resolution only (plan read + classes), GPU run", timed_resolution(instance, gpu_runs)),
            ("pod spec only: GpuK8sRunLauncher, GPU run",
             timed_pod_specs(GpuK8sRunLauncher(classes_dir=str(REPO / "classes"), **common), instance, gpu_runs)),
            ("pod spec only: K8sRunLauncher, CPU run", timed_pod_specs(K8sRunLauncher(**common), instance, cpu_runs)),
            ("whole launch_run: GpuK8sRunLauncher, GPU run (a100-80gb x2)",
             timed_launches(GpuK8sRunLauncher(classes_dir=str(REPO / "classes"), **common), instance, gpu_runs)),
            ("whole launch_run: GpuK8sRunLauncher, CPU run", timed_launches(GpuK8sRunLauncher(classes_dir=str(REPO / "classes"), **common),
                                                          instance, cpu_runs)),
            ("whole launch_run: K8sRunLauncher, same CPU run", timed_launches(K8sRunLauncher(**common), instance, cpu_runs)),
        ]
    print("| launcher, run | median ms | p95 ms |\n| --- | --- | --- |")
    for name, times in rows:
        times = sorted(times[min(5, len(times) // 2):])  # drop warm-up (fewer on a tiny smoke run)
        print(f"| {name} | {statistics.median(times):.2f} | {times[int(len(times) * 0.95)]:.2f} |")


if __name__ == "__main__":
    main()
