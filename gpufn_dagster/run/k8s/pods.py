"""A placement decided at launch, applied to the pod dagster-k8s assembles.

Two pods get one: the run worker of a GPU run (the launcher builds it) and each GPU step's or
shard's pod of a run placed per step (gpufn's executor builds those in the run worker, through
dagster-k8s's step handler). Both get the same treatment, so a step pod cannot be widened where a
run pod cannot: other containers asking for GPUs are refused (`check_no_extra_gpus`), and the
decided placement is enforced over every lower layer (`enforce_placement`).

The step pods' placements are not read from class files in the run worker: the launcher decided
them when the run launched, from the class files then and the run's `dagster/priority`, and put
them in the run worker's environment (`STEP_PLACEMENTS_ENV`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping

from dagster import DagsterEvent
from dagster_k8s.container_context import K8sContainerContext
from dagster_k8s.executor import K8sStepHandler
from dagster_k8s.job import UserDefinedDagsterK8sConfig

from ...private_ledger import EngineEventData, StepHandlerContext, adopt_step_handler, step_key_of
from ...errors import PlacementError
from ..placement import (K8S_CONFIG_SECTIONS, PodPlacement, check_no_extra_gpus, decode_step_placements, enforce_placement,
                        step_gpu_request)
from ..run_plan import STEP_PLACEMENTS_ENV

def placed_context(context: K8sContainerContext, decided: PodPlacement) -> K8sContainerContext:
    """`context` with the decided placement checked and enforced over everything it holds.

    `enforce_placement` overlays the class's whole configuration onto what the lower layers
    produced, so no separate merge is needed.
    """
    config = context.run_k8s_config
    check_no_extra_gpus(config.pod_spec_config or {}, decided)
    enforced = enforce_placement({section: getattr(config, section) for section in K8S_CONFIG_SECTIONS}, decided)
    return context._replace(run_k8s_config=UserDefinedDagsterK8sConfig(**enforced, merge_behavior=config.merge_behavior))


def step_placements_from_env(environ: Mapping[str, str] = os.environ) -> dict[str, PodPlacement]:
    """The step pods' placements the launcher decided for this run (the run worker's environment)."""
    text = environ.get(STEP_PLACEMENTS_ENV)
    if text is None:
        raise PlacementError(
            f"this run is placed per step, but its run worker has no {STEP_PLACEMENTS_ENV}: the GPU steps' pods "
            "are placed as gpufn's launcher (GpuK8sRunLauncher) decided at launch, and this run was not launched "
            "by it. Configure it as the instance's run_launcher and launch the run again")
    return decode_step_placements(text)


class GpuStepHandler(K8sStepHandler):
    """dagster-k8s's step handler, whose GPU step pods get the placement decided at launch.

    CPU steps' pods (plan, commit, CPU Functions) stay exactly as dagster-k8s makes them.
    """

    _placements: dict[str, PodPlacement]

    @classmethod
    def over(cls, handler: K8sStepHandler, placements: Mapping[str, PodPlacement]) -> GpuStepHandler:
        """`handler` as k8s_job_executor configured it (its client, image and config layers, taken
        whole so none is rebuilt differently here), with the decided placements as its last layer."""
        placing = adopt_step_handler(handler, cls)
        placing._placements = dict(placements)
        return placing

    @property
    def name(self) -> str:
        return "GpuStepHandler"

    def _decided(self, step_handler_context: StepHandlerContext) -> PodPlacement | None:
        step_key = step_key_of(self, step_handler_context)
        request = step_gpu_request(step_handler_context.step_tags[step_key])
        if request is None:
            return None
        if request not in self._placements:
            raise PlacementError(
                f"step {step_key!r} asks for {request}, for which no placement was decided at launch (decided: "
                f"{', '.join(sorted(self._placements)) or 'none'}); launch the run again")
        return self._placements[request]

    def _get_container_context(self, step_handler_context: StepHandlerContext) -> K8sContainerContext:
        context = super()._get_container_context(step_handler_context)
        decided = self._decided(step_handler_context)
        return context if decided is None else placed_context(context, decided)

    def launch_step(self, step_handler_context: StepHandlerContext) -> Iterator[DagsterEvent]:
        decided = self._decided(step_handler_context)
        if decided is not None:
            step_key = step_key_of(self, step_handler_context)
            kueue = {"Kueue priority class": decided.priority_class} if decided.priority_class else {}
            yield DagsterEvent.engine_event(
                step_handler_context.get_step_context(step_key),
                f"Step pod placement: {decided.describe()}, as decided at launch from the class files and the "
                "run's dagster/priority",
                EngineEventData({"GPU class": decided.gpu_class, "GPU count": decided.gpu_count,
                                 "Resource": decided.resource_name, **kueue}))
        yield from super().launch_step(step_handler_context)
