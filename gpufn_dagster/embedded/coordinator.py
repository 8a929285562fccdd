"""The embedded mode's GPU capacity: each class's local slots, claimed step by step through Dagster pools.

    # deploy/dagster-embedded.yaml (the README's first command copies it to .dagster_home/dagster.yaml)
    run_coordinator:
      module: gpufn_dagster            # the package exports GpuQueuedRunCoordinator
      class: GpuQueuedRunCoordinator
      config: {classes_dir: classes}

Every GPU step claims a slot of its class's Dagster pool, `gpu-<class>` (set on the Function
asset), whose limit this coordinator keeps equal to the class's `local.slots`. So a run starts at
once -- its CPU steps, views and GPU steps of other classes run -- and only a GPU step beyond its
class's slots waits: never failed, never run on CPU. The run's page shows the wait in its event
log: Dagster's "Step blocked by limit for pool gpu-<class>" at once and, on the queue daemon's
next pass, a line saying which class, who holds its slots, the place in line and the max_wait
(`run.pools`); the runs list shows the run's `gpufn/capacity` tags. Which slot -- and device -- a
step got is `embedded.slots`'s business.

Dagster's run queue would by default hold a run whose first step's pool is full (QUEUED), and the
UI shows a queued run's page without its event log, so this coordinator turns
`block_op_concurrency_limited_runs` off unless dagster.yaml sets it.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from dagster import DagsterRunStatus, Field, RunsFilter
from dagster import DagsterInstance, DagsterRun, QueuedRunCoordinator, SubmitRunContext

from ..class_files import cached_gpu_classes, resolve_classes_dir
from ..class_requests import accept, choice_view
from ..classes import GpuClass
from ..private_ledger import EngineEventData, HoldsInstance
from ..errors import GpuClassError, PlacementError
from ..tags import (CAPACITY_REASON_TAG, CAPACITY_TAG, CapacityReason, CapacityState, RunKind, class_choice, gpu_pool,
                    pool_class)
from ..run.capacity import Decision, write_order
from ..run.local_capacity import decide_local_placement, decide_slots
from ..run.placement import Placement
from ..run.gauges import ClassGauges, embedded_gauges
from ..run.history import report_estimates
from ..run.pools import StepWait, lines_of, note_waits, pool_limits_now, step_waits, with_holders
from ..run.kept_runs import KeptRuns
from ..run.write_budget import QUEUE_PASS_WRITE_SECONDS, WriteBudget
from ..run.run_plan import CLASSES_DIR_CONFIG, class_placements, release_ended_runs
from .slots import held_slots, slot_dir, waiting_steps


# A run held because the class files do not load never leaves the queue while that lasts.
HELD_BY_INVALID_CLASSES = {"key": CAPACITY_REASON_TAG, "value": CapacityReason.CLASSES_INVALID.value, "limit": 0}


def pooled_classes(classes: Mapping[str, GpuClass], requests: Iterable[str]) -> dict[str, GpuClass]:
    """The classes, and each ordered choice of them among `requests` (the classes of the pools, or
    of a run being submitted) -- a Function that accepts several classes claims a slot of the pool
    `gpu-h100-80gb|a100-80gb` -- as this coordinator counts them (`class_requests.choice_view`): a
    choice's local slots are its classes' together, its max_wait its first class's.

    Example:
        >>> l4 = GpuClass(name="l4", gpu_model="L4", gpu_memory="24GiB", max_gpu_count_per_worker=1, local={"slots": 2})
        >>> t4 = GpuClass(name="t4", gpu_model="T4", gpu_memory="16GiB", max_gpu_count_per_worker=1, local={"slots": 1})
        >>> {name: c.local.slots for name, c in pooled_classes({"l4": l4, "t4": t4}, ["t4|l4", "l4", "v100"]).items()}
        {'l4': 2, 't4': 1, 't4|l4': 3}
    """
    out = dict(classes)
    for request in requests:
        accepted = accept(request, None, classes, lenient=True)
        if len(accepted) > 1:
            out[request] = choice_view(accepted)
    return out


def pool_limits(instance: DagsterInstance) -> dict[str, int]:
    """The limit of each GPU class's (or choice's) pool, by its classes (`tags.pool_class`)."""
    if not instance.event_log_storage.supports_global_concurrency_limits:
        return {}
    return {name: pool.limit for pool in instance.event_log_storage.get_pool_limits()
            if (name := pool_class(pool.name)) is not None}


def slot_waits(instance: DagsterInstance, classes: Iterable[str]) -> tuple[list[StepWait], dict[str, list[tuple[str, str]]]]:
    """The GPU steps waiting for each class's local slots (first in line first), and the (run id,
    step key) of each step holding one, per class: Dagster's pool state, as the coordinator's sweep
    and the `/metrics` gauges read it."""
    infos = instance.event_log_storage.get_concurrency_infos([gpu_pool(name) for name in classes])
    waits: list[StepWait] = []
    claimed: dict[str, list[tuple[str, str]]] = {}
    for pool, info in infos.items():
        claimed[pool_class(pool)] = [(s.run_id, s.step_key) for s in info.claimed_slots]
        waits += step_waits(
            pool_class(pool),
            [(p.run_id, p.step_key, p.enqueued_timestamp.timestamp(), p.priority or 0)
             for p in info.pending_steps if p.assigned_timestamp is None],
            claimed[pool_class(pool)])
    return waits, claimed


def all_waits(instance: DagsterInstance, classes: Mapping[str, GpuClass],
              held: Mapping[str, list[dict[str, Any]]]) -> list[StepWait]:
    """Every GPU step waiting for local slots: those Dagster's pools hold back, and those that got
    their pool's slot but wait for their classes' slots (`embedded.slots.waiting_steps`: a choice whose
    classes other pools' steps hold), the latter only of runs still going."""
    waits, _claimed = slot_waits(instance, classes)
    notes = waiting_steps(slot_dir(instance))
    going = {r.run_id for r in instance.get_runs(RunsFilter(run_ids=sorted({n["run_id"] for n in notes})))
             if r.status == DagsterRunStatus.STARTED} if notes else set()
    return [with_holders(w, held) for w in waits] + note_waits([n for n in notes if n["run_id"] in going], held)


def embedded_class_gauges(instance: DagsterInstance, classes: Mapping[str, GpuClass], now: float) -> list[ClassGauges]:
    """Each class's gauges now, in the embedded mode: its local slots, those held, who waits -- and
    each choice of classes' (`pooled_classes`), whose steps claim its own pool: its classes' slots
    together, held by any step."""
    classes = pooled_classes(classes, pool_limits(instance))
    held = held_slots(slot_dir(instance), single_classes(classes))
    in_use = {name: sum(len(held.get(c, ())) for c in class_choice(name)) for name in classes}
    return embedded_gauges({name: c.local.slots for name, c in classes.items()}, all_waits(instance, classes, held),
                           in_use, now)


def single_classes(pooled: Mapping[str, GpuClass]) -> list[GpuClass]:
    """The classes among `pooled` (not the choices of them), whose slot locks exist."""
    return [c for name, c in pooled.items() if len(class_choice(name)) == 1]


class GpuQueuedRunCoordinator(HoldsInstance, QueuedRunCoordinator):
    """QueuedRunCoordinator whose GPU steps wait, each for a local slot of its class, inside a started run.

    Args:
        classes_dir: the GPU class files (default `$GPUFN_CLASSES_DIR` or `./classes`).
        block_op_concurrency_limited_runs: Dagster's setting; off unless given, so that a run whose
            GPU steps must wait starts and its page shows why.
        write_seconds: the most a queue pass spends writing waits' tags and events (default 5; the
            daemon dequeues after the pass); many steps starting to wait are told over several passes.
        **kwargs: QueuedRunCoordinator's other settings (max_concurrent_runs, ...).
    """

    def __init__(self, classes_dir: str | None = None,
                 block_op_concurrency_limited_runs: Mapping[str, Any] | None = None,
                 write_seconds: float = QUEUE_PASS_WRITE_SECONDS, **kwargs: Any):
        self._classes_dir = classes_dir
        self._write_seconds = write_seconds  # the most a pass spends writing waits (`write_budget`)
        # The started GPU runs, kept between passes: 10,000 waiting would otherwise be read whole on each.
        self._local_runs = KeptRuns({RunKind.LOCAL.value: frozenset({DagsterRunStatus.STARTED})})
        super().__init__(block_op_concurrency_limited_runs=block_op_concurrency_limited_runs or {"enabled": False},
                         **kwargs)

    @classmethod
    def config_type(cls):
        return {**QueuedRunCoordinator.config_type(), **CLASSES_DIR_CONFIG,
                "write_seconds": Field(float, is_required=False, default_value=QUEUE_PASS_WRITE_SECONDS,
                                       description="The most seconds a queue pass spends writing waits' tags and "
                                                   "events; the rest, later in line, on the next passes.")}

    @classmethod
    def from_config_value(cls, inst_data, config_value):
        config = dict(config_value)
        classes_dir = config.pop("classes_dir", None)
        write_seconds = config.pop("write_seconds", QUEUE_PASS_WRITE_SECONDS)
        coordinator = super().from_config_value(inst_data, config)
        coordinator._classes_dir, coordinator._write_seconds = classes_dir, write_seconds
        return coordinator

    def get_run_queue_config(self):
        # The queue daemon asks for this on every pass, before it launches anything: the beat on
        # which pool limits follow the class files, waits are described, and tags end. Class files
        # that do not load hold the GPU runs (a tag limit of 0) and nothing else; once they load,
        # the held runs are placed and go.
        release_ended_runs(self.instance)
        config = super().get_run_queue_config()
        try:
            classes = cached_gpu_classes(self._classes_dir)
        except GpuClassError:
            return config._replace(tag_concurrency_limits=[*config.tag_concurrency_limits, HELD_BY_INVALID_CLASSES])
        self._release_held()
        if self.instance.event_log_storage.supports_global_concurrency_limits:
            limits = pool_limits(self.instance)
            pooled = pooled_classes(classes, limits)
            held = held_slots(slot_dir(self.instance), single_classes(pooled))
            self._sync_pool_limits(pool_limits_now(pooled, held), limits)
            self._report_waits(pooled, held, time.time())
        return config

    def _release_held(self) -> None:
        """Place the runs held while the class files did not load (or fail those that cannot be placed)."""
        held = self.instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.QUEUED],
                                                  tags={CAPACITY_REASON_TAG: CapacityReason.CLASSES_INVALID.value}))
        for run in held:
            try:
                placed = self._placed(run, class_placements(self.instance, run, self._classes_dir))
            except (GpuClassError, PlacementError) as err:
                self.instance.report_run_failed(run, f"GPU run not started: {err}")
                continue
            if placed.status == DagsterRunStatus.FAILURE:  # it can never get its slots here: said on its page
                continue
            self.instance.add_run_tags(run.run_id, {CAPACITY_REASON_TAG: CapacityReason.CLASSES_LOADED.value})
            self.instance.report_engine_event(
                "The GPU class files load again: the run goes to the run queue", run,
                EngineEventData({"Class files": str(resolve_classes_dir(self._classes_dir)),
                                 "Capacity reason": CapacityReason.CLASSES_LOADED.value}), cls=self.__class__)

    def submit_run(self, context: SubmitRunContext) -> DagsterRun:
        run = context.dagster_run
        try:
            # Raises for an unknown class or too many GPUs; several classes in one run are fine here.
            placements = class_placements(self.instance, run, self._classes_dir)
        except GpuClassError as err:  # the class files do not load: hold this GPU run until they do
            self.instance.add_run_tags(run.run_id, {CAPACITY_TAG: CapacityState.WAITING.value,
                                                     CAPACITY_REASON_TAG: CapacityReason.CLASSES_INVALID.value})
            self.instance.report_engine_event(
                f"Held in the queue: its GPU steps need a GPU class and the class files do not load. Fix them; "
                f"the run then starts without a restart. {err}", run,
                EngineEventData({"Class files": str(resolve_classes_dir(self._classes_dir))}), cls=self.__class__)
            return super().submit_run(SubmitRunContext(self.instance.get_run_by_id(run.run_id), context.workspace))
        run = self._placed(run, placements)
        if run.status == DagsterRunStatus.FAILURE:
            return run
        return super().submit_run(SubmitRunContext(run, context.workspace))

    def _placed(self, run: DagsterRun, placements: Mapping[str, Placement]) -> DagsterRun:
        """Tag a GPU run with its classes, or fail it now when a step can never get its slots."""
        if placements:
            decision = decide_local_placement(placements)
            self._apply(run, decision)
            if decision.fail is not None:
                return self.instance.get_run_by_id(run.run_id)
            if self.instance.event_log_storage.supports_global_concurrency_limits:  # before its steps claim
                names = sorted(placements)
                pooled = pooled_classes({c.name: c for p in placements.values() for c in p.accepted}, names)
                held = held_slots(slot_dir(self.instance), single_classes(pooled))
                self._sync_pool_limits(pool_limits_now(pooled, held), pool_limits(self.instance))
            run = self.instance.get_run_by_id(run.run_id)
        return run

    def _sync_pool_limits(self, wanted: Mapping[str, int], limits: Mapping[str, int]) -> None:
        """Each class's (and choice's) pool limited as `wanted` (`pools.pool_limits_now`: from the
        classes' `local.slots`, the class file being the one place of that fact, less what other
        pools' steps hold), given the pools' `limits` now (`pool_limits`)."""
        for name, limit in wanted.items():
            if limits.get(name) != limit:
                self.instance.event_log_storage.set_concurrency_slots(gpu_pool(name), limit)

    def _report_waits(self, classes: Mapping[str, GpuClass], held: Mapping[str, list[dict[str, Any]]],
                      now: float) -> None:
        """Decide (`local_capacity.decide_slots`) and apply, for each started run whose GPU steps wait
        for local slots, hold them, or waited until now; then estimate the waits still going."""
        waits = all_waits(self.instance, classes, held)
        by_run: dict[str, list[StepWait]] = defaultdict(list)
        for wait in waits:
            by_run[wait.run_id].append(wait)
        holding = {r.get("run_id") for records in held.values() for r in records if r.get("run_id")}
        # holders are what the line waits on: runs that stopped waiting are told before the estimates
        waited = set(self.instance.get_run_ids(RunsFilter(  # ids only: the runs are read once, below
            statuses=[DagsterRunStatus.STARTED], tags={CAPACITY_TAG: CapacityState.WAITING.value})))
        still_waiting: dict[str, DagsterRun] = {}
        lines = lines_of(waits)
        decisions: list[tuple[DagsterRun, Decision, int | None]] = []
        wanted = set(by_run) | holding | waited
        kept = {run.run_id: run for run in self._local_runs.read(self.instance)} if wanted else {}
        # a run this coordinator did not place (one executed in process) is read by its id
        missing = sorted(wanted - kept.keys())
        runs = [kept[run_id] for run_id in sorted(wanted & kept.keys())] + (
            self.instance.get_runs(RunsFilter(run_ids=missing)) if missing else [])
        for run in runs:
            if run.status != DagsterRunStatus.STARTED:  # not once it is being terminated
                continue
            run_waits = [w for w in by_run.get(run.run_id, []) if w.gpu_class in classes]
            if run.run_id in by_run and not run_waits:
                continue  # its waits are on classes no longer configured
            decision = decide_slots(run_waits, lines, classes, run.tags, now, holding=run.run_id in holding)
            decisions.append((run, decision, min((w.position for w in run_waits), default=None)))
            if decision.state is CapacityState.WAITING:
                still_waiting[run.run_id] = run
        budget = WriteBudget.seconds(self._write_seconds)
        for run, decision, place in sorted(decisions, key=lambda item: write_order(item[1], item[2])):
            if decision.fail is not None or ((decision.tags or decision.event or decision.step_events)
                                             and budget.allows()):
                self._apply(run, decision)
        self._estimate(waits, still_waiting, classes, now, budget)

    def _apply(self, run: DagsterRun, decision: Decision) -> None:
        """Record a decision as it is: its tags, its events (the run's, then its steps'), and its end:
        a run that never fits fails at once, one that waited past max_wait is terminated."""
        if decision.tags:
            self.instance.add_run_tags(run.run_id, dict(decision.tags))
        for event in ([decision.event] if decision.event else []) + list(decision.step_events):
            self.instance.report_engine_event(event.message, run, EngineEventData(dict(event.metadata)),
                                              cls=self.__class__, step_key=event.step_key)
        if decision.fail is not None:
            if decision.state is CapacityState.NEVER_FITS:
                self.instance.report_run_failed(run, decision.fail)
            else:
                self.instance.run_launcher.terminate(run.run_id)

    def _estimate(self, waits: list[StepWait], runs: Mapping[str, DagsterRun], classes: Mapping[str, GpuClass],
                  now: float, budget: WriteBudget) -> None:
        """A wait estimate on each of `runs` (the started runs whose GPU steps still wait), from its
        place in its class's line and the class's local slots (one GPU each)."""
        lines: dict[str, dict[str, DagsterRun]] = defaultdict(dict)  # class -> its runs, first in line first
        for wait in sorted(waits, key=lambda w: w.position):
            if wait.run_id in runs:
                lines[wait.gpu_class].setdefault(wait.run_id, runs[wait.run_id])
        report_estimates(self.instance, {name: list(line.values()) for name, line in lines.items()},
                         {name: c.local.slots for name, c in classes.items()}, now, self.__class__, budget)
