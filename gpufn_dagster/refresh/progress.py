"""What the run log shows while a refresh runs: the Function loading, then rows, rate and time left,
reported from a thread of its own so a long call or a slow load never silences it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Progress:
    """What the run log shows during a long refresh: loading the Function, then the rows.

    The rate and the time left are those of computing alone: the clock starts when the refresh's
    rows start and stops while the Function loads (a model can take longer than the rows) and once
    the rows are done (`stop`: the commit is not computing), so the first estimate is not skewed by
    the load and the last line says what the materialization says. The rate counts the rows the
    Function gave a value; rows adopted from another refresh's checkpoints (a resumed run) are
    checked but not computed, and count neither in the rate nor in the time left. Time counts across
    attempts (a commit race re-plans and reuses the rows already checkpointed): the figures are the
    refresh's, not its last attempt's.

    >>> p = Progress(rows_to_scan=1000, started=0.0)
    >>> p.rows_scanned, p.rows_computed = 250, 200
    >>> p.line(now=10.0)
    '250/1,000 rows checked, 200 computed, 0 failed, 20 rows/s, 30s left'
    >>> p.rows_scanned, p.rows_adopted, p.parts_adopted = 650, 400, 8  # a resumed run: 400 rows came at once
    >>> p.line(now=10.0)
    '650/1,000 rows checked (400 adopted from checkpoints: 8 part(s), checksums verified), 200 computed, 0 failed, 20 rows/s, 14s left'
    >>> p.loading_since = 10.0
    >>> p.line(now=14.0)
    'loading the Function: 4s so far (650/1,000 rows checked)'
    """

    rows_scanned: int = 0
    rows_to_scan: int = 0
    rows_computed: int = 0
    rows_failed: int = 0
    rows_adopted: int = 0  # checked rows whose values came from another refresh's checkpoints
    parts_adopted: int = 0  # the checkpointed parts (chunks, finished fragments) they came in, each checksum-verified
    parts_damaged: int = 0  # parts that failed their checksum, removed and computed again (counted across attempts)
    started: float = field(default_factory=time.monotonic)
    load_seconds: float = 0.0  # spent constructing the Function's callable (loading a model)
    loading_since: float | None = None  # set while it loads
    busy_seconds: float = 0.0  # spent inside the Function (its calls on rows, not its loading)
    first_values_at: float | None = None  # when the first computed values came back (kept across attempts)
    first_call_seconds: float | None = None  # how long the call that brought them took
    stopped_at: float | None = None  # when the rows were done (`stop`): later lines read the clock there

    def restart(self, rows_to_scan: int) -> None:
        """A new attempt (after a commit race) counts its rows from zero (it rescans them all, the
        finished ones from their checkpoints); its time goes on from the first attempt's.

        >>> p = Progress(rows_to_scan=1000, started=0.0)
        >>> p.rows_scanned, p.rows_computed, p.busy_seconds = 1000, 1000, 8.0
        >>> p.restart(1000); p.rows_scanned = p.rows_computed = 1000
        >>> p.rate(now=10.0), p.busy_seconds
        (100.0, 8.0)
        """
        self.rows_scanned = self.rows_computed = self.rows_failed = self.rows_adopted = self.parts_adopted = 0
        self.rows_to_scan = rows_to_scan
        self.stopped_at = None

    def stop(self, at: float | None = None) -> None:
        """The rows are done: the clock stops here, so what follows (the commit) is not computing."""
        self.stopped_at = time.monotonic() if at is None else at

    def computing_seconds(self, now: float | None = None) -> float:
        now = self.stopped_at if self.stopped_at is not None else time.monotonic() if now is None else now
        loading = now - self.loading_since if self.loading_since is not None else 0.0
        return max(now - self.started - self.load_seconds - loading, 0.0)

    def rate(self, now: float | None = None) -> float:
        """Rows the Function gave a value per second of computing (what the materialization reports)."""
        seconds = self.computing_seconds(now)
        return self.rows_computed / seconds if seconds > 0 else 0.0

    def seconds_left(self, now: float | None = None) -> float | None:
        """The rows still to check at the pace this refresh checked its own (adopted rows left out)."""
        checked = self.rows_scanned - self.rows_adopted
        seconds = self.computing_seconds(now)
        if checked <= 0 or seconds <= 0:
            return None
        return (self.rows_to_scan - self.rows_scanned) * seconds / checked

    def line(self, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        checked = f"{self.rows_scanned:,}/{self.rows_to_scan:,} rows checked"
        if self.loading_since is not None:
            return f"loading the Function: {now - self.loading_since:.0f}s so far ({checked})"
        left = self.seconds_left(now)
        eta = f"{left:.0f}s left" if left is not None else "time left unknown"
        adopted = (f" ({self.rows_adopted:,} adopted from checkpoints: {self.parts_adopted:,} part(s), checksums "
                   "verified)" if self.rows_adopted else "")
        if self.parts_damaged:
            adopted += f" ({self.parts_damaged:,} checkpointed part(s) failed their checksum: computed again)"
        loaded = f" (Function loaded in {self.load_seconds:.1f}s)" if self.load_seconds else ""
        return (f"{checked}{adopted}, {self.rows_computed:,} computed, {self.rows_failed:,} failed, "
                f"{self.rate(now):,.0f} rows/s, {eta}{loaded}")


class Ticker:
    """Reports the progress every `every` seconds from its own thread, however long one batch or
    the Function's loading takes (and once more when it stops)."""

    def __init__(self, report: Callable[[Progress], None] | None, progress: Progress, every: float):
        self.report, self.progress, self.every = report, progress, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpufn-progress", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.report(self.progress)

    def __enter__(self) -> Ticker:
        if self.report is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
