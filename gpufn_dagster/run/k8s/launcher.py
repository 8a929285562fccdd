"""A Kubernetes run launcher that places GPU runs on their class's node pool.

Configured in dagster.yaml like dagster-k8s's own launcher, plus an optional `classes_dir`:

    run_launcher:
      module: gpufn_dagster         # the package exports GpuK8sRunLauncher
      class: GpuK8sRunLauncher
      config:
        instance_config_map: dagster-instance
        service_account_name: dagster
        job_image: my-registry/my-code:latest
        classes_dir: /opt/gpufn/classes      # default: $GPUFN_CLASSES_DIR or ./classes

Asset tags never reach runs and the UI's Materialize button sends no run tags, so the GPU
request is read from the run's execution plan: the op tags `gpu_function` puts on each step.
The launcher writes the result onto the run (`gpufn/gpu-class`, hidden `.dagster/gpufn-gpu-count`) and an engine
event before the Job exists, and fails the run without creating anything when the request
cannot be placed.

Precedence of the run worker's pod configuration, lowest first: launcher config
(`run_k8s_config` and top-level fields) < code location container context < `dagster-k8s/config`
run tag < the GPU class. The class is merged last and then enforced (`placement.enforce_placement`):
node selector keys, tolerations, required node affinity, GPU resource and count come from the
class and cannot be overridden or widened. Runs with no GPU step go exactly the K8sRunLauncher way.

A run placed per step gets its step pods' placements decided here too, at launch, from the class
files as they are now and the run's `dagster/priority`: they travel to the run worker in its
environment (`STEP_PLACEMENTS_ENV`), and gpufn's executor applies them, with the same refusals and
enforcement, to each GPU step's and shard's pod (`run.step_pods`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kubernetes
from dagster import DagsterEventType, DagsterRun
from dagster_k8s import K8sRunLauncher
from dagster_k8s.job import get_job_name_from_run_id
from dagster_k8s.container_context import K8sContainerContext

from ...class_files import ClassesDir, resolve_classes_dir
from ...private_ledger import EngineEventData, HoldsInstance, LaunchRunContext, k8s_api_host
from ...errors import GpuClassError, GpuPlacementRejected, PlacementError
from ...tags import PLACEMENT_REJECTED, PLACEMENT_TAG, RunKind, run_gpu_tags
from .client import API_ERRORS, api_error, call, client_without_retries
from .pods import placed_context
from ..claims import claim_template, owned_by
from ..placement import POD_SPEC_CONFIG, PodPlacement, check_no_extra_gpus, encode_step_placements
from ..run_plan import CLASSES_DIR_CONFIG, STEP_PLACEMENTS_ENV, STEP_PODS_FIELD, RunPlan, plan_run

class GpuK8sRunLauncher(HoldsInstance, K8sRunLauncher):
    """K8sRunLauncher whose GPU runs land on their class's node pool with the class's GPU limits.

    Args:
        classes_dir: the directory of GPU class files (default `$GPUFN_CLASSES_DIR`, else `./classes`);
            every other argument is K8sRunLauncher's.
    """

    def __init__(self, *args: Any, classes_dir: str | None = None, **kwargs: Any):
        self._classes_dir = classes_dir
        self._plans: dict[str, RunPlan] = {}  # run id -> its plan, made once per launch
        super().__init__(*args, **kwargs)

    @classmethod
    def config_type(cls):
        return {**K8sRunLauncher.config_type(), **CLASSES_DIR_CONFIG}

    @property
    def classes_dir(self) -> ClassesDir:
        return self._classes_dir

    def plan(self, run: DagsterRun) -> RunPlan:
        """The run's plan (CPU, GPU or per-step); raises PlacementError / GpuClassError."""
        if run.run_id in self._plans:
            return self._plans[run.run_id]
        return plan_run(self.instance, run, self._classes_dir)

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        try:
            plan = self._plans[run.run_id] = self._checked_plan(run)
            if plan.kind is RunKind.CPU:
                super().launch_run(context)  # exactly K8sRunLauncher, its errors included
                return
            self._report_placement(run, plan)
            namespace = self.get_container_context_for_run(run).namespace or self.job_namespace
            claims = self._create_claim_templates(run, plan, namespace)
            try:
                super().launch_run(context)
            except API_ERRORS as err:
                self._delete_claim_templates(claims, namespace)
                raise api_error(
                    err, "create the GPU run worker Job",
                    f"the Kubernetes API at {k8s_api_host(self)} "
                    f"(namespace {self.job_namespace!r})",
                    when_unavailable="No Job was created; re-execute the run once the API answers.",
                    when_rejected="Re-executing the run will not help until that is fixed.") from err
            self._own_claim_templates(run, claims, namespace)
        finally:
            self._plans.pop(run.run_id, None)

    def _checked_plan(self, run: DagsterRun) -> RunPlan:
        """The run's plan, refusing (before any Kubernetes object exists) a request that cannot be placed."""
        try:
            plan = self.plan(run)
            if plan.kind is RunKind.GPU:
                # Sidecars and init containers are outside the class's enforcement of the main
                # container: they may not ask for GPUs at all.
                config = super().get_container_context_for_run(run).run_k8s_config
                check_no_extra_gpus(config.pod_spec_config or {}, plan.pod)
            elif plan.kind is RunKind.PER_STEP:
                # The step pods' own config in the run config is known now: refuse it before any Job
                # exists (the executor checks each step pod's whole config again when it builds it).
                for decided in plan.step_placements.values():
                    for pod_spec in _step_pod_specs(run.run_config):
                        check_no_extra_gpus(pod_spec, decided)
        except (PlacementError, GpuClassError) as err:
            self.instance.add_run_tags(run.run_id, {PLACEMENT_TAG: PLACEMENT_REJECTED})
            raise GpuPlacementRejected(f"GPU run not launched (no Kubernetes Job was created): {err}") from None
        return plan

    def _create_claim_templates(self, run: DagsterRun, plan: RunPlan, namespace: str) -> list[str]:
        """The ResourceClaimTemplates of the run's DRA pods, created before its Job (so no pod ever
        names a missing one); the apiserver compiles their CEL selectors as it does every claim's.
        A template it refuses fails the launch before any Job exists, with the apiserver's words."""
        resource = kubernetes.client.ResourceV1Api(client_without_retries())
        created: list[str] = []
        for claim in plan.claims:
            body = claim_template(claim["name"], claim["spec"], {"dagster/run-id": run.run_id})
            try:
                call(resource.create_namespaced_resource_claim_template, namespace, body)
            except API_ERRORS as err:
                self._delete_claim_templates(created, namespace)
                raise api_error(
                    err, f"create the DRA claim template {claim['name']}", f"the Kubernetes API at {k8s_api_host(self)} "
                    f"(namespace {namespace!r})", when_unavailable="No Job was created; re-execute the run once the "
                    "API answers.", when_rejected="No Job was created: fix the GPU class's dra section (the "
                    "apiserver's words are above) and launch the run again.") from err
            created.append(claim["name"])
        return created

    def _own_claim_templates(self, run: DagsterRun, names: list[str], namespace: str) -> None:
        """Make the run's claim templates owned by its Job, so Kubernetes deletes them with it."""
        if not names:
            return
        batch = kubernetes.client.BatchV1Api(client_without_retries())
        resource = kubernetes.client.ResourceV1Api(client_without_retries())
        job = call(batch.read_namespaced_job, get_job_name_from_run_id(run.run_id), namespace)
        for name in names:
            call(resource.patch_namespaced_resource_claim_template, name, namespace, owned_by(job))
        self.instance.report_engine_event(
            f"Created {len(names)} DRA claim template(s), owned by the run's Job: {', '.join(names)}", run,
            EngineEventData({"Claim templates": ", ".join(names), "Namespace": namespace}), cls=self.__class__)

    def _delete_claim_templates(self, names: list[str], namespace: str) -> None:
        resource = kubernetes.client.ResourceV1Api(client_without_retries())
        for name in names:
            try:
                call(resource.delete_namespaced_resource_claim_template, name, namespace)
            except API_ERRORS:
                pass  # nothing names it: a leftover template holds no device

    def _report_placement(self, run: DagsterRun, plan: RunPlan) -> None:
        """Tags and an event on the run saying where its GPU work goes, before its Job exists."""
        if plan.kind is RunKind.PER_STEP:
            self.instance.add_run_tags(run.run_id, {PLACEMENT_TAG: RunKind.PER_STEP.value})
            mixed = (f" (the run mixes GPU classes {', '.join(plan.classes)}, which one worker pod cannot serve)"
                     if len(plan.classes) > 1 else
                     f" (the run spreads the refresh of {', '.join(plan.fanned_out)} over several GPU workers, "
                     "a step pod per shard)" if plan.fanned_out else "")
            self.instance.report_engine_event(
                f"GPU placement per step{mixed}: the run worker is a CPU pod; each GPU step's pod goes to its "
                f"class's node pool as decided now, at launch, from the class files in {self._classes_dir_shown()}",
                run, EngineEventData({"GPU classes": ", ".join(plan.classes), **{
                    f"Step pods {key}": _decided_text(decided) for key, decided in sorted(plan.step_placements.items())}}),
                cls=self.__class__)
            return
        placement = plan.placement
        gpu_class = placement.gpu_class
        self.instance.add_run_tags(run.run_id, {**run_gpu_tags(placement.request, placement.gpu_count),
                                                 PLACEMENT_TAG: RunKind.GPU.value})
        queued = (f"; Kueue admits it from LocalQueue {gpu_class.kueue.local_queue!r} (its Job stays suspended "
                  "until then)" if gpu_class.kueue else "")
        either = " or ".join if placement.alternatives else "".join
        self.instance.report_engine_event(
            f"GPU placement: {placement.describe()}{queued}"
            + (" -- the first of them with room, as the scheduler finds it" if placement.alternatives else ""),
            run,
            EngineEventData({
                "GPU class": placement.request,
                "GPU model": either(c.gpu_model for c in placement.accepted),
                "GPU count": placement.gpu_count,
                "Resource": gpu_class.requested_as,
                "Node selector": either(", ".join(f"{k}={v}" for k, v in sorted(c.node_selector.items()))
                                        for c in placement.accepted),
                "Tolerations": ", ".join(sorted({f"{t.key}:{t.effect}" for c in placement.accepted
                                                 for t in c.tolerations})),
                **({"Kueue LocalQueue": gpu_class.kueue.local_queue,
                    "Kueue priority class": gpu_class.kueue.priority_class_for(placement.priority) or "(Kueue's default)"}
                   if gpu_class.kueue else {}),
            }),
            cls=self.__class__,
        )

    def terminate(self, run_id: str) -> bool:
        """K8sRunLauncher's terminate; a GPU run whose worker never started is then canceled at once.

        Deleting the Job of a run that waits for capacity removes the only process that could
        acknowledge the cancel, so without this the run would sit in CANCELING until Dagster's
        cancel timeout. CPU runs keep dagster-k8s's behaviour exactly.
        """
        run = self.instance.get_run_by_id(run_id)
        gpu_run = run is not None and run.tags.get(PLACEMENT_TAG) in (RunKind.GPU.value, RunKind.PER_STEP.value)
        started = run is not None and bool(self.instance.get_records_for_run(
            run_id, of_type=DagsterEventType.RUN_START, limit=1).records)
        terminated = super().terminate(run_id)
        if terminated and gpu_run and not started:
            self.instance.report_run_canceled(
                self.instance.get_run_by_id(run_id),
                message="Canceled before its run worker started: its Kubernetes Job and waiting pod were deleted")
        return terminated

    def get_container_context_for_run(self, dagster_run: DagsterRun) -> K8sContainerContext:
        context = super().get_container_context_for_run(dagster_run)
        plan = self.plan(dagster_run)
        if plan.kind is RunKind.PER_STEP:  # the step pods' placements, decided at launch, to the run worker
            return context.merge(K8sContainerContext(
                env=[{"name": STEP_PLACEMENTS_ENV, "value": encode_step_placements(plan.step_placements)}]))
        if plan.pod is None:
            return context
        return placed_context(context, plan.pod)  # applied as decided at launch

    def _classes_dir_shown(self) -> str:
        return str(resolve_classes_dir(self._classes_dir))


def _decided_text(decided: PodPlacement) -> str:
    kueue = f", Kueue priority class {decided.priority_class}" if decided.priority_class else ""
    return f"{decided.describe()}{kueue}"


def _step_pod_specs(run_config: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The pod_spec_config sections a run's config gives its step pods (gpufn executor's `gpu_step_pods`)."""
    execution = (run_config or {}).get("execution") or {}
    config = (execution.get("config") or next((v.get("config") for v in execution.values()
                                               if isinstance(v, Mapping) and "config" in v), None) or {})
    pods = config.get(STEP_PODS_FIELD) or {}
    layers = [pods.get("step_k8s_config") or {}, *(pods.get("per_step_k8s_config") or {}).values()]
    return [layer.get(POD_SPEC_CONFIG) or {} for layer in layers if isinstance(layer, Mapping)]
