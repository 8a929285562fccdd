"""Wait estimates on waiting GPU runs: the instance's side (history, holders, tags and events).

Both waiting paths -- the embedded queue's pass and the Kubernetes watcher's tick -- know the
line of runs waiting on each class and the class's capacity; this module adds what the instance
knows (how long each kind of work took recently, who holds the class's GPUs and since when),
asks `estimate.estimate_line`, and records the answer on each waiting run: tag
`.dagster/gpufn-wait-estimate` and an event, both only when the estimate changed meaningfully. A few
queries per class with waiting runs, whatever the number of runs; a selection never run as such
adds one query of materializations per asset of it, one of their runs, and one of the step
times of each (at most HISTORY_RUNS) successful run.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from dagster import AssetKey, DagsterInstance, DagsterRunStatus, RunsFilter
from ..private_ledger import EngineEventData

from ..tags import (CAPACITY_TAG, GPU_CLASS_TAG, RUN_GPU_COUNT_TAG, HOLDING_SINCE_TAG, WAIT_ESTIMATE_TAG, CapacityState,
                    seconds_from_tag)
from .write_budget import WriteBudget
from .estimate import HISTORY_RUNS, Ahead, Estimate, Holder, changed_meaningfully, estimate_line, typical_of


def work_of(run: Any) -> str:
    """What a run does, as the history groups it: its selected assets (what Materialize picks), else its job.

    >>> from types import SimpleNamespace
    >>> from dagster import AssetKey
    >>> work_of(SimpleNamespace(asset_selection={AssetKey("docs__embedding")}, job_name="__ASSET_JOB"))
    'docs__embedding'
    """
    if run.asset_selection:
        return ", ".join(sorted(key.to_user_string() for key in run.asset_selection))
    return run.job_name


def parts_of(run: Any) -> tuple[str, ...]:
    """The assets a run selected (none for a job run), each of whose history can stand in for the
    selection's when the selection itself was never run.

    >>> from types import SimpleNamespace
    >>> from dagster import AssetKey
    >>> parts_of(SimpleNamespace(asset_selection={AssetKey("docs__embedding"), AssetKey("docs")}))
    ('docs', 'docs__embedding')
    """
    return tuple(sorted(key.to_user_string() for key in run.asset_selection or ()))


def _gpus(run: Any) -> int:
    try:
        return int(run.tags.get(RUN_GPU_COUNT_TAG, "1").split(",")[0])
    except ValueError:
        return 1


def _holding_since(record: Any) -> float | None:
    """When a run got its GPUs: its holding-since tag, else (a run that never waited, from before
    the tag) its start."""
    value = record.dagster_run.tags.get(HOLDING_SINCE_TAG)
    return seconds_from_tag(value) if value else record.start_time


def class_history(instance: DagsterInstance, gpu_class: str) -> dict[str, list[float]]:
    """Work -> durations (seconds) of the class's recent successful runs, the newest first: each run's
    time on its GPUs (from getting them to its end), so a run that waited long does not make the
    work look long."""
    records = instance.get_run_records(RunsFilter(statuses=[DagsterRunStatus.SUCCESS], tags={GPU_CLASS_TAG: gpu_class}),
                                       limit=HISTORY_RUNS * 10)
    durations: dict[str, list[float]] = defaultdict(list)
    for record in records:
        since = _holding_since(record)
        if since and record.end_time and len(durations[work_of(record.dagster_run)]) < HISTORY_RUNS:
            durations[work_of(record.dagster_run)].append(max(record.end_time - since, 0.0))
    return durations


def asset_history(instance: DagsterInstance, assets: Sequence[str]) -> dict[str, list[float]]:
    """Asset -> durations (seconds) of its step in its recent materializations by successful runs,
    whatever else those runs selected: from the step's start to its end. What a Materialize all
    ran counts for the one asset materialized alone next."""
    steps: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))  # run -> step -> its assets
    for asset in assets:
        for record in instance.fetch_materializations(AssetKey.from_user_string(asset), limit=HISTORY_RUNS).records:
            if record.event_log_entry.step_key:
                steps[record.run_id][record.event_log_entry.step_key].append(asset)
    succeeded = [r.dagster_run.run_id for r in instance.get_run_records(
        RunsFilter(run_ids=list(steps), statuses=[DagsterRunStatus.SUCCESS]))] if steps else []
    durations: dict[str, list[float]] = {asset: [] for asset in assets}
    for run_id in succeeded:
        for stats in instance.get_run_step_stats(run_id, step_keys=sorted(steps[run_id])):
            if stats.start_time and stats.end_time:
                for asset in dict.fromkeys(steps[run_id][stats.step_key]):
                    durations[asset].append(stats.end_time - stats.start_time)
    return durations


def class_holders(instance: DagsterInstance, gpu_class: str, now: float) -> list[Holder]:
    """The runs of the class that hold its GPUs now -- tagged `running` (embedded: a local slot) or
    `scheduled` (Kubernetes: a node) -- with how long they have held them. A run just started whose
    GPU step has not asked for its slot yet, or whose pod is not bound, holds nothing."""
    records = instance.get_run_records(RunsFilter(
        statuses=[DagsterRunStatus.STARTED, DagsterRunStatus.STARTING],
        tags={GPU_CLASS_TAG: gpu_class, CAPACITY_TAG: [CapacityState.RUNNING.value, CapacityState.SCHEDULED.value]}))
    return [Holder(work_of(r.dagster_run), _gpus(r.dagster_run), now - (_holding_since(r) or now),
                   parts_of(r.dagster_run)) for r in records]


def report_estimates(instance: DagsterInstance, lines: Mapping[str, Sequence[Any]], capacities: Mapping[str, int],
                     now: float, reporter: type, budget: WriteBudget | None = None) -> dict[str, Estimate]:
    """Estimate and record the wait of every run in `lines` (class -> its waiting runs, first in line
    first) on `capacities` (class -> GPUs); returns each class's estimate for the last in line. An
    estimate that does not fit in the pass's `budget` is recorded on the next pass."""
    last: dict[str, Estimate] = {}
    for gpu_class, runs in lines.items():
        if not runs:
            continue
        history, holders = class_history(instance, gpu_class), class_holders(instance, gpu_class, now)
        line = [Ahead(work_of(run), _gpus(run), parts_of(run)) for run in runs]
        # A selection never run as such (one asset after a Materialize all): its assets' own history.
        unrun = {part for run in [*holders, *line] if typical_of(run, history) is None for part in run.parts}
        history.update(asset_history(instance, sorted(part for part in unrun if not history.get(part))))
        estimates = estimate_line(gpu_class, capacities.get(gpu_class, 0), holders, line, history)
        last[gpu_class] = estimates[-1]
        for place, (run, estimate) in enumerate(zip(runs, estimates, strict=True)):
            if changed_meaningfully(run.tags.get(WAIT_ESTIMATE_TAG), estimate) and (budget is None or budget.allows()):
                instance.add_run_tags(run.run_id, {WAIT_ESTIMATE_TAG: estimate.tag})
                instance.report_engine_event(
                    f"Wait estimate: {estimate.text}", run,
                    EngineEventData({"Estimate": estimate.tag, "Runs ahead": place, "GPU class": gpu_class,
                                     "Class GPUs": capacities.get(gpu_class, 0)}), cls=reporter)
    return last
