"""The embedded mode's GPU capacity: each class's local slots, waited for in Dagster's run queue.

    # dagster.yaml (the repo's own, which `dagster dev` reads from the working directory)
    run_coordinator:
      module: gpufn_dagster.local            # re-exports this module's classes
      class: GpuQueuedRunCoordinator
      config: {classes_dir: classes}
    run_launcher:
      module: gpufn_dagster.local
      class: LocalGpuRunLauncher

At submit the coordinator tags a GPU run with its class (from the run's execution plan, since the
UI's Materialize button sends no tags) and adds a run-queue limit per class equal to its
`local.slots`, so a GPU run beyond them stays QUEUED -- never failed, never run on CPU -- and the
run page says why (tag `gpufn/capacity=waiting`, an event, and Dagster's queue criteria). The
launcher records when the slot was obtained and which slot, whose device (class `local.devices`)
the Function then sees as CUDA_VISIBLE_DEVICES.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from dagster import DagsterRunStatus, RunsFilter
from dagster._core.events import EngineEventData
from dagster._core.launcher import DefaultRunLauncher, LaunchRunContext
from dagster._core.run_coordinator import QueuedRunCoordinator, SubmitRunContext
from dagster._core.storage.dagster_run import DagsterRun
from dagster._utils.merger import merge_dicts

from ..classes import GpuClass, cached_gpu_classes
from ..tags import (CAPACITY_REASON_TAG, CAPACITY_TAG, GPU_CLASS_TAG, LOCAL_SLOT_TAG, PLACEMENT_REJECTED, PLACEMENT_TAG,
                    WAITING_SINCE_TAG, CapacityReason, CapacityState, gpu_tags, time_tag, waiting_since)
from .capacity import past_max_wait
from .shared import CLASSES_DIR_CONFIG, RunKind, plan_run, release_ended_runs

_ACTIVE = [DagsterRunStatus.STARTING, DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]


class GpuQueuedRunCoordinator(QueuedRunCoordinator):
    """QueuedRunCoordinator with a per-class limit of `local.slots` GPU runs at a time."""

    def __init__(self, classes_dir: str | None = None, **kwargs: Any):
        self._classes_dir = classes_dir
        super().__init__(**kwargs)

    @classmethod
    def config_type(cls):
        return merge_dicts(QueuedRunCoordinator.config_type(), CLASSES_DIR_CONFIG)

    @classmethod
    def from_config_value(cls, inst_data, config_value):
        config = dict(config_value)
        classes_dir = config.pop("classes_dir", None)
        coordinator = super().from_config_value(inst_data, config)
        coordinator._classes_dir = classes_dir
        return coordinator

    def get_run_queue_config(self):
        # The queue daemon asks for this on every pass: the beat on which ended runs give their
        # local slot's tag back and waits past the class's max_wait end (nothing else in the
        # embedded path runs while a run waits).
        classes = cached_gpu_classes(self._classes_dir)
        release_ended_runs(self._instance)
        self._end_overdue_waits(classes)
        config = super().get_run_queue_config()
        slots = [{"key": GPU_CLASS_TAG, "value": c.name, "limit": c.local.slots} for c in classes.values()]
        return config._replace(tag_concurrency_limits=[*config.tag_concurrency_limits, *slots])

    def _end_overdue_waits(self, classes: dict[str, GpuClass], now: float | None = None) -> None:
        """Fail queued GPU runs that waited longer than their class's `max_wait` (as on Kubernetes)."""
        now = time.time() if now is None else now
        waiting = self._instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.QUEUED],
                                                     tags={CAPACITY_TAG: CapacityState.WAITING.value}))
        for run in waiting:
            gpu_class = classes.get(run.tags.get(GPU_CLASS_TAG, ""))
            waited = now - waiting_since(run.tags, now)
            if gpu_class is not None and past_max_wait(gpu_class, waited):
                self._instance.add_run_tags(run.run_id, {CAPACITY_TAG: CapacityState.TIMED_OUT.value,
                                                         CAPACITY_REASON_TAG: CapacityReason.MAX_WAIT_EXCEEDED.value})
                self._instance.report_run_failed(run, (
                    f"Gave up waiting for a local GPU slot of class {gpu_class.name!r} after {waited:.0f}s (max_wait "
                    f"{gpu_class.max_wait.total_seconds():.0f}s): all {gpu_class.local.slots} slot(s) stayed in use"))

    def submit_run(self, context: SubmitRunContext) -> DagsterRun:
        run = context.dagster_run
        # Every step runs in this one local process: raises for an unknown class, too many GPUs, mixed classes.
        plan = plan_run(self._instance, run, self._classes_dir, step_pods=False)
        if plan.kind is RunKind.GPU:
            placement = plan.placement
            gpu_class = placement.gpu_class
            if gpu_class.local.slots == 0:
                # A queue limit of 0 would hold the run forever: refuse it now, saying why.
                self._instance.add_run_tags(run.run_id, {**gpu_tags(gpu_class.name, placement.gpu_count),
                                                         PLACEMENT_TAG: PLACEMENT_REJECTED})
                self._instance.report_run_failed(run, (
                    f"GPU class {gpu_class.name!r} has local.slots: 0, so no run of it can start on this machine "
                    "(embedded mode); give it slots in its class file, or run it on Kubernetes"))
                return self._instance.get_run_by_id(run.run_id)
            busy = self._instance.get_runs(RunsFilter(statuses=_ACTIVE, tags={GPU_CLASS_TAG: gpu_class.name}))
            queued = self._instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.QUEUED],
                                                        tags={GPU_CLASS_TAG: gpu_class.name}))
            tags = gpu_tags(gpu_class.name, placement.gpu_count)
            if len(busy) >= gpu_class.local.slots or queued:
                tags.update({CAPACITY_TAG: CapacityState.WAITING.value, WAITING_SINCE_TAG: time_tag(time.time()),
                             CAPACITY_REASON_TAG: CapacityReason.LOCAL_SLOTS_IN_USE.value})
            self._instance.add_run_tags(run.run_id, tags)
            run = self._instance.get_run_by_id(run.run_id)
            if CAPACITY_TAG in tags:
                self._instance.report_engine_event(
                    f"Waiting for a local GPU slot of class {gpu_class.name!r}: all {gpu_class.local.slots} slot(s) "
                    f"in use ({len(busy)} run(s) of the class running); position {len(queued) + 1} of "
                    f"{len(queued) + 1} waiting on this class. It starts as soon as a slot frees.",
                    run, EngineEventData({"GPU class": gpu_class.name, "Local slots": gpu_class.local.slots,
                                          "Running": ", ".join(r.run_id[:8] for r in busy),
                                          "Position": len(queued) + 1}), cls=self.__class__)
        return super().submit_run(SubmitRunContext(run, context.workspace))


class LocalGpuRunLauncher(DefaultRunLauncher):
    """DefaultRunLauncher that records a GPU run's local slot (and its device) when it starts."""

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        name = run.tags.get(GPU_CLASS_TAG)
        if name:
            # The queue already limits the class to its slots: take the lowest slot no running run holds.
            others = self._instance.get_runs(RunsFilter(statuses=_ACTIVE, tags={GPU_CLASS_TAG: name}))
            used = {r.tags.get(LOCAL_SLOT_TAG) for r in others if r.run_id != run.run_id}
            slot = next(str(i) for i in itertools.count() if str(i) not in used)
            tags = {LOCAL_SLOT_TAG: slot, CAPACITY_TAG: CapacityState.RUNNING.value,
                    CAPACITY_REASON_TAG: CapacityReason.SLOT_ACQUIRED.value}
            self._instance.add_run_tags(run.run_id, tags)
            if run.tags.get(CAPACITY_TAG) == CapacityState.WAITING.value:
                waited = time.time() - waiting_since(run.tags, time.time())
                self._instance.report_engine_event(
                    f"Got local GPU slot {slot} of class {name!r} after waiting {waited:.0f}s", run,
                    EngineEventData({"Slot": slot, "Waited seconds": round(waited, 1)}), cls=self.__class__)
            run = self._instance.get_run_by_id(run.run_id)
        super().launch_run(LaunchRunContext(dagster_run=run, workspace=context.workspace))

