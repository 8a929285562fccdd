"""A Kubernetes run launcher that places GPU runs on their class's node pool.

Configured in dagster.yaml like dagster-k8s's own launcher, plus an optional `classes_dir`:

    run_launcher:
      module: gpufn_dagster.launcher
      class: GpuK8sRunLauncher
      config:
        instance_config_map: dagster-instance
        service_account_name: dagster
        job_image: my-registry/my-code:latest
        classes_dir: /opt/gpufn/classes      # default: $GPUFN_CLASSES_DIR or ./classes

Asset tags never reach runs and the UI's Materialize button sends no run tags, so the GPU
request is read from the run's execution plan: the op tags `gpu_function` puts on each step.
The launcher writes the result onto the run (`gpufn/gpu-class`, `gpufn/gpu-count`) and an engine
event before the Job exists, and fails the run without creating anything when the request
cannot be placed.

Precedence of the run worker's pod configuration, lowest first: launcher config
(`run_k8s_config` and top-level fields) < code location container context < `dagster-k8s/config`
run tag < the GPU class. The class is merged last and then enforced (`placement.enforce_placement`):
node selector keys, tolerations, required node affinity, GPU resource and count come from the
class and cannot be overridden or widened. Runs with no GPU step go exactly the K8sRunLauncher way.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import kubernetes
import urllib3

from dagster import Field, Noneable, StringSource
from dagster._core.events import DagsterEventType, EngineEventData
from dagster._core.launcher import LaunchRunContext
from dagster._core.storage.dagster_run import DagsterRun
from dagster._utils.merger import merge_dicts
from dagster_k8s import K8sRunLauncher
from dagster_k8s.client import DagsterK8sAPIRetryLimitExceeded, DagsterK8sError, DagsterK8sUnrecoverableAPIError
from dagster_k8s.container_context import K8sContainerContext
from dagster_k8s.job import UserDefinedDagsterK8sConfig

from .classes import GpuClassError, cached_gpu_classes
from .placement import (Placement, PlacementError, check_no_extra_gpus, enforce_placement, gpu_requests,
                        resolve_placement)
from .tags import gpu_tags

PLACEMENT_TAG = "gpufn/placement"
# The config key the launcher and the local run coordinator add to their dagster.yaml schema.
CLASSES_DIR_CONFIG = {
    "classes_dir": Field(Noneable(StringSource), is_required=False, default_value=None,
                         description="Directory of GPU class files (default $GPUFN_CLASSES_DIR or ./classes)."),
}
_SECTIONS = ("container_config", "pod_template_spec_metadata", "pod_spec_config", "job_config", "job_metadata",
             "job_spec_config", "deployment_metadata", "service_metadata", "service_spec_config")


class KubernetesUnavailable(Exception):
    """The Kubernetes API did not answer when creating a GPU run's worker Job (down or unreachable)."""


class KubernetesRejected(Exception):
    """The Kubernetes API answered, and refused a GPU run's worker Job (4xx): re-executing will not help."""


# What a status code from the API server means for the person whose run failed.
_STATUS_MEANING = {
    400: "the API server refused the Job as malformed",
    401: "the launcher's credentials were not accepted",
    403: "the launcher's service account may not create Jobs in this namespace",
    404: "the namespace does not exist",
    409: "a Job with this run's name already exists (this run was launched before)",
    422: "the API server refused a field of the Job",
}


def _api_exception(err: BaseException) -> kubernetes.client.ApiException | None:
    """The API server's answer behind dagster-k8s's wrapped errors, None when no answer came."""
    for candidate in (err, getattr(err, "k8s_api_exception", None), err.__cause__, err.__context__):
        if isinstance(candidate, kubernetes.client.ApiException) and candidate.status:
            return candidate
    return None


def _api_message(answer: kubernetes.client.ApiException) -> str:
    """The API server's own message (it names the refused field: `spec.containers[0]...: Invalid value`)."""
    try:
        return str(json.loads(answer.body)["message"])[:500]
    except (TypeError, ValueError, KeyError):
        return f"{answer.status} {answer.reason}"


class GpuPlacementRejected(Exception):
    """The run's GPU request cannot be placed; no Kubernetes object was created."""


@functools.lru_cache(maxsize=256)
def _plan_step_tags(instance, snapshot_id: str) -> tuple[tuple[str, tuple[tuple[str, str], ...]], ...]:
    # Snapshot ids are content hashes, so a cached entry can never go stale; scheduled and
    # sensor runs repeat the same selection and skip the read.
    plan = instance.get_execution_plan_snapshot(snapshot_id)
    return tuple((step.key, tuple(sorted((step.tags or {}).items()))) for step in plan.steps)


def run_step_tags(instance, run: DagsterRun) -> list[dict[str, str]]:
    """The op tags of the steps this run will execute (from its stored execution plan)."""
    if not run.execution_plan_snapshot_id:
        return []
    selected = set(run.step_keys_to_execute or [])
    return [dict(tags) for key, tags in _plan_step_tags(instance, run.execution_plan_snapshot_id)
            if not selected or key in selected]


@functools.lru_cache(maxsize=256)
def _job_launches_step_pods(instance, job_snapshot_id: str) -> bool:
    # k8s_job_executor's config schema is the only one with per_step_k8s_config; the job snapshot
    # (content-addressed) records the executor's schema, nothing else names the executor.
    snapshot = instance.get_job_snapshot(job_snapshot_id)
    return any("per_step_k8s_config" in {f.name for f in (config.fields or [])}
               for config in snapshot.config_schema_snapshot.all_config_snaps_by_key.values())


def uses_step_pods(instance, run: DagsterRun) -> bool:
    """Whether the run's steps run in their own pods (k8s_job_executor), each placed by its op tags."""
    return bool(run.job_snapshot_id) and _job_launches_step_pods(instance, run.job_snapshot_id)


def placement_for_run(instance, run: DagsterRun, classes_dir: str | None) -> Placement | None:
    """The run worker's GPU placement, None for a CPU run; raises PlacementError / GpuClassError.

    With k8s_job_executor the run worker only orchestrates: it stays a CPU pod, and each GPU
    step's pod carries its own class (op tags), so a run may mix classes. Each class requested
    is still checked here, so an unknown class or too many GPUs fail before anything starts.
    """
    requests = gpu_requests(run_step_tags(instance, run))
    if not requests:
        return None
    classes = cached_gpu_classes(classes_dir)
    if uses_step_pods(instance, run):
        for name, count in requests.items():
            resolve_placement({name: count}, classes)
        return None
    return resolve_placement(requests, classes)


class GpuK8sRunLauncher(K8sRunLauncher):
    """K8sRunLauncher whose GPU runs land on their class's node pool with the class's GPU limits."""

    def __init__(self, *args: Any, classes_dir: str | None = None, **kwargs: Any):
        self._classes_dir = classes_dir
        self._placements: dict[str, Placement | None] = {}  # run id -> placement, resolved once per launch
        super().__init__(*args, **kwargs)

    @classmethod
    def config_type(cls):
        return merge_dicts(K8sRunLauncher.config_type(), CLASSES_DIR_CONFIG)

    @property
    def classes_dir(self) -> str | None:
        return self._classes_dir

    def placement(self, run: DagsterRun) -> Placement | None:
        if run.run_id in self._placements:
            return self._placements[run.run_id]
        return placement_for_run(self._instance, run, self._classes_dir)

    def _api_host(self) -> str:
        return self._api_client.batch_api.api_client.configuration.host

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        requests = gpu_requests(run_step_tags(self._instance, run))
        try:
            placement = self._placements[run.run_id] = self.placement(run)
            if requests:
                # Sidecars and init containers are outside the class's enforcement of the main
                # container: they may not ask for GPUs at all.
                config = super().get_container_context_for_run(run).run_k8s_config
                check_no_extra_gpus(config.pod_spec_config or {}, placement)
        except (PlacementError, GpuClassError) as err:
            self._placements.pop(run.run_id, None)
            self._instance.add_run_tags(run.run_id, {PLACEMENT_TAG: "rejected"})
            raise GpuPlacementRejected(f"GPU run not launched (no Kubernetes Job was created): {err}") from None
        if not requests:
            self._placements.pop(run.run_id, None)
            super().launch_run(context)  # a CPU run: exactly K8sRunLauncher, its errors included
            return
        if placement is None and uses_step_pods(self._instance, run):
            self._instance.add_run_tags(run.run_id, {PLACEMENT_TAG: "per-step"})
            self._instance.report_engine_event(
                "GPU placement per step: the run worker is a CPU pod; k8s_job_executor places each GPU step's pod "
                "on its class's node pool", run, cls=self.__class__)
        if placement is not None:
            gpu_class = placement.gpu_class
            self._instance.add_run_tags(run.run_id, {**gpu_tags(gpu_class.name, placement.gpu_count),
                                                     PLACEMENT_TAG: "gpu"})
            self._instance.report_engine_event(
                f"GPU placement: {placement.describe()}",
                run,
                EngineEventData({
                    "GPU class": gpu_class.name,
                    "GPU model": gpu_class.gpu_model,
                    "GPU count": placement.gpu_count,
                    "Resource": gpu_class.resource_name,
                    "Node selector": ", ".join(f"{k}={v}" for k, v in sorted(gpu_class.node_selector.items())),
                    "Tolerations": ", ".join(f"{t.key}:{t.effect}" for t in gpu_class.tolerations),
                }),
                cls=self.__class__,
            )
        try:
            super().launch_run(context)
        except (DagsterK8sError, DagsterK8sAPIRetryLimitExceeded, DagsterK8sUnrecoverableAPIError,
                urllib3.exceptions.HTTPError, kubernetes.client.ApiException) as err:
            raise self._launch_error(err) from err
        finally:
            self._placements.pop(run.run_id, None)

    def _launch_error(self, err: BaseException) -> Exception:
        """Say what a failed Job creation means: an API that did not answer, or one that refused."""
        where = f"the Kubernetes API at {self._api_host()} (namespace {self.job_namespace!r})"
        answer = _api_exception(err)
        status = int(answer.status) if answer is not None else None
        if answer is not None and 400 <= answer.status < 500:
            meaning = _STATUS_MEANING.get(answer.status, "the API server refused the request")
            return KubernetesRejected(
                f"could not create the GPU run worker Job: {where} answered {answer.status}: {meaning}: "
                f"{_api_message(answer)}. Re-executing the run will not help until that is fixed.")
        detail = _api_message(answer) if answer is not None else (
            f"{type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}")
        answered = f"answered {status}" if status is not None else "did not answer"
        return KubernetesUnavailable(
            f"could not create the GPU run worker Job: {where} {answered} ({detail}). No Job was created; "
            "re-execute the run once the API answers.")

    def terminate(self, run_id: str) -> bool:
        """K8sRunLauncher's terminate; a GPU run whose worker never started is then canceled at once.

        Deleting the Job of a run that waits for capacity removes the only process that could
        acknowledge the cancel, so without this the run would sit in CANCELING until Dagster's
        cancel timeout. CPU runs keep dagster-k8s's behaviour exactly.
        """
        run = self._instance.get_run_by_id(run_id)
        gpu_run = run is not None and run.tags.get(PLACEMENT_TAG) in ("gpu", "per-step")
        started = run is not None and bool(self._instance.get_records_for_run(
            run_id, of_type=DagsterEventType.RUN_START, limit=1).records)
        terminated = super().terminate(run_id)
        if terminated and gpu_run and not started:
            self._instance.report_run_canceled(
                self._instance.get_run_by_id(run_id),
                message="Canceled before its run worker started: its Kubernetes Job and waiting pod were deleted")
        return terminated

    def get_container_context_for_run(self, dagster_run: DagsterRun) -> K8sContainerContext:
        context = super().get_container_context_for_run(dagster_run)
        placement = self.placement(dagster_run)
        if placement is None:
            return context
        # enforce_placement overlays the class's whole configuration (placement_k8s_config) onto
        # what the lower layers produced, so no separate merge is needed.
        config = context.run_k8s_config
        enforced = enforce_placement({s: getattr(config, s) for s in _SECTIONS}, placement)
        return context._replace(run_k8s_config=UserDefinedDagsterK8sConfig(
            **enforced, merge_behavior=config.merge_behavior))
