"""Refreshing a Function column: plan, compute per fragment, write, commit once.

The column's values for a fragment are written as one new Lance data file aligned to the
fragment's physical rows (deleted rows hold NULL), and all fragments are committed in a single
`DataReplacement` at the version the plan read. DataReplacement only conflicts with a writer that
touches the same fragment *and* field (or compacts it), so rows appended, updated or deleted
meanwhile are kept; appended rows are filled by the next refresh. One commit means readers never
see a column half from one Function version and half from another.

A fragment in which no row changes is not rewritten (a rewrite would drop its rows from the
vector index). Rows that fail under on_error="skip" are stored with the signature `FAILED`, so
the next refresh retries them. Refreshes of one column are serialized by a lease (`lease`), and
a Function reading another Function's column refuses to start while that column is not current.

Fragments are processed by a small thread pool (Lance scans and writes release the GIL); calls
into the Function are serialized by a lock, because one worker's model is not assumed to be
thread-safe.
"""

from __future__ import annotations

import functools
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lance.commit import CommitConflictError

from ..errors import CommitRacesLost, CommitRefused
from ..functions import Function
from .checkpoint import CheckpointStore
from .columns import ensure_columns
from .execute import RowError, call_function
from .lease import DEFAULT_TTL, ColumnLease
from .leftovers import WrittenFiles
from .plan import FragmentWork, content_keys, field_ids, plan_fragments
from .signature import FAILED, check_input_types, row_signatures, scan_expressions
from .state import ColumnState, load_state, save_state
from .upstream import check_upstream
from .write import FragmentFileWriter, align_to_physical, data_file_name

ADDRESS = "_rowaddr"
_COMMIT_ATTEMPTS = 5


@dataclass
class Progress:
    """What the run log shows during a long refresh: loading the Function, then the rows.

    The rate and the time left are those of computing alone: the clock starts when this attempt's
    rows start and stops while the Function loads (a model can take longer than the rows), so the
    first estimate is not skewed by the load.

    >>> p = Progress(rows_to_scan=1000, started=0.0)
    >>> p.rows_scanned, p.rows_computed = 250, 200
    >>> p.line(now=10.0)
    '250/1,000 rows checked, 200 computed, 0 failed, 25 rows/s, 30s left'
    >>> p.loading_since = 10.0
    >>> p.line(now=14.0)
    'loading the Function: 4s so far (250/1,000 rows checked)'
    """

    rows_scanned: int = 0
    rows_to_scan: int = 0
    rows_computed: int = 0
    rows_failed: int = 0
    started: float = field(default_factory=time.monotonic)
    load_seconds: float = 0.0  # spent constructing the Function's callable (loading a model)
    loading_since: float | None = None  # set while it loads

    def restart(self, rows_to_scan: int) -> None:
        """A new attempt (after a commit race) counts from zero: the final numbers are its own."""
        self.rows_scanned = self.rows_computed = self.rows_failed = 0
        self.rows_to_scan, self.started, self.load_seconds = rows_to_scan, time.monotonic(), 0.0

    def computing_seconds(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        loading = now - self.loading_since if self.loading_since is not None else 0.0
        return max(now - self.started - self.load_seconds - loading, 0.0)

    def rate(self, now: float | None = None) -> float:
        seconds = self.computing_seconds(now)
        return self.rows_scanned / seconds if seconds > 0 else 0.0

    def seconds_left(self, now: float | None = None) -> float | None:
        rate = self.rate(now)
        return (self.rows_to_scan - self.rows_scanned) / rate if rate > 0 else None

    def line(self, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        checked = f"{self.rows_scanned:,}/{self.rows_to_scan:,} rows checked"
        if self.loading_since is not None:
            return f"loading the Function: {now - self.loading_since:.0f}s so far ({checked})"
        left = self.seconds_left(now)
        eta = f"{left:.0f}s left" if left is not None else "time left unknown"
        loaded = f" (Function loaded in {self.load_seconds:.1f}s)" if self.load_seconds else ""
        return (f"{checked}, {self.rows_computed:,} computed, {self.rows_failed:,} failed, "
                f"{self.rate(now):,.0f} rows/s, {eta}{loaded}")


class _Ticker:
    """Reports the progress every `every` seconds from its own thread, however long one batch or
    the Function's loading takes (and once more when it stops)."""

    def __init__(self, report: Callable[[Progress], None] | None, progress: Progress, every: float):
        self.report, self.progress, self.every = report, progress, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpufn-progress", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.report(self.progress)

    def __enter__(self) -> _Ticker:
        if self.report is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


@dataclass
class Outcome:
    """What computing some rows produced besides their values."""

    errors: list[RowError] = field(default_factory=list)
    recovered: list[int] = field(default_factory=list)  # addresses of rows that had failed and now succeeded
    computed: int = 0
    changed: int = 0  # rows whose stored value or signature differs from before

    def add(self, other: Outcome) -> None:
        self.errors.extend(other.errors)
        self.recovered.extend(other.recovered)
        self.computed += other.computed
        self.changed += other.changed

    def to_json(self) -> dict[str, Any]:
        return {"errors": [asdict(e) for e in self.errors], "recovered": self.recovered,
                "computed": self.computed, "changed": self.changed}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Outcome:
        return cls([RowError(**e) for e in data.get("errors", [])], list(data.get("recovered", [])),
                   data.get("computed", 0), data.get("changed", 0))


@dataclass
class RefreshResult:
    function_version: str
    version_before: int
    version_after: int
    rows_computed: int
    rows_failed: int
    rows_checked: int
    rows_total: int  # live rows of the table at version_after
    fragments_visited: int
    fragments_rewritten: int
    fragments_total: int
    wall_seconds: float
    lease_wait_seconds: float
    errors: list[RowError]
    recovered: list[int]
    leftover_files_removed: int = 0  # data files earlier killed or failed refreshes left behind
    load_seconds: float = 0.0  # constructing the Function's callable (loading its model), all attempts
    compute_seconds: float = 0.0  # the final attempt's rows, the load left out

    @property
    def rows_per_second(self) -> float:
        """Rows computed per second of computing (not of waiting for a lease or loading a model)."""
        return self.rows_computed / self.compute_seconds if self.compute_seconds > 0 else 0.0


@dataclass
class _FragmentResult:
    work: FragmentWork
    group: lance.LanceOperation.DataReplacementGroup | None  # None: nothing changed, nothing rewritten
    outcome: Outcome
    file: str | None


class _Attempt:
    """State shared by the fragment workers of one plan-compute-commit attempt."""

    def __init__(self, dataset: lance.LanceDataset, function: Function, store: CheckpointStore,
                 written: WrittenFiles, report: Callable[[Progress], None] | None, progress: Progress, call: Any):
        self.dataset, self.function, self.store, self.written = dataset, function, store, written
        self.report, self.progress = report, progress
        self.lock = threading.Lock()
        self.call_lock = threading.Lock()
        self.call = call
        names = [*function.columns, function.sig_column]
        self.out_schema = pa.schema([dataset.schema.field(n) for n in names])
        self.out_ids = field_ids(dataset, names)
        # A fragment the Function never wrote needs only its inputs; others also their stored outputs.
        self.new_scan = {n: f"`{n}`" for n in function.inputs} | scan_expressions(function, dataset.schema)
        self.stale_scan = self.new_scan | {n: f"`{n}`" for n in names if n not in self.new_scan}

    def compute(self, inputs: pa.RecordBatch, addresses: np.ndarray) -> tuple[pa.Array, list[RowError]]:
        with self.call_lock:
            if self.call is None:
                self.call = self._load()
            return call_function(self.call, self.function, inputs, addresses)

    def _load(self) -> Any:
        """Construct the Function's callable (a class loads its model here): only once some row needs
        computing, timed apart from the rows, and said in the run log as it starts and ends."""
        self.progress.loading_since = time.monotonic()
        if self.report:
            self.report(self.progress)
        try:
            return self.function.open()
        finally:
            self.progress.load_seconds += time.monotonic() - self.progress.loading_since
            self.progress.loading_since = None
            if self.report:
                self.report(self.progress)

    def advance(self, scanned: int, outcome: Outcome) -> None:
        with self.lock:
            self.progress.rows_scanned += scanned
            self.progress.rows_computed += outcome.computed
            self.progress.rows_failed += len(outcome.errors)


def _outputs(attempt: _Attempt, batch: pa.RecordBatch, addresses: np.ndarray,
             new: bool) -> tuple[pa.RecordBatch, Outcome]:
    """Output columns for a scanned batch: current rows keep their values, stale rows are computed.

    In a fragment the Function never wrote (`new`), every row is stale and nothing stored is read.
    A row that fails is stored with the signature FAILED, so it stays stale.
    """
    function = attempt.function
    now = row_signatures(function, batch).to_numpy().copy()
    if new:
        stale_idx = np.arange(batch.num_rows)
        stored = None
        retried = np.zeros(batch.num_rows, dtype=bool)
    else:
        stored = batch.column(function.sig_column)
        stale_idx = np.flatnonzero(pc.fill_null(pc.not_equal(stored, pa.array(now)), True).to_numpy(
            zero_copy_only=False))
        retried = pc.fill_null(pc.equal(stored, pa.scalar(FAILED, stored.type)), False).to_numpy(zero_copy_only=False)
    outcome = Outcome(computed=len(stale_idx), changed=len(stale_idx))
    if len(stale_idx) == 0:
        merged = [batch.column(name) for name in function.columns]
    else:
        inputs = batch.select(list(function.inputs))
        if len(stale_idx) < batch.num_rows:
            inputs = inputs.take(pa.array(stale_idx))
        values, errors = attempt.compute(inputs, addresses[stale_idx])
        computed = [values] if len(function.columns) == 1 else values.flatten()
        if len(stale_idx) == batch.num_rows:
            merged = computed
        else:
            selector = np.arange(batch.num_rows)
            selector[stale_idx] = batch.num_rows + np.arange(len(stale_idx))
            merged = [pa.concat_arrays([batch.column(name), c.cast(batch.column(name).type)]).take(pa.array(selector))
                      for name, c in zip(function.columns, computed, strict=True)]
        failed = np.isin(addresses, np.array([e.row_address for e in errors], dtype=np.uint64))
        now[failed] = FAILED
        was_failed = {int(a) for a in addresses[retried]}
        outcome.errors = [RowError(e.row_address, e.error, e.traceback, retried=e.row_address in was_failed)
                          for e in errors]
        outcome.recovered = [int(a) for a in addresses[stale_idx][retried[stale_idx] & ~failed[stale_idx]]]
        # Only stale rows get a new signature; one that failed again keeps the FAILED it had.
        outcome.changed -= int(np.count_nonzero(failed & retried))
    merged = [m.cast(f.type) for m, f in zip(merged, attempt.out_schema, strict=False)]
    return pa.RecordBatch.from_arrays([*merged, pa.array(now, type=attempt.out_schema.field(-1).type)],
                                      schema=attempt.out_schema), outcome


def _finished(attempt: _Attempt, item: FragmentWork, record: dict[str, Any]) -> _FragmentResult:
    outcome = Outcome.from_json(record["outcome"])
    if record["file"] is None:
        return _FragmentResult(item, None, outcome, None)
    data_file = lance.fragment.DataFile(record["file"], attempt.out_ids, list(range(len(attempt.out_ids))),
                                        record["major"], record["minor"])
    return _FragmentResult(item, lance.LanceOperation.DataReplacementGroup(item.fragment_id, data_file), outcome,
                           record["file"])


class _PendingChunk:
    """The batches written since the last checkpoint of one fragment; saved as a chunk when due."""

    def __init__(self, attempt: _Attempt, item: FragmentWork, start: int):
        self.attempt, self.item = attempt, item
        self.start, self.batches, self.outcome, self.since = start, [], Outcome(), time.monotonic()

    def restart_at(self, start: int) -> None:
        self.start = start

    def add(self, aligned: pa.RecordBatch, outcome: Outcome, end: int) -> None:
        self.batches.append(aligned)
        self.outcome.add(outcome)
        if time.monotonic() - self.since >= self.attempt.function.checkpoint_seconds:
            self.attempt.store.save_chunk(self.item, self.start, end, self.batches, self.outcome.to_json())
            self.start, self.batches, self.outcome, self.since = end, [], Outcome(), time.monotonic()


def _restore_chunk(attempt: _Attempt, writer: FragmentFileWriter, path: str) -> Outcome:
    """Write a checkpointed chunk's batches again instead of computing them; returns what they held."""
    batches, info = attempt.store.load_chunk(path)
    for restored in batches:
        writer.write(restored)
    return Outcome.from_json(info)


def _close_fragment(attempt: _Attempt, item: FragmentWork, writer: FragmentFileWriter, total: Outcome,
                    new: bool) -> _FragmentResult:
    """Finish the fragment's file (or drop it when nothing changed) and checkpoint the fragment as done."""
    writer.pad_to(item.physical_rows)
    writer.close()
    record: dict[str, Any] = {"file": writer.name, "major": writer.major, "minor": writer.minor,
                              "outcome": total.to_json()}
    if not new and total.changed == 0:
        # Every row is current (e.g. after compaction): keep the fragment's files as they are.
        (Path(attempt.dataset.uri) / "data" / writer.name).unlink(missing_ok=True)
        record["file"] = None
    attempt.store.save_fragment(item, record)
    attempt.store.discard_batches(item)
    return _finished(attempt, item, record)


def _refresh_fragment(attempt: _Attempt, item: FragmentWork) -> _FragmentResult:
    """Compute one fragment's new column file, batch by batch, reusing checkpointed chunks."""
    done = attempt.store.load_fragment(item)
    if done is not None and (done["file"] is None or (Path(attempt.dataset.uri) / "data" / done["file"]).exists()):
        result = _finished(attempt, item, done)
        attempt.advance(item.live_rows, result.outcome)
        return result
    name = data_file_name(f"gpufn-{attempt.function.version}-{item.inputs_hash}")
    attempt.written.note(name)  # before the file exists, so a kill cannot leave it unaccounted
    writer = FragmentFileWriter(attempt.dataset, name, attempt.out_schema)
    saved = attempt.store.chunks(item)
    next_offset = skip_until = 0
    total = Outcome()
    pending = _PendingChunk(attempt, item, start=0)
    new = item.reason == "new"
    scanner = attempt.dataset.get_fragment(item.fragment_id).scanner(
        columns=attempt.new_scan if new else attempt.stale_scan, batch_size=attempt.function.batch_size,
        with_row_address=True, strict_batch_size=True)
    for batch in scanner.to_batches():
        if batch.num_rows == 0:
            continue
        addresses = batch.column(ADDRESS).to_numpy()
        offsets = (addresses & 0xFFFFFFFF).astype(np.int64)
        start, end = next_offset, int(offsets[-1]) + 1
        if end <= skip_until:  # inside a chunk restored from a checkpoint
            next_offset = end
            attempt.advance(batch.num_rows, Outcome())
            continue
        if start in saved:
            skip_until, path = saved[start]
            restored = _restore_chunk(attempt, writer, path)
            total.add(restored)
            next_offset = skip_until
            pending.restart_at(skip_until)
            attempt.advance(batch.num_rows, Outcome(errors=restored.errors))
            continue
        out, outcome = _outputs(attempt, batch, addresses, new)
        aligned = align_to_physical(out, offsets, start, attempt.out_schema)
        writer.write(aligned)
        next_offset = end
        total.add(outcome)
        pending.add(aligned, outcome, end)
        attempt.advance(batch.num_rows, outcome)
    return _close_fragment(attempt, item, writer, total, new)


def _state_after(state: ColumnState, results: list[_FragmentResult]) -> ColumnState:
    """The column state with this attempt's findings added (not yet pruned)."""
    return ColumnState(
        verified=state.verified | {r.work.content_key for r in results if r.group is None and not r.outcome.errors},
        failed_files=state.failed_files | {r.file for r in results if r.file and r.outcome.errors})


def _compute(attempt: _Attempt, work: list[FragmentWork], workers: int) -> list[_FragmentResult]:
    """Every planned fragment's new column file, `workers` fragments at a time."""
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gpufn-refresh") as pool:
        return list(pool.map(functools.partial(_refresh_fragment, attempt), work))


def _commit(dataset: lance.LanceDataset, function: Function,
            groups: list[lance.LanceOperation.DataReplacementGroup]) -> lance.LanceDataset | None:
    """One DataReplacement of every rewritten fragment at the version read; None when a concurrent
    writer of the same fragments won the race (the caller re-plans)."""
    try:
        return lance.LanceDataset.commit(
            dataset.uri, lance.LanceOperation.DataReplacement(groups), read_version=dataset.version,
            commit_message=f"gpufn refresh {function.name} version {function.version}")
    except CommitConflictError:
        return None
    except OSError as err:  # not a race: retrying cannot help, so say what Lance refused
        raise CommitRefused(
            f"Lance refused the commit of Function {function.name!r} to table {function.table!r} "
            f"(version {dataset.version}): {err}. Nothing was committed.") from err


def refresh_column(
    table_uri: str,
    function: Function,
    *,
    report: Callable[[Progress], None] | None = None,
    report_every: float = 5.0,
    concurrency: int | None = None,
    upstream: Sequence[Function] = (),
    holder: str | None = None,
    on_wait: Callable[[str], None] | None = None,
    lease_seconds: float = DEFAULT_TTL,
) -> RefreshResult:
    """Bring the Function's column up to date; returns what was done. Safe to kill and re-run.

    Args:
        table_uri: the Lance dataset (`<db>/<table>.lance`).
        function: the Function spec (`make_function`).
        report: called with the progress every `report_every` seconds and at the end.
        concurrency: fragments processed at once (default: up to 4, by CPU count).
        upstream: Functions whose output columns this one reads; the refresh refuses to start
            while one of them is not current (`UpstreamNotCurrent`).
        holder: who refreshes (a run id), shown to a refresh of the same column that waits.
        on_wait: called with a line while this refresh waits for another one of the same column.
        lease_seconds: how long a killed refresh blocks the next one of the same column.

    Example:
        >>> import lance, pyarrow as pa, tempfile
        >>> uri = tempfile.mkdtemp() + "/t.lance"
        >>> _ = lance.write_dataset(pa.table({"x": [1, 2, 3]}), uri)
        >>> def double(x: int) -> int:
        ...     return 2 * x
        >>> from gpufn_dagster.functions import make_function
        >>> f = make_function(double, table="t", column="y")
        >>> refresh_column(uri, f).rows_computed, refresh_column(uri, f).rows_computed
        (3, 0)
        >>> lance.dataset(uri).to_table(columns=["y"]).column("y").to_pylist()
        [2, 4, 6]
    """
    started = time.monotonic()
    dataset = lance.dataset(table_uri)
    check_input_types(function, dataset.schema)
    check_upstream(dataset, function, upstream)
    progress = Progress()
    visited = rewritten = 0
    load_seconds = computing = 0.0
    workers = concurrency or min(4, os.cpu_count() or 1)
    call: Any = None
    with ColumnLease(table_uri, function.sig_column, holder or f"pid {os.getpid()} on {socket.gethostname()}",
                     ttl=lease_seconds, on_wait=on_wait) as lease:
        try:
            dataset = ensure_columns(table_uri, function)
            version_before = dataset.version
            store = CheckpointStore(dataset.uri, function.sig_column, function.version)
            written = WrittenFiles(dataset.uri, function.sig_column)
            state = load_state(dataset.uri, function.sig_column)
            for _attempt in range(_COMMIT_ATTEMPTS):
                work = plan_fragments(dataset, function, state)
                visited = len(work)  # the final attempt covers every fragment; earlier ones are reused
                progress.restart(sum(w.live_rows for w in work))
                attempt = _Attempt(dataset, function, store, written, report, progress, call)
                with _Ticker(report, progress, report_every):
                    results = _compute(attempt, work, workers)
                call = attempt.call
                load_seconds += progress.load_seconds
                computing = progress.computing_seconds()
                total = Outcome()  # the last attempt's results cover every fragment (earlier ones are reused)
                for result in results:
                    total.add(result.outcome)
                state = _state_after(state, results)
                groups = [r.group for r in results if r.group is not None]
                if not groups:
                    break
                save_state(dataset.uri, function.sig_column, state)  # failed files are known before the commit
                lease.check()
                committed = _commit(dataset, function, groups)
                if committed is not None:
                    dataset = committed
                    rewritten += len(groups)
                    break
                # A concurrent commit touched a fragment we rewrote (compaction, an update). Re-plan on
                # the latest version; finished fragments whose state did not change are reused from
                # their checkpoints.
                dataset = lance.dataset(table_uri)
            else:
                raise CommitRacesLost(f"refresh of {function.name!r} lost {_COMMIT_ATTEMPTS} commit races in a row to "
                                   "concurrent writers of the same fragments (compaction?); run it again")
        finally:
            if call is not None and hasattr(call, "close"):
                call.close()
        current = content_keys(dataset, function)
        files = {f.path for fragment in dataset.get_fragments() for f in fragment.metadata.files}
        save_state(dataset.uri, function.sig_column,
                   ColumnState(state.verified & current, state.failed_files & files))
        files_removed = written.settle(dataset)
        store.clear()
    if report:
        report(progress)
    return RefreshResult(
        function_version=function.version, version_before=version_before, version_after=dataset.version,
        rows_computed=total.computed, rows_failed=len(total.errors), rows_checked=progress.rows_scanned,
        rows_total=dataset.count_rows(), fragments_visited=visited, fragments_rewritten=rewritten,
        fragments_total=len(dataset.get_fragments()), wall_seconds=time.monotonic() - started,
        lease_wait_seconds=lease.waited, errors=total.errors, recovered=total.recovered,
        leftover_files_removed=files_removed, load_seconds=load_seconds, compute_seconds=computing,
    )
