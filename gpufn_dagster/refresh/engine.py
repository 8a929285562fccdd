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

The worker is a pipeline, so the model never waits for the table when the table can keep up:
fragments are read by a small thread pool (Lance scans and writes release the GIL; `reads` cuts
them into calls), and each fragment thread reads and hashes its next calls, and writes its
finished ones, while one model thread calls the Function on the calls handed to it (a model is
not assumed to be thread-safe; CUDA work stays on one thread). Each fragment thread keeps at most
`prefetch` calls ahead of the one it waits for, so memory is bounded by call size x prefetch x
threads, never by the table. Calls adapt (`batches`): a small probe first, then toward a target
time per call; a call that runs out of device memory is split (`execute`).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lance.commit import CommitConflictError

from ..errors import CommitRacesLost, CommitRefused, RefreshStopped
from ..functions import Function
from .batches import BatchSizer
from .checkpoint import CheckpointStore
from .columns import ensure_columns
from .execute import BatchFit, RowError, call_function
from .files import TableFiles
from .gpu_stats import GpuSampler
from .lease import DEFAULT_TTL, ColumnLease
from .leftovers import WrittenFiles
from .plan import FragmentWork, content_keys, field_ids, plan_fragments
from .progress import Progress, Ticker
from .reads import ADDRESS, READ_ROWS, cut_calls, read_windows
from .signature import FAILED, check_input_types, row_signatures, scan_expressions
from .state import ColumnState, load_state, save_state
from .upstream import check_upstream
from .write import FragmentFileWriter, align_to_physical, data_file_name

_COMMIT_ATTEMPTS = 5
PREFETCH = 4  # batches each fragment thread stages ahead of the one the model works on


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
    busy_seconds: float = 0.0  # of those, the time spent inside the Function
    first_values_seconds: float | None = None  # from the start to the first computed values (None: none computed)
    oom_splits: int = 0  # batches retried in halves after running out of device memory
    batch_rows_that_fit: int | None = None  # the most rows a call took after a split (None: no split)
    batch_rows_largest: int = 0  # the most rows one batch was sized to (the probe, then adapted)
    gpu: dict[str, float] = field(default_factory=dict)  # NVIDIA's figures over the refresh, when available

    @property
    def busy_fraction(self) -> float:
        """Time inside the Function ÷ time computing: how busy the worker kept the model (1.0 = never idle)."""
        return self.busy_seconds / self.compute_seconds if self.compute_seconds > 0 else 0.0

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

    def __init__(self, files: TableFiles, dataset: lance.LanceDataset, function: Function, store: CheckpointStore,
                 written: WrittenFiles, report: Callable[[Progress], None] | None, progress: Progress, call: Any,
                 fit: BatchFit, sizer: BatchSizer, prefetch: int):
        self.files, self.dataset, self.function, self.store, self.written = files, dataset, function, store, written
        self.report, self.progress, self.fit, self.sizer, self.prefetch = report, progress, fit, sizer, prefetch
        self.lock = threading.Lock()
        self.call_lock = threading.Lock()
        self.call = call
        self.stop = threading.Event()  # set when a fragment failed: the others end early
        # The one thread that calls the Function (prefetch 0: each fragment thread calls it in turn).
        self.model = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpufn-model") if prefetch else None
        names = [*function.columns, function.sig_column]
        self.out_schema = pa.schema([dataset.schema.field(n) for n in names])
        self.out_ids = field_ids(dataset, names)
        # A fragment the Function never wrote needs only its inputs; others also their stored outputs.
        self.new_scan = {n: f"`{n}`" for n in function.inputs} | scan_expressions(function, dataset.schema)
        self.stale_scan = self.new_scan | {n: f"`{n}`" for n in names if n not in self.new_scan}

    def submit(self, inputs: pa.RecordBatch, addresses: np.ndarray) -> Future[tuple[pa.Array, list[RowError]]]:
        """Hand a batch to the model thread; its values come back through the future."""
        if self.model is not None:
            return self.model.submit(self.compute, inputs, addresses)
        done: Future[tuple[pa.Array, list[RowError]]] = Future()
        try:
            done.set_result(self.compute(inputs, addresses))
        except BaseException as err:
            done.set_exception(err)
        return done

    def compute(self, inputs: pa.RecordBatch, addresses: np.ndarray) -> tuple[pa.Array, list[RowError]]:
        if self.stop.is_set():
            raise RefreshStopped
        with self.call_lock:
            if self.call is None:
                self.call = self._load()
            began = time.monotonic()
            try:
                return call_function(self.call, self.function, inputs, addresses, self.fit)
            finally:
                done = time.monotonic()
                self.progress.busy_seconds += done - began
                if self.progress.first_values_at is None:
                    self.progress.first_values_at = done
                self.sizer.observe(inputs.num_rows, done - began, fits=self.fit.rows)

    def close(self) -> None:
        if self.model is not None:
            self.model.shutdown(wait=True, cancel_futures=True)

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


@dataclass
class _Staged:
    """A batch read and hashed, its stale rows handed to the model; `values` None when none is stale."""

    batch: pa.RecordBatch
    addresses: np.ndarray
    offsets: np.ndarray  # the rows' physical offsets in the fragment
    start: int  # the physical offset the batch's output starts at (after the previous batch)
    now: np.ndarray  # each row's current signature
    stale_idx: np.ndarray
    retried: np.ndarray  # rows stored as FAILED by an earlier refresh
    values: Future[tuple[pa.Array, list[RowError]]] | None

    @property
    def end(self) -> int:
        """The physical offset after its last row: where the next batch's output starts."""
        return int(self.offsets[-1]) + 1


def _stage(attempt: _Attempt, batch: pa.RecordBatch, start: int, new: bool) -> _Staged:
    """Hash a scanned batch and hand its stale rows to the model: current rows keep their values.

    In a fragment the Function never wrote (`new`), every row is stale and nothing stored is read.
    """
    function = attempt.function
    addresses = batch.column(ADDRESS).to_numpy()
    now = row_signatures(function, batch).to_numpy().copy()
    if new:
        stale_idx = np.arange(batch.num_rows)
        retried = np.zeros(batch.num_rows, dtype=bool)
    else:
        stored = batch.column(function.sig_column)
        stale_idx = np.flatnonzero(pc.fill_null(pc.not_equal(stored, pa.array(now)), True).to_numpy(
            zero_copy_only=False))
        retried = pc.fill_null(pc.equal(stored, pa.scalar(FAILED, stored.type)), False).to_numpy(zero_copy_only=False)
    values = None
    if len(stale_idx):
        inputs = batch.select(list(function.inputs))
        if len(stale_idx) < batch.num_rows:
            inputs = inputs.take(pa.array(stale_idx))
        values = attempt.submit(inputs, addresses[stale_idx])
    return _Staged(batch, addresses, (addresses & 0xFFFFFFFF).astype(np.int64), start, now, stale_idx, retried, values)


def _outputs(attempt: _Attempt, staged: _Staged) -> tuple[pa.RecordBatch, Outcome]:
    """The staged batch's output columns, once the model returned its stale rows' values.

    A row that fails is stored with the signature FAILED, so it stays stale.
    """
    function = attempt.function
    batch, addresses, now, stale_idx, retried = (staged.batch, staged.addresses, staged.now, staged.stale_idx,
                                                 staged.retried)
    outcome = Outcome(computed=len(stale_idx), changed=len(stale_idx))
    if staged.values is None:
        merged = [batch.column(name) for name in function.columns]
    else:
        values, errors = staged.values.result()
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

    def add(self, aligned: pa.RecordBatch, outcome: Outcome, end: int) -> None:
        self.batches.append(aligned)
        self.outcome.add(outcome)
        if time.monotonic() - self.since >= self.attempt.function.checkpoint_seconds:
            self.attempt.store.save_chunk(self.item, self.start, end, self.batches, self.outcome.to_json())
            self.start, self.batches, self.outcome, self.since = end, [], Outcome(), time.monotonic()


def _close_fragment(attempt: _Attempt, item: FragmentWork, writer: FragmentFileWriter, total: Outcome,
                    new: bool) -> _FragmentResult:
    """Finish the fragment's file (or drop it when nothing changed) and checkpoint the fragment as done."""
    writer.pad_to(item.physical_rows)
    writer.close()
    record: dict[str, Any] = {"file": writer.name, "major": writer.major, "minor": writer.minor,
                              "outcome": total.to_json()}
    if not new and total.changed == 0:
        # Every row is current (e.g. after compaction): keep the fragment's files as they are.
        attempt.files.delete(f"data/{writer.name}")
        record["file"] = None
    attempt.store.save_fragment(item, record)
    attempt.store.discard_batches(item)
    return _finished(attempt, item, record)


def _refresh_fragment(attempt: _Attempt, item: FragmentWork) -> _FragmentResult:
    """Compute one fragment's new column file, reusing checkpointed chunks.

    Checkpointed chunks cover the fragment from its first row on; they are written again as they
    are, and computing resumes at the first row after them. The rest is read in large batches and
    cut into calls of the size the sizer asks for; each call is hashed and handed to the model
    thread, and written in order once its values are back, with at most `prefetch` calls staged
    ahead of the one waited for.
    """
    done = attempt.store.load_fragment(item)
    if done is not None and (done["file"] is None or attempt.files.exists(f"data/{done['file']}")):
        result = _finished(attempt, item, done)
        attempt.advance(item.live_rows, result.outcome)
        return result
    name = data_file_name(f"gpufn-{attempt.function.version}-{item.inputs_hash}")
    attempt.written.note(name)  # before the file exists, so a kill cannot leave it unaccounted
    writer = FragmentFileWriter(attempt.files, attempt.dataset, name, attempt.out_schema)
    total = Outcome()
    resume_at = _restore_chunks(attempt, item, writer, total)
    pending = _PendingChunk(attempt, item, start=resume_at)
    new = item.reason == "new"
    staged: deque[_Staged] = deque()  # handed to the model, in fragment order

    def finish(ready: _Staged) -> None:
        out, outcome = _outputs(attempt, ready)
        aligned = align_to_physical(out, ready.offsets, ready.start, attempt.out_schema)
        writer.write(aligned)
        total.add(outcome)
        pending.add(aligned, outcome, ready.end)
        attempt.advance(ready.batch.num_rows, outcome)

    fragment = attempt.dataset.get_fragment(item.fragment_id)
    reads = read_windows(fragment, attempt.new_scan if new else attempt.stale_scan,
                         max(attempt.function.batch_size, READ_ROWS), attempt.stop)
    call_start = resume_at
    for batch in cut_calls(reads, lambda: attempt.sizer.rows, resume_at,
                           skipped=lambda rows: attempt.advance(rows, Outcome())):
        ready = _stage(attempt, batch, call_start, new)
        call_start = ready.end  # deleted rows before the next call's first row are its own
        staged.append(ready)
        while len(staged) > attempt.prefetch:
            finish(staged.popleft())
    while staged:
        finish(staged.popleft())
    return _close_fragment(attempt, item, writer, total, new)


def _restore_chunks(attempt: _Attempt, item: FragmentWork, writer: FragmentFileWriter, total: Outcome) -> int:
    """Write the fragment's checkpointed chunks again (they follow each other from row 0); returns
    the physical offset where computing resumes."""
    saved = attempt.store.chunks(item)
    at = 0
    while at in saved:
        at, path = saved[at]
        batches, info = attempt.store.load_chunk(path)
        for restored in batches:
            writer.write(restored)
        outcome = Outcome.from_json(info)
        total.add(outcome)
        attempt.advance(0, Outcome(errors=outcome.errors))
    return at


def _state_after(state: ColumnState, results: list[_FragmentResult]) -> ColumnState:
    """The column state with this attempt's findings added (not yet pruned)."""
    return ColumnState(
        verified=state.verified | {r.work.content_key for r in results if r.group is None and not r.outcome.errors},
        failed_files=state.failed_files | {r.file for r in results if r.file and r.outcome.errors})


def _compute(attempt: _Attempt, work: list[FragmentWork], workers: int) -> list[_FragmentResult]:
    """Every planned fragment's new column file, `workers` fragments at a time.

    The first fragment that fails stops the others (no GPU time is spent on a refresh that cannot
    commit), and its error is the one raised.
    """
    error: BaseException | None = None
    try:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gpufn-refresh") as pool:
            futures = [pool.submit(_refresh_fragment, attempt, item) for item in work]
            wait(futures, return_when=FIRST_EXCEPTION)
            error = next((f.exception() for f in futures if f.done() and f.exception() is not None), None)
            if error is not None:
                attempt.stop.set()
                for future in futures:
                    future.cancel()
    finally:
        attempt.close()
    if error is not None:
        raise error
    return [f.result() for f in futures]


def _commit(files: TableFiles, dataset: lance.LanceDataset, function: Function,
            groups: list[lance.LanceOperation.DataReplacementGroup]) -> lance.LanceDataset | None:
    """One DataReplacement of every rewritten fragment at the version read; None when a concurrent
    writer of the same fragments won the race (the caller re-plans)."""
    try:
        return files.commit(lance.LanceOperation.DataReplacement(groups), dataset.version,
                            f"gpufn refresh {function.name} version {function.version}")
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
    prefetch: int = PREFETCH,
    storage_options: dict[str, str] | None = None,
) -> RefreshResult:
    """Bring the Function's column up to date; returns what was done. Safe to kill and re-run.

    Args:
        table_uri: the Lance dataset (`<db>/<table>.lance`): a local path or an object store's URI
            (`s3://bucket/db/t.lance`); checkpoints, state and the lease live beside it.
        function: the Function spec (`make_function`).
        report: called with the progress every `report_every` seconds and at the end.
        concurrency: fragments processed at once (default: up to 4, by CPU count).
        upstream: Functions whose output columns this one reads; the refresh refuses to start
            while one of them is not current (`UpstreamNotCurrent`).
        holder: who refreshes (a run id), shown to a refresh of the same column that waits.
        on_wait: called with a line while this refresh waits for another one of the same column.
        lease_seconds: how long a killed refresh blocks the next one of the same column.
        prefetch: batches each fragment thread reads and hashes ahead of the one the model works
            on; 0 calls the Function from the fragment threads in turn, reading nothing ahead.
        storage_options: how to reach an object store (endpoint, region, credentials), as Lance
            takes them; none reads the `AWS_*` environment variables.

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
    files = TableFiles(table_uri, storage_options)
    dataset = files.dataset()
    check_input_types(function, dataset.schema)
    check_upstream(files, dataset, function, upstream)
    progress = Progress()
    visited = rewritten = 0
    load_seconds = computing = 0.0
    workers = concurrency or min(4, os.cpu_count() or 1)
    call: Any = None
    fit = BatchFit()
    sizer = BatchSizer(function.batch_size, function.max_batch_size, adapt=function.adapt_batch_size)
    lease = ColumnLease(files, function.sig_column, holder or f"pid {os.getpid()} on {socket.gethostname()}",
                        ttl=lease_seconds, on_wait=on_wait)
    with GpuSampler() as gpu, lease:
        try:
            dataset = ensure_columns(files, function)
            version_before = dataset.version
            store = CheckpointStore(files, function.sig_column, function.version)
            written = WrittenFiles(files, function.sig_column)
            state = load_state(files, function.sig_column)
            for _attempt in range(_COMMIT_ATTEMPTS):
                work = plan_fragments(dataset, function, state)
                visited = len(work)  # the final attempt covers every fragment; earlier ones are reused
                progress.restart(sum(w.live_rows for w in work))
                attempt = _Attempt(files, dataset, function, store, written, report, progress, call, fit, sizer, prefetch)
                with Ticker(report, progress, report_every):
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
                save_state(files, function.sig_column, state)  # failed files are known before the commit
                lease.check()
                committed = _commit(files, dataset, function, groups)
                if committed is not None:
                    dataset = committed
                    rewritten += len(groups)
                    break
                # A concurrent commit touched a fragment we rewrote (compaction, an update). Re-plan on
                # the latest version; finished fragments whose state did not change are reused from
                # their checkpoints.
                dataset = files.dataset()
            else:
                raise CommitRacesLost(f"refresh of {function.name!r} lost {_COMMIT_ATTEMPTS} commit races in a row to "
                                   "concurrent writers of the same fragments (compaction?); run it again")
        finally:
            if call is not None and hasattr(call, "close"):
                call.close()
        current = content_keys(dataset, function)
        in_use = {f.path for fragment in dataset.get_fragments() for f in fragment.metadata.files}
        save_state(files, function.sig_column,
                   ColumnState(state.verified & current, state.failed_files & in_use))
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
        busy_seconds=progress.busy_seconds, oom_splits=fit.splits, batch_rows_that_fit=fit.rows, gpu=gpu.figures(),
        batch_rows_largest=sizer.largest,
        first_values_seconds=None if progress.first_values_at is None else progress.first_values_at - started,
    )
