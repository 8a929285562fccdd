"""The runs a waiting path judges on every pass -- the capacity watcher's tick, the embedded
queue's pass -- read from the instance and kept between passes.

Reading 10,000 waiting runs whole takes a second or more of CPU (Dagster deserializes every run's
body), every pass, though a steady line changes nothing. So a pass reads only the runs updated
since the last pass began (less `OVERLAP_SECONDS`, for the clocks of the processes that write
runs), and every run once per `FULL_READ_SECONDS` (a run deleted meanwhile leaves no update to
read). What it keeps is the instance's own records, never older than a full read; it lives as long
as its owner (the sensor's definition, the coordinator), so reloaded code starts afresh.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone

from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, RunsFilter

from ..tags import PLACEMENT_TAG

FULL_READ_SECONDS = 300.0
OVERLAP_SECONDS = 60.0


@dataclass
class KeptRuns:
    """The runs of each placement (`tags.RunKind` value) in the statuses given for it; `read` brings
    them up to date.

    Example:
        >>> from dagster import DagsterInstance
        >>> KeptRuns({"gpu": frozenset({DagsterRunStatus.STARTING})}).read(DagsterInstance.ephemeral())
        []
    """

    statuses: Mapping[str, frozenset[DagsterRunStatus]]
    clock: Callable[[], float] = time.time
    _runs: dict[str, DagsterRun] = field(default_factory=dict)
    _read_at: float | None = None  # when the last read began (this process's clock)
    _full_at: float | None = None  # when the last full read began
    _of: object = None  # the instance read (its ref: each sensor evaluation opens the instance anew)

    def read(self, instance: DagsterInstance) -> list[DagsterRun]:
        """The runs kept, as the instance has them now, by run id."""
        began = self.clock()
        of = instance.get_ref() if instance.is_persistent else id(instance)
        full = self._full_at is None or began - self._full_at >= FULL_READ_SECONDS or of != self._of
        self._of = of
        since = None if full else datetime.fromtimestamp(self._read_at - OVERLAP_SECONDS, tz=timezone.utc)
        records = instance.get_run_records(RunsFilter(
            tags={PLACEMENT_TAG: sorted(self.statuses)},
            statuses=None if since else sorted({s for kept in self.statuses.values() for s in kept}, key=lambda s: s.value),
            updated_after=since))
        if full:
            self._runs.clear()
            self._full_at = began
        for record in records:
            run = record.dagster_run
            if run.status in self.statuses.get(run.tags.get(PLACEMENT_TAG, ""), ()):
                self._runs[run.run_id] = run
            else:
                self._runs.pop(run.run_id, None)
        self._read_at = began
        return sorted(self._runs.values(), key=lambda r: r.run_id)

    def forget(self, run_id: str) -> None:
        """Drop a run the instance no longer has (deleted since the last full read)."""
        self._runs.pop(run_id, None)
