"""The GPU runs a capacity-watcher tick judges, read from the instance and kept between the ticks of
one sensor.

Reading 10,000 waiting runs whole takes a second of CPU (Dagster deserializes every run's body), every
tick, though a steady line changes nothing. So a tick reads only the runs updated since the last tick
began (less `OVERLAP_SECONDS`, for the clocks of the processes that write runs), and every run once
per `FULL_READ_SECONDS` (a run deleted meanwhile leaves no update to read). What it keeps is the
instance's own records, never older than a full read; it lives in the sensor's definition, so a
reloaded code location starts afresh.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone

from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, RunsFilter

from ...tags import PLACEMENT_TAG, RunKind

FULL_READ_SECONDS = 300.0
OVERLAP_SECONDS = 60.0
_STATUSES = {RunKind.GPU.value: {DagsterRunStatus.STARTING},  # placed on its run worker: judged until it starts
             RunKind.PER_STEP.value: {DagsterRunStatus.STARTING, DagsterRunStatus.STARTED}}  # its steps' pods


@dataclass
class GpuRuns:
    """The runs each tick judges: STARTING runs placed on a GPU run worker, and STARTING or STARTED
    runs placed per step; `read` brings them up to date.

    Example:
        >>> from dagster import DagsterInstance
        >>> runs = GpuRuns()
        >>> runs.read(DagsterInstance.ephemeral())
        ([], [])
    """

    clock: Callable[[], float] = time.time
    _runs: dict[str, DagsterRun] = field(default_factory=dict)
    _read_at: float | None = None  # when the last read began (this process's clock)
    _full_at: float | None = None  # when the last full read began
    _of: object = None  # the instance read (its ref: each sensor evaluation opens the instance anew)

    def read(self, instance: DagsterInstance) -> tuple[list[DagsterRun], list[DagsterRun]]:
        """(runs placed on a GPU run worker, runs placed per step), as the instance has them now."""
        began = self.clock()
        of = instance.get_ref() if instance.is_persistent else id(instance)
        full = self._full_at is None or began - self._full_at >= FULL_READ_SECONDS or of != self._of
        self._of = of
        since = None if full else datetime.fromtimestamp(self._read_at - OVERLAP_SECONDS, tz=timezone.utc)
        records = instance.get_run_records(RunsFilter(
            tags={PLACEMENT_TAG: sorted(_STATUSES)},
            statuses=None if since else sorted({s for statuses in _STATUSES.values() for s in statuses},
                                               key=lambda s: s.value),
            updated_after=since))
        if full:
            self._runs.clear()
            self._full_at = began
        for record in records:
            run = record.dagster_run
            if run.status in _STATUSES.get(run.tags.get(PLACEMENT_TAG, ""), ()):
                self._runs[run.run_id] = run
            else:
                self._runs.pop(run.run_id, None)
        self._read_at = began
        runs = sorted(self._runs.values(), key=lambda r: r.run_id)
        return ([r for r in runs if r.tags.get(PLACEMENT_TAG) == RunKind.GPU.value and r.status == DagsterRunStatus.STARTING],
                [r for r in runs if r.tags.get(PLACEMENT_TAG) == RunKind.PER_STEP.value])

    def forget(self, run_id: str) -> None:
        """Drop a run the instance no longer has (deleted since the last full read)."""
        self._runs.pop(run_id, None)

