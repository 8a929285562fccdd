"""What the embedded path and the Kubernetes path share: reading a run, and one value that says how it runs.

Both the local slots (`embedded.coordinator`) and the Kubernetes launcher (`run.k8s.launcher`) need the GPU
request of a run -- read from the op tags of the steps it executes, since the UI's Materialize
button sends no run tags -- and the same `classes_dir` config field. They live here, beneath both
paths, so neither imports the other and the embedded mode never imports the Kubernetes client.
"""

from __future__ import annotations

import enum
import functools
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from dagster import DagsterInstance, DagsterRunStatus, Field, Noneable, RunsFilter, StringSource
from dagster import DagsterRun

from ..class_files import cached_gpu_classes, ClassesDir
from ..classes import GpuClass
from ..errors import PlacementError
from ..tags import (CAPACITY_REASON_TAG, CAPACITY_TAG, GOT_CLASS_TAG, GPU_CLASS_TAG, SHARD_TAG,
                    WAIT_ESTIMATE_TAG, ENDED_WAITING, CapacityReason, CapacityState, RunKind, waiting_since)
from .claims import claim_template_name
from .kueue import run_priority
from .placement import PodPlacement, Placement, gpu_requests, request_key, resolve_placement, step_request

# The config key the Kubernetes launcher and the local run coordinator add to their dagster.yaml schema.
CLASSES_DIR_CONFIG = {
    "classes_dir": Field(Noneable(StringSource), is_required=False, default_value=None,
                         description="Directory of GPU class files (default $GPUFN_CLASSES_DIR or ./classes)."),
}


@functools.lru_cache(maxsize=256)
def _plan_step_tags(instance: DagsterInstance, snapshot_id: str) -> tuple[tuple[str, tuple[tuple[str, str], ...]], ...]:
    # Snapshot ids are content hashes, so a cached entry can never go stale; scheduled and
    # sensor runs repeat the same selection and skip the read.
    plan = instance.get_execution_plan_snapshot(snapshot_id)
    return tuple((step.key, tuple(sorted((step.tags or {}).items()))) for step in plan.steps)


def run_step_tags(instance: DagsterInstance, run: DagsterRun) -> list[dict[str, str]]:
    """The op tags of the steps this run will execute (from its stored execution plan)."""
    if not run.execution_plan_snapshot_id:
        return []
    selected = set(run.step_keys_to_execute or [])
    return [dict(tags) for key, tags in _plan_step_tags(instance, run.execution_plan_snapshot_id)
            if not selected or key in selected]


# The config field of gpufn's executor (`assets.executor`): it names that executor to the launcher,
# which sees a job's executor only through its config schema.
STEP_PODS_FIELD = "gpu_step_pods"
# The run worker's environment variable that carries the step pods' placements decided at launch
# (`placement.encode_step_placements`) from the launcher to gpufn's executor.
STEP_PLACEMENTS_ENV = "GPUFN_STEP_PLACEMENTS"


class StepPods(enum.Enum):
    """When a job's executor runs steps in their own pods."""

    NEVER = "never"  # Dagster's default and other executors: every step in the run worker
    ALWAYS = "always"  # dagster-k8s's k8s_job_executor
    WHEN_CLASSES_MIX = "when-classes-mix"  # gpufn's executor


@functools.lru_cache(maxsize=256)
def _job_step_pods(instance: DagsterInstance, job_snapshot_id: str) -> StepPods:
    # The job snapshot (content-addressed) records the executor's config schema, and nothing else
    # names the executor: k8s_job_executor's is the only one with per_step_k8s_config, gpufn's the
    # only one with STEP_PODS_FIELD.
    snapshot = instance.get_job_snapshot(job_snapshot_id)
    names = {f.name for config in snapshot.config_schema_snapshot.all_config_snaps_by_key.values()
             for f in (config.fields or [])}
    if "per_step_k8s_config" in names:
        return StepPods.ALWAYS
    return StepPods.WHEN_CLASSES_MIX if STEP_PODS_FIELD in names else StepPods.NEVER


@dataclass(frozen=True)
class RunPlan:
    """The one value a launcher acts on, made once at launch: the run's kind, and where its GPU
    pods go -- for a GPU run its worker's placement, for a run placed per step each GPU request's
    (class x count) step pod placement -- from the class files as they are now, with the run's
    `dagster/priority`."""

    kind: RunKind
    placement: Placement | None = None
    pod: PodPlacement | None = None  # a GPU run: its worker pod's placement, decided from `placement`
    classes: tuple[str, ...] = ()  # per step: the GPU classes its step pods go to
    fanned_out: tuple[str, ...] = ()  # per step: Functions whose refresh spreads over several shard pods
    step_placements: Mapping[str, PodPlacement] = field(default_factory=dict)  # per step: request_key -> pod

    @property
    def claims(self) -> list[Mapping[str, Any]]:
        """The DRA claim templates its GPU pods name ({"name", "spec"}), which the launcher creates with the run."""
        pods = [self.pod] if self.pod else list(self.step_placements.values())
        return [pod.claim for pod in pods if pod is not None and pod.claim is not None]


def _step_placements(step_tags: list[dict[str, str]], classes_dir: ClassesDir, priority: int,
                     run_id: str) -> dict[str, PodPlacement]:
    """Each distinct GPU request of the run's steps (class x count), placed on its own."""
    classes = cached_gpu_classes(classes_dir)
    out: dict[str, PodPlacement] = {}
    for request in filter(None, map(step_request, step_tags)):
        if (key := request_key(*request)) not in out:
            placement = resolve_placement(dict([request]), classes)
            out[key] = PodPlacement.decide(replace(placement, priority=priority), claim_template_name(run_id, key))
    return out


def class_placements(instance: DagsterInstance, run: DagsterRun, classes_dir: ClassesDir) -> dict[str, Placement]:
    """Each GPU class the run's steps ask for, placed on its own; raises PlacementError /
    GpuClassError for an unknown class or too many GPUs, so those fail before anything starts."""
    requests = gpu_requests(run_step_tags(instance, run))
    if not requests:  # a CPU run: it never depends on the class files, valid or not
        return {}
    classes = cached_gpu_classes(classes_dir)
    return {name: resolve_placement({name: count}, classes) for name, count in requests.items()}


def plan_run(instance: DagsterInstance, run: DagsterRun, classes_dir: ClassesDir) -> RunPlan:
    """The run's plan on Kubernetes; raises PlacementError / GpuClassError when its GPU request
    cannot be placed.

    With step pods -- gpufn's executor, when the run mixes GPU classes or spreads a refresh over
    several workers (shard steps) -- the run worker only orchestrates: it stays a CPU pod, and each
    GPU step's pod gets the placement decided here for its request. Without step pods, one worker
    runs every step, so all must share one class.
    """
    step_tags = run_step_tags(instance, run)
    requests = gpu_requests(step_tags)
    if not requests:
        return RunPlan(RunKind.CPU)
    mode = _job_step_pods(instance, run.job_snapshot_id) if run.job_snapshot_id else StepPods.NEVER
    if mode is StepPods.ALWAYS:
        raise PlacementError(
            "its job runs on dagster_k8s's k8s_job_executor, which would build its GPU steps' pods from op tags "
            "alone, with no GPU class placement. gpufn's executor runs the steps of such a run in their own pods "
            "the same way, each GPU step's pod placed on its class as decided at launch: use gpu_classes_executor "
            "(build_definitions' default, or define_asset_job(..., executor_def=gpu_classes_executor))")
    priority = run_priority(run.tags)
    fanned_out = tuple(sorted({tags[SHARD_TAG] for tags in step_tags if SHARD_TAG in tags}))  # shard steps
    if mode is StepPods.WHEN_CLASSES_MIX and (len(requests) > 1 or fanned_out):
        return RunPlan(RunKind.PER_STEP, classes=tuple(sorted(requests)), fanned_out=fanned_out,
                       step_placements=_step_placements(step_tags, classes_dir, priority, run.run_id))
    placement = replace(resolve_placement(requests, cached_gpu_classes(classes_dir)), priority=priority)
    return RunPlan(RunKind.GPU, placement, PodPlacement.decide(
        placement, claim_template_name(run.run_id, request_key(placement.request, placement.gpu_count))))


# What a run's capacity tag says while it waits for or holds GPU capacity (not once it failed for it).
_HOLDING = [CapacityState.WAITING, CapacityState.RUNNING, CapacityState.SCHEDULED, CapacityState.GATED,
            CapacityState.FAILING, CapacityState.REPLACING]
_ENDED = [DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED]


def release_ended_runs(instance: DagsterInstance, limit: int = 100) -> list[str]:
    """Mark runs that ended while their tag still said they wait for or hold GPUs as `released`.

    Nothing in Dagster tells a launcher that a run ended, so both paths call this on their own
    beat (the embedded queue's every pass, the watcher's every tick): the runs list then shows
    which runs hold GPUs now, not which ever did. Returns the run ids it marked.
    """
    runs = instance.get_runs(RunsFilter(statuses=_ENDED, tags={CAPACITY_TAG: [s.value for s in _HOLDING]}),
                             limit=limit)
    for run in runs:
        ended_waiting = run.tags.get(CAPACITY_TAG) == CapacityState.WAITING.value and WAIT_ESTIMATE_TAG in run.tags
        instance.add_run_tags(run.run_id, {CAPACITY_TAG: CapacityState.RELEASED.value,
                                           CAPACITY_REASON_TAG: CapacityReason.RUN_ENDED.value,
                                           **({WAIT_ESTIMATE_TAG: ENDED_WAITING} if ended_waiting else {})})
    return [run.run_id for run in runs]


def waiting_runs(instance: DagsterInstance, now: float | None = None) -> dict[str, list[tuple[str, float, str]]]:
    """GPU class -> (run id, seconds waited, wait estimate) of every run waiting for capacity, longest first.

    Works for both modes: started runs whose GPU steps wait for a local slot (embedded) and
    STARTING runs whose worker pod waits for a node (Kubernetes).
    """
    now = time.time() if now is None else now
    runs = instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.STARTED, DagsterRunStatus.STARTING],
                                        tags={CAPACITY_TAG: CapacityState.WAITING.value}))
    out: dict[str, list[tuple[str, float, str]]] = defaultdict(list)
    for run in runs:
        out[run.tags.get(GPU_CLASS_TAG, "?")].append((run.run_id, now - waiting_since(run.tags, now),
                                                      run.tags.get(WAIT_ESTIMATE_TAG, "")))
    return {name: sorted(items, key=lambda item: -item[1]) for name, items in sorted(out.items())}


def choice_note(accepted: tuple[GpuClass, ...], got: GpuClass, why: str) -> str:
    """What a log line or event adds when several classes were acceptable: which choice was got, and
    (`why`) what the classes before it lacked.

    >>> from gpufn_dagster.classes import GpuClass
    >>> a, b = (GpuClass(name=n, gpu_model="X", gpu_memory="8GiB", max_gpu_count_per_worker=1) for n in ("a", "b"))
    >>> choice_note((a, b), b, "had no free slot"), choice_note((a, b), a, "-"), choice_note((a,), a, "-")
    (' (choice 2 of a, b: a had no free slot)', ' (first choice of a, b)', '')
    """
    if len(accepted) < 2:
        return ""
    names = [c.name for c in accepted]
    place = names.index(got.name)
    if place == 0:
        return f" (first choice of {', '.join(names)})"
    return f" (choice {place + 1} of {', '.join(names)}: {', '.join(names[:place])} {why})"


def tag_got_class(instance: DagsterInstance, run_id: str, gpu_class: str) -> None:
    """Add `gpu_class` to the classes the run's GPU steps or pods got (`GOT_CLASS_TAG`, comma-separated)."""
    run = instance.get_run_by_id(run_id)
    got = [name for name in (run.tags.get(GOT_CLASS_TAG, "") if run else "").split(",") if name]
    if gpu_class not in got:
        instance.add_run_tags(run_id, {GOT_CLASS_TAG: ",".join(sorted({*got, gpu_class}))})
