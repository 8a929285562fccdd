"""The executor of gpufn's definitions: a run mixing GPU classes on Kubernetes runs each step in its own pod.

One run worker pod sits on one node pool, so on Kubernetes a Materialize all over Functions of
several GPU classes cannot run its steps in the worker's processes. With this executor (the
default of `build_definitions`) the Kubernetes launcher places such a run per step -- the worker
a CPU pod, each GPU step a pod of dagster-k8s's `k8s_job_executor` on its class's node pool, as
decided at launch -- and tags it `gpufn/placement=per-step`; the executor reads that tag in the run
worker and hands the steps to `k8s_job_executor`, whose step handler applies the decided
placements (`run.k8s.pods.GpuStepHandler`). Every other run (one class, CPU only, and every run of the embedded
mode) runs its steps in processes of the worker, as Dagster's default executor does.

The step pods' own settings (`job_image`, `step_k8s_config`, ...: what `k8s_job_executor` takes)
go under `gpu_step_pods` in the run config's `execution.config`; they are checked against
`k8s_job_executor`'s schema only when a run uses step pods, so the embedded mode never imports
the Kubernetes client.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

import dagster as dg
from dagster import Executor, InitExecutorContext

from ..class_files import cached_gpu_classes
from ..private_ledger import EngineEventData, RetryMode, process_config
from ..errors import GpufnError
from ..tags import PLACEMENT_TAG, RunKind
from ..embedded import forkserver
from ..run.run_plan import STEP_PODS_FIELD


def placed_per_step(run_tags: Mapping[str, str]) -> bool:
    """Whether the launcher placed the run per step, so its steps go to their own pods.

    >>> placed_per_step({"gpufn/placement": "per-step"}), placed_per_step({"gpufn/placement": "local"})
    (True, False)
    """
    return run_tags.get(PLACEMENT_TAG) == RunKind.PER_STEP.value


def step_pods_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """`k8s_job_executor`'s config for the step pods: the `gpu_step_pods` settings, plus the
    retries and concurrency limits this executor was given, checked against its schema."""
    from dagster_k8s import k8s_job_executor

    raw = {**config.get(STEP_PODS_FIELD, {}), "retries": config["retries"]}
    for key in ("max_concurrent", "tag_concurrency_limits"):
        if config.get(key) is not None:
            raw[key] = config[key]
    result = process_config(k8s_job_executor.config_schema.config_type, raw)
    if not result.success:
        problems = "; ".join(error.message for error in result.errors or [])
        raise dg.DagsterInvalidConfigError(f"execution.config.{STEP_PODS_FIELD}: {problems}", result.errors, raw)
    return dict(result.value or {})


def local_step_limit() -> int:
    """Steps at once in the worker's processes: its CPUs for CPU steps, plus the local GPU slots of
    every class, since a GPU step mostly waits for its device (each class's pool caps its own steps).
    A refresh spread over 8 workers then runs on 8 GPUs of a workstation with fewer cores."""
    try:
        slots = sum(c.local.slots for c in cached_gpu_classes(None).values())
    except GpufnError:  # no class directory here: Dagster's default
        slots = 0
    return (os.cpu_count() or 1) + slots


# Every option of Dagster's multiprocess executor, as its own schema declares them (so none drifts or goes missing).
LOCAL_FIELDS: Mapping[str, dg.Field] = dg.multiprocess_executor.config_schema.config_type.fields

def local_executor_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The multiprocess executor's config of a run's in-worker steps: the options given, with gpufn's
    defaults for the two left unset -- a step limit counting the local GPU slots (`local_step_limit`)
    and steps forked from a forkserver that preloaded the engine (`forkserver.default_start_method`);
    `start_method: {spawn: {}}` brings back Dagster's default.

    >>> local_executor_config({"retries": {"enabled": {}}, "max_concurrent": 3})["start_method"]
    {'forkserver': {'preload_modules': [..., 'gpufn_dagster.refresh.engine', 'gpufn_dagster.embedded.step_preload']}}
    >>> local_executor_config({"max_concurrent": 3, "start_method": {"spawn": {}}})["start_method"]
    {'spawn': {}}
    """
    local = {key: config[key] for key in LOCAL_FIELDS if config.get(key) is not None}
    local.setdefault("max_concurrent", local_step_limit())
    local.setdefault("start_method", forkserver.default_start_method())
    return local


_steps_here = False


def steps_in_this_process() -> bool:
    """Whether this process is a run worker executing its run's steps itself (`in_process`): a GPU
    step must then leave its device to its slot's own process (`embedded.warm.warm_instances`)."""
    return _steps_here


class GpuClassesExecutor(Executor):
    """Steps in the worker's processes, or in their own pods for a run placed per step."""

    def __init__(self, init_context: InitExecutorContext):
        self._init_context = init_context
        self._job_module = getattr(init_context.job, "get_module", lambda: None)()
        config = init_context.executor_config
        self._local_config = local_executor_config(config)
        self._in_process = bool(config.get("in_process"))
        if self._in_process:
            self._local = dg.in_process_executor.executor_creation_fn(InitExecutorContext(
                job=init_context.job, executor_def=dg.in_process_executor, instance=init_context.instance,
                executor_config={"retries": config["retries"], "marker_to_close": None,
                                 **({"step_dependency_config": config["step_dependency_config"]}
                                    if config.get("step_dependency_config") is not None else {})}))
        else:
            self._local = dg.multiprocess_executor.executor_creation_fn(InitExecutorContext(
                job=init_context.job, executor_def=dg.multiprocess_executor, instance=init_context.instance,
                executor_config=self._local_config))

    @property
    def retries(self) -> RetryMode:
        return self._local.retries

    def execute(self, plan_context: Any, execution_plan: Any) -> Iterator[dg.DagsterEvent]:
        global _steps_here
        if not placed_per_step(plan_context.dagster_run.tags) and self._in_process:
            _steps_here = True
            forkserver.stop_ahead()
            yield from self._local.execute(plan_context, execution_plan)
            return
        if not placed_per_step(plan_context.dagster_run.tags):
            os.environ[forkserver.STEP_PRELOAD_ENV] = forkserver.preload_spec(plan_context.instance.get_ref())
            why = forkserver.fit(self._local_config["start_method"], self._job_module)
            if why is not None:
                yield dg.DagsterEvent.engine_event(plan_context, (
                    f"The step forkserver this run worker started ahead was stopped, {why}: the first step "
                    "starts the run's own."), EngineEventData({"Step forkserver started ahead": "stopped", "Why": why}))
            yield from self._local.execute(plan_context, execution_plan)
            return
        yield from step_pods_executor(self._init_context).execute(plan_context, execution_plan)


def step_pods_executor(init: InitExecutorContext, environ: Mapping[str, str] = os.environ) -> Executor:
    """`k8s_job_executor` as this executor's config sets it up, whose GPU steps' pods get the
    placements the launcher decided at launch (in the run worker's environment, `environ`)."""
    from dagster_k8s import k8s_job_executor

    from ..run.k8s.pods import GpuStepHandler, step_placements_from_env

    pods = k8s_job_executor.executor_creation_fn(InitExecutorContext(
        job=init.job, executor_def=k8s_job_executor, executor_config=step_pods_config(init.executor_config),
        instance=init.instance))
    # StepDelegatingExecutor keeps its handler in `_step_handler`; k8s_job_executor's own
    # construction of it (client, image, every config layer) stays untouched.
    pods._step_handler = GpuStepHandler.over(pods._step_handler, step_placements_from_env(environ))
    return pods


@dg.executor(
    name="gpufn",
    config_schema={
        **LOCAL_FIELDS,
        "max_concurrent": dg.Field(dg.Noneable(int), default_value=None, description=(
            "Steps at once: processes of the run worker (default: its CPU count plus every class's local GPU "
            "slots), or step pods.")),
        "start_method": dg.Field(LOCAL_FIELDS["start_method"].config_type, is_required=False, description=(
            "How the run worker starts its step processes: `spawn` (a fresh interpreter per step) or "
            "`forkserver` (each step forked from a server that imported `preload_modules` once). Default: "
            "forkserver preloading Dagster, Arrow, Lance, the engine and the run's instance storage.")),
        "in_process": dg.Field(bool, default_value=False, description=(
            "Run the steps one after another in the run worker's own process, as Dagster's in_process executor "
            "does, instead of a process each: no step start to pay, so a small refresh is done in seconds (the "
            "table and unfilled-rows sensors ask for it for small changes). GPU Functions then compute in their "
            "local slot's own process, never in the run worker. Not for runs on Kubernetes step pods.")),
        STEP_PODS_FIELD: dg.Field(dg.Permissive(), default_value={}, description=(
            "For a run that mixes GPU classes on Kubernetes: dagster_k8s k8s_job_executor's config of its "
            "step pods (job_image, step_k8s_config, ...).")),
    },
    requirements=dg.multiple_process_executor_requirements(),
)
def gpu_classes_executor(init_context: InitExecutorContext) -> Executor:
    """The default executor of `build_definitions`: a run mixing GPU classes on Kubernetes runs
    each step in its own pod on its class; every other run runs its steps in the worker's processes,
    with every option of Dagster's multiprocess executor (`start_method`, `step_dependency_config`, ...).

    Example:
        >>> from gpufn_dagster import build_definitions
        >>> import tempfile
        >>> defs = build_definitions(assets=[], db_uri=tempfile.mkdtemp())
        >>> defs.executor.name
        'gpufn'
    """
    return GpuClassesExecutor(init_context)
