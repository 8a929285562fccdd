"""Computing a fragment's new column values: the worker's pipeline, shared by a refresh on one
worker (`engine`) and the shards of a refresh spread over several (`fanout`).

The column's values for a fragment are written as one new Lance data file aligned to the
fragment's physical rows (deleted rows hold NULL). The worker is a pipeline, so the model never
waits for the table when the table can keep up: fragments are read by a small thread pool (Lance
scans and writes release the GIL; `reads` cuts them into calls), and each fragment thread reads
and hashes its next calls, and writes its finished ones, while one model thread calls the
Function on the calls handed to it (a model is not assumed to be thread-safe; CUDA work stays on
one thread). Each fragment thread keeps at most `prefetch` calls ahead of the one it waits for, so
memory is bounded by call size x prefetch x threads, never by the table. Calls adapt (`batches`):
a small probe first, then toward a target time per call; a call that runs out of device memory
is split (`execute`).

Progress is checkpointed as chunks of physical rows (`checkpoint`). A shard computing part of a
fragment (`refresh_range`) leaves only chunks; whoever commits (`assemble_fragment`) joins the
chunks of all shards into the fragment's file without calling the Function.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import FailureBudgetExceeded, PartDamaged, RefreshStopped
from ..function_spec.error_policy import over_budget
from .execute import RowError, Rows
from .plan import FragmentWork
from .progress import Progress
from .reads import ADDRESS, ROW_ID, cut_calls, live_counter, live_offset, read_windows, row_offsets, split_address
from .shards import Piece
from .signature import FAILED, row_signatures, scan_expressions
from .slices import SLICE_FILE_PREFIX
from .worker import Worker
from .write import FragmentFileWriter, align_to_physical, data_file_name, file_field_ids

_log = logging.getLogger(__name__)
FIRST_ERRORS = 3  # errors a stop past the failure budget quotes
PREFETCH = 4  # batches each fragment thread stages ahead of the one the model works on


@dataclass
class Outcome:
    """What computing some rows produced besides their values."""

    errors: list[RowError] = field(default_factory=list)
    # rows that had failed and now succeeded: (address, stable row id or None)
    recovered: list[tuple[int, int | None]] = field(default_factory=list)
    computed: int = 0  # rows the Function gave a value (failed rows are `errors`)
    changed: int = 0  # rows whose stored value or signature differs from before
    adopted: int = 0  # rows whose values came from checkpoints another refresh (a killed run) saved

    def add(self, other: Outcome) -> None:
        self.errors.extend(other.errors)
        self.recovered.extend(other.recovered)
        self.computed += other.computed
        self.changed += other.changed
        self.adopted += other.adopted

    def to_json(self, by: str) -> dict[str, Any]:
        """As a checkpoint keeps it, with `by`: the refresh that computed it (`Worker.token`)."""
        return {"errors": [asdict(e) for e in self.errors], "recovered": [list(r) for r in self.recovered],
                "computed": self.computed, "changed": self.changed, "adopted": self.adopted, "by": by}

    @classmethod
    def from_json(cls, data: dict[str, Any], token: str) -> Outcome:
        """A checkpoint's outcome, read by the refresh `token`: rows another refresh computed are
        adopted, not computed by this one (an earlier attempt of this refresh computed its own).

        >>> saved = Outcome(computed=5, adopted=2).to_json(by="run-a")
        >>> (Outcome.from_json(saved, "run-a").computed, Outcome.from_json(saved, "run-b").adopted)
        (5, 7)
        """
        recovered = [(r, None) if isinstance(r, int) else (int(r[0]), r[1]) for r in data.get("recovered", [])]
        outcome = cls([RowError(**e) for e in data.get("errors", [])], recovered, data.get("computed", 0),
                      data.get("changed", 0), data.get("adopted", 0))
        if data.get("by") != token:
            outcome.adopted, outcome.computed = outcome.adopted + outcome.computed, 0
        return outcome


@dataclass
class FragmentResult:
    work: FragmentWork
    group: lance.LanceOperation.DataReplacementGroup | None  # None: nothing changed, nothing rewritten
    outcome: Outcome
    file: str | None
    incomplete: bool = False  # assembled, and the shards' chunks did not cover it (changed meanwhile)


class Attempt:
    """State shared by the fragment workers of one plan-compute-commit attempt at one table version."""

    def __init__(self, worker: Worker, dataset: lance.LanceDataset, progress: Progress):
        self.files, self.function, self.store, self.written = worker.files, worker.function, worker.store, worker.written
        self.instance, self.fit, self.sizer, self.prefetch = worker.instance, worker.fit, worker.sizer, worker.prefetch
        self.token, self.computed_rows = worker.token, worker.computed_rows
        self.report, self.dataset, self.progress = worker.report, dataset, progress
        self.lock = threading.Lock()
        self.call_lock = threading.Lock()
        self.stop = threading.Event()  # set when a fragment failed: the others end early
        self.first_errors: list[RowError] = []  # what a stop past the failure budget quotes
        self.calling: int | None = None  # the thread in the Function's call, while one is in flight
        # The one thread that calls the Function (prefetch 0: each fragment thread calls it in turn).
        self.model = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpufn-model") if self.prefetch else None
        names = [*self.function.columns, self.function.sig_column]
        self.out_schema = pa.schema([dataset.schema.field(n) for n in names])
        self.out_ids = file_field_ids(dataset, names)  # what its data files list
        # A fragment the Function never wrote needs only its inputs; others also their stored outputs.
        self.new_scan = {n: f"`{n}`" for n in self.function.inputs} | scan_expressions(self.function, dataset.schema)
        self.stale_scan = self.new_scan | {n: f"`{n}`" for n in names if n not in self.new_scan}

    def submit(self, inputs: pa.RecordBatch, rows: Rows) -> Future[tuple[pa.Array, list[RowError]]]:
        """Hand a batch to the model thread; its values come back through the future."""
        if self.model is not None:
            return self.model.submit(self.compute, inputs, rows)
        done: Future[tuple[pa.Array, list[RowError]]] = Future()
        try:
            done.set_result(self.compute(inputs, rows))
        except BaseException as err:
            done.set_exception(err)
        return done

    def compute(self, inputs: pa.RecordBatch, rows: Rows) -> tuple[pa.Array, list[RowError]]:
        with self.call_lock:
            if self.stop.is_set():
                raise RefreshStopped
            self.instance.ready(self.progress, self.report)
            began = time.monotonic()
            try:
                self.calling = threading.get_ident()
                return self.instance.call(inputs, rows, self.fit)
            finally:
                self.calling = None
                done = time.monotonic()
                self.progress.busy_seconds += done - began
                if self.progress.first_values_at is None:
                    self.progress.first_values_at = done
                    self.progress.first_call_seconds = done - began
                self.sizer.observe(inputs.num_rows, done - began, fits=self.fit.rows)

    def halt(self, interrupt: bool) -> None:
        """Stop the refresh's fragments between calls; with `interrupt` (the run was terminated) also
        the Function's call in flight, so its GPU is free within seconds, not after the call."""
        self.stop.set()
        calling = self.calling
        if interrupt and calling is not None:
            self.instance.interrupt(calling)

    def close(self) -> None:
        if self.model is not None:
            self.model.shutdown(wait=True, cancel_futures=True)

    def adopted_part(self, outcome: Outcome) -> None:
        """A checkpointed part was used (its checksum verified): one more adopted part when another
        refresh saved it (its rows are `outcome.adopted`)."""
        if outcome.adopted:
            with self.lock:
                self.progress.parts_adopted += 1

    def damaged_part(self, error: PartDamaged) -> None:
        """A checkpointed part failed its checksum (and was removed): counted, so the progress and
        the materialization say so, and logged with its name."""
        with self.lock:
            self.progress.parts_damaged += 1
        _log.warning("%s", error)

    def advance(self, scanned: int, outcome: Outcome) -> None:
        """Count the rows done; past the Function's failure budget, stop the refresh (this raises)."""
        with self.lock:
            self.progress.rows_scanned += scanned
            self.progress.rows_computed += outcome.computed
            self.progress.rows_adopted += outcome.adopted
            self.progress.rows_failed += len(outcome.errors)
            self.first_errors.extend(outcome.errors[:FIRST_ERRORS - len(self.first_errors)])
            failed, checked = self.progress.rows_failed, self.progress.rows_to_scan
        if outcome.errors and (over := over_budget(self.function.options, failed, checked)):
            self.stop.set()
            raise FailureBudgetExceeded(
                f"Function {self.function.name!r}: {failed:,} rows failed of the {checked:,} this refresh checks, "
                f"more than {over}; the refresh stopped and committed nothing (checkpoints stay). First errors: "
                + "; ".join(f"row id {e.row_id if e.row_id is not None else e.row_address}: {e.error} "
                            f"(attempt {e.attempt}, rule {e.rule})" for e in self.first_errors))


@dataclass
class _Staged:
    """A batch read and hashed, its stale rows handed to the model; `values` None when none is stale."""

    batch: pa.RecordBatch
    addresses: np.ndarray
    start: int  # the physical offset the batch's output starts at (after the previous batch)
    now: np.ndarray  # each row's current signature
    stale_idx: np.ndarray  # the rows handed to the model (every row when `all_stale`)
    retried: np.ndarray | None  # rows stored as FAILED by an earlier refresh (None: none)
    values: Future[tuple[pa.Array, list[RowError]]] | None
    keep: np.ndarray | None = None  # rows of other slices, carried as stored (None: none)

    @property
    def all_stale(self) -> bool:
        return len(self.stale_idx) == self.batch.num_rows

    @cached_property
    def offsets(self) -> np.ndarray:
        """The rows' physical offsets in the fragment (computed only where rows were deleted, or for a slice)."""
        return row_offsets(self.addresses)

    def aligned(self, out: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
        """`out` placed at the rows' physical offsets from `start` (deleted rows NULL): as it is without deletions."""
        return out if self.end - self.start == out.num_rows else align_to_physical(out, self.offsets, self.start,
                                                                                   schema)

    @property
    def checked(self) -> int:
        """The rows of the batch this refresh is about (its slice's)."""
        return self.batch.num_rows if self.keep is None else int(np.count_nonzero(~self.keep))

    @property
    def end(self) -> int:
        """The physical offset after its last row: where the next batch's output starts."""
        return split_address(int(self.addresses[-1]))[1] + 1


def _stage(attempt: Attempt, batch: pa.RecordBatch, start: int, new: bool, inside: np.ndarray | None) -> _Staged:
    """Hash a scanned batch and hand its stale rows to the model: current rows keep their values.

    In a fragment the Function never wrote (`new`), every row is stale and nothing stored is read.
    `inside`: the physical offsets of the slice's rows (None: all rows); the others keep their
    stored values and signatures and are never passed to the Function.
    """
    function = attempt.function
    addresses = batch.column(ADDRESS).to_numpy()
    keep = None if inside is None else ~np.isin(row_offsets(addresses), inside, assume_unique=True)
    if keep is None:
        now = row_signatures(function, batch).to_numpy().copy()
    else:  # only the slice's rows are hashed; the others keep their stored signatures (`_outputs`)
        now = np.zeros(batch.num_rows, dtype=np.uint64)
        mine = np.flatnonzero(~keep)
        if len(mine):
            now[mine] = row_signatures(function, batch.take(pa.array(mine))).to_numpy()
    retried = None
    if new:
        stale_idx = np.arange(batch.num_rows)
    else:
        stored = batch.column(function.sig_column)
        stale_idx = np.flatnonzero(pc.fill_null(pc.not_equal(stored, pa.array(now)), True).to_numpy(
            zero_copy_only=False))
        failed_before = pc.fill_null(pc.equal(stored, pa.scalar(FAILED, stored.type)), False)
        if pc.any(failed_before).as_py():
            retried = failed_before.to_numpy(zero_copy_only=False)
    if keep is not None:
        stale_idx = stale_idx[~keep[stale_idx]]
    values = None
    if len(stale_idx):
        inputs = batch.select(list(function.inputs))
        ids = batch.column(ROW_ID).to_numpy() if ROW_ID in batch.schema.names else None
        rows = Rows(addresses, ids)
        if len(stale_idx) < batch.num_rows:
            inputs = inputs.take(pa.array(stale_idx))
            rows = Rows(addresses[stale_idx], None if ids is None else ids[stale_idx])
        values = attempt.submit(inputs, rows)
    return _Staged(batch, addresses, start, now, stale_idx, retried, values, keep)


def _outputs(attempt: Attempt, staged: _Staged) -> tuple[pa.RecordBatch, Outcome]:
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
        if staged.all_stale:
            merged = computed
        else:
            selector = np.arange(batch.num_rows)
            selector[stale_idx] = batch.num_rows + np.arange(len(stale_idx))
            merged = [pa.concat_arrays([batch.column(name), c.cast(batch.column(name).type)]).take(pa.array(selector))
                      for name, c in zip(function.columns, computed, strict=True)]
        if errors or retried is not None:  # rows failed now, or had failed before
            failed = np.isin(addresses, np.array([e.row_address for e in errors], dtype=np.uint64))
            retried = np.zeros(batch.num_rows, dtype=bool) if retried is None else retried
            now[failed] = FAILED
            was_failed = {int(a) for a in addresses[retried]}
            outcome.errors = [replace(e, retried=e.row_address in was_failed) for e in errors]
            outcome.computed -= int(np.count_nonzero(failed[stale_idx]))
            back = stale_idx[retried[stale_idx] & ~failed[stale_idx]]
            ids = batch.column(ROW_ID).to_numpy() if ROW_ID in batch.schema.names else None
            outcome.recovered = [(int(addresses[i]), None if ids is None else int(ids[i])) for i in back]
            given = stale_idx[~failed[stale_idx]]
            # Only stale rows get a new signature; one that failed again keeps the FAILED it had.
            outcome.changed -= int(np.count_nonzero(failed & retried))
        else:
            given = None if staged.all_stale else stale_idx
        if attempt.computed_rows is not None:  # which rows got a value, when the caller counts them per slice
            attempt.computed_rows.append(addresses if given is None else addresses[given])
    merged = [m.cast(f.type) for m, f in zip(merged, attempt.out_schema, strict=False)]
    signatures = pa.array(now, type=attempt.out_schema.field(-1).type)
    if staged.keep is not None and staged.keep.any():  # other slices' rows keep theirs, NULL included
        signatures = pc.if_else(pa.array(staged.keep), batch.column(function.sig_column), signatures)
    return pa.RecordBatch.from_arrays([*merged, signatures], schema=attempt.out_schema), outcome


def _finished(attempt: Attempt, item: FragmentWork, record: dict[str, Any]) -> FragmentResult:
    outcome = Outcome.from_json(record["outcome"], attempt.token)
    if record["file"] is None:
        return FragmentResult(item, None, outcome, None)
    data_file = lance.fragment.DataFile(record["file"], attempt.out_ids, list(range(len(attempt.out_ids))),
                                        record["major"], record["minor"])
    return FragmentResult(item, lance.LanceOperation.DataReplacementGroup(item.fragment_id, data_file), outcome,
                           record["file"])


class _PendingChunk:
    """The batches computed since the last checkpoint of one fragment; saved as a chunk when due."""

    def __init__(self, attempt: Attempt, item: FragmentWork, start: int):
        self.attempt, self.item = attempt, item
        self.start, self.at, self.batches, self.outcome, self.since = start, start, [], Outcome(), time.monotonic()

    def add(self, aligned: pa.RecordBatch, outcome: Outcome, end: int) -> None:
        self.batches.append(aligned)
        self.outcome.add(outcome)
        self.at = end
        if time.monotonic() - self.since >= self.attempt.function.options.checkpoint_seconds:
            self.save()

    def save(self) -> None:
        if self.at > self.start:
            self.attempt.store.save_chunk(self.item, self.start, self.at, self.batches,
                                          self.outcome.to_json(by=self.attempt.token))
        self.start, self.batches, self.outcome, self.since = self.at, [], Outcome(), time.monotonic()

    def close_at(self, end: int) -> None:
        """Save what is left as the chunk ending at `end` (rows deleted before it held as NULL)."""
        if end > self.at:
            schema = self.attempt.out_schema
            self.batches.append(pa.RecordBatch.from_arrays([pa.nulls(end - self.at, f.type) for f in schema],
                                                           schema=schema))
            self.at = end
        self.save()


def _close_fragment(attempt: Attempt, item: FragmentWork, writer: FragmentFileWriter, total: Outcome,
                    new: bool) -> FragmentResult:
    """Finish the fragment's file (or drop it when nothing changed) and checkpoint the fragment as done."""
    writer.pad_to(item.physical_rows)
    writer.close()
    record: dict[str, Any] = {"file": writer.name, "major": writer.major, "minor": writer.minor,
                              "outcome": total.to_json(by=attempt.token), "rows": item.live_rows}
    if not new and total.changed == 0:
        # Every row is current (e.g. after compaction): keep the fragment's files as they are.
        attempt.files.delete(f"data/{writer.name}")
        record["file"] = None
    else:  # what a later refresh verifies before it adopts the file instead of computing the fragment
        record["checksum"] = attempt.files.stored_checksum(f"data/{writer.name}")
    attempt.store.save_fragment(item, record)
    attempt.store.discard_batches(item)
    return _finished(attempt, item, record)


def _segments(saved: dict[int, tuple[int, str]], start: int, end: int) -> list[tuple[int, int, str | None]]:
    """Physical rows [start, end) as saved chunks (their names) and the gaps between them (None),
    in order: a gap runs to the next saved chunk's start, so the chunks of a refresh that split
    the fragment another way (a killed run with other shards) are used as well as its own.

    >>> _segments({0: (10, "a"), 10: (25, "b"), 30: (40, "c")}, 0, 100)
    [(0, 10, 'a'), (10, 25, 'b'), (25, 30, None), (30, 40, 'c'), (40, 100, None)]
    >>> _segments({0: (10, "a")}, 5, 8)
    [(5, 8, None)]
    """
    starts = sorted(s for s in saved if start < s < end)
    segments: list[tuple[int, int, str | None]] = []
    at = start
    while at < end:
        if at in saved:
            segments.append((at, saved[at][0], saved[at][1]))
            at = saved[at][0]
            continue
        following = next((s for s in starts if s > at), end)
        segments.append((at, following, None))
        at = following
    return segments


def _adopt(attempt: Attempt, live: Callable[[int], int], start: int, end: int, name: str,
           write: Callable[[pa.RecordBatch], None] | None = None) -> Outcome | None:
    """Use a saved chunk for physical rows [start, end) of a fragment (`live`: its `live_counter`):
    its batches to `write`, its outcome counted; None when it failed its checksum (removed: the
    caller computes its rows)."""
    try:
        batches, info = attempt.store.load_chunk(name)
    except PartDamaged as error:
        attempt.damaged_part(error)
        return None
    for batch in batches if write is not None else ():
        write(batch)
    outcome = Outcome.from_json(info, attempt.token)
    attempt.advance(live(end) - live(start),
                    Outcome(errors=outcome.errors, computed=outcome.computed, adopted=outcome.adopted))
    attempt.adopted_part(outcome)
    return outcome


def _compute_rows(attempt: Attempt, item: FragmentWork, start: int, end: int,
                  finish: Callable[[_Staged], None]) -> None:
    """Compute the fragment's rows at physical offsets [start, end): read in large batches, cut into
    calls of the size the sizer asks for, each hashed and handed to the model thread, and given to
    `finish` in order once its values are back, with at most `prefetch` calls staged ahead of the
    one waited for."""
    new = item.reason == "new" and item.rows is None  # part of a fragment: the other rows' values are read
    staged: deque[_Staged] = deque()  # handed to the model, in fragment order
    fragment = attempt.dataset.get_fragment(item.fragment_id)
    reads = read_windows(fragment, attempt.new_scan if new else attempt.stale_scan, lambda: attempt.sizer.rows,
                         attempt.stop,
                         offset=live_offset(fragment, start))
    call_start = start
    for batch in cut_calls(reads, lambda: attempt.sizer.rows, start, end=end, counted=item.rows):
        ready = _stage(attempt, batch, call_start, new, item.rows)
        call_start = ready.end  # deleted rows before the next call's first row are its own
        staged.append(ready)
        while len(staged) > attempt.prefetch:
            finish(staged.popleft())
    while staged:
        finish(staged.popleft())


def _finished_record(attempt: Attempt, item: FragmentWork) -> dict[str, Any] | None:
    """The record of an earlier refresh that finished the fragment, once its file's checksum
    verified; None when there is none or it failed (then removed, counted and logged)."""
    try:
        return attempt.store.load_fragment(item)
    except PartDamaged as error:
        attempt.damaged_part(error)
        return None


def _restored(attempt: Attempt, item: FragmentWork) -> FragmentResult | list[tuple[int, int, str | None]]:
    """The fragment's result when an earlier refresh finished it (its file's checksum verified);
    else its rows as saved chunks and gaps to compute (`_segments`)."""
    done = _finished_record(attempt, item)
    if done is not None:
        result = _finished(attempt, item, done)
        attempt.advance(item.live_rows, result.outcome)
        if result.file is not None:
            attempt.adopted_part(result.outcome)
        return result
    return _segments(attempt.store.chunks(item), 0, item.physical_rows)


def _rewrite(attempt: Attempt, item: FragmentWork, segments: list[tuple[int, int, str | None]], *,
             assemble: bool = False) -> FragmentResult:
    """Write the fragment's new file: its checkpointed chunks as they are, the rows between them
    computed; `assemble` (the commit, which never calls the Function) leaves the fragment as it is
    when a chunk fails its checksum."""
    # Only a file of every row computed may say so in its name (`plan.OUR_FILE`).
    name = data_file_name(SLICE_FILE_PREFIX if item.rows is not None
                          else f"gpufn-{attempt.function.version}-{item.inputs_hash}")
    attempt.written.note(name)  # before the file exists, so a kill cannot leave it unaccounted
    writer = FragmentFileWriter(attempt.files, attempt.dataset, name, attempt.out_schema)
    total = Outcome()
    pending: _PendingChunk | None = None
    live = live_counter(attempt.dataset.get_fragment(item.fragment_id))

    def finish(ready: _Staged) -> None:
        out, outcome = _outputs(attempt, ready)
        aligned = ready.aligned(out, attempt.out_schema)
        writer.write(aligned)
        total.add(outcome)
        pending.add(aligned, outcome, ready.end)
        attempt.advance(ready.checked, outcome)

    for start, end, chunk in segments:
        if chunk is not None and (outcome := _adopt(attempt, live, start, end, chunk, writer.write)) is not None:
            total.add(outcome)
            continue
        if assemble and chunk is not None:  # it failed its checksum: the fragment is the next refresh's
            writer.close()
            attempt.files.delete(f"data/{name}")
            return FragmentResult(item, None, Outcome(), None, incomplete=True)
        pending = _PendingChunk(attempt, item, start=start)
        _compute_rows(attempt, item, start, end, finish)
        if end < item.physical_rows:  # a saved chunk follows: the rows up to it (deleted ones NULL) are one chunk
            writer.pad_to(end)
            pending.close_at(end)
    return _close_fragment(attempt, item, writer, total, item.reason == "new")


def refresh_fragment(attempt: Attempt, item: FragmentWork) -> FragmentResult:
    """Compute one fragment's new column file, reusing checkpointed chunks (any refresh's of this
    Function version and fragment content, each checksum-verified): only the rows between them are
    computed."""
    restored = _restored(attempt, item)
    if isinstance(restored, FragmentResult):
        return restored
    return _rewrite(attempt, item, restored)


def assemble_fragment(attempt: Attempt, item: FragmentWork) -> FragmentResult:
    """Join the chunks the shards of a fanned-out refresh computed into the fragment's new file,
    never calling the Function; a fragment the chunks do not cover whole (it changed since the
    plan) is left as it is (`incomplete`), for the next refresh."""
    restored = _restored(attempt, item)
    if isinstance(restored, FragmentResult):
        return restored
    if any(chunk is None for *_, chunk in restored) and item.live_rows:
        return FragmentResult(item, None, Outcome(), None, incomplete=True)
    return _rewrite(attempt, item, restored, assemble=True)


def refresh_range(attempt: Attempt, item: FragmentWork, piece: Piece) -> Outcome:
    """Compute a shard's part of a fragment, physical rows [piece.start, piece.end), as checkpoint
    chunks only (the commit joins them with the other shards' into the fragment's file); rows that
    saved chunks hold (a killed attempt's of this shard, or any earlier refresh's, each
    checksum-verified) are adopted, only those between them computed. Returns what computing it
    produced."""
    if _finished_record(attempt, item) is not None:  # another attempt finished the whole fragment
        return Outcome()
    total = Outcome()
    live = live_counter(attempt.dataset.get_fragment(item.fragment_id))
    for start, end, chunk in _segments(attempt.store.chunks(item), piece.start, piece.end):
        if chunk is not None and (outcome := _adopt(attempt, live, start, end, chunk)) is not None:
            total.add(outcome)
            continue
        pending = _PendingChunk(attempt, item, start=start)

        def finish(ready: _Staged, pending: _PendingChunk = pending) -> None:
            out, outcome = _outputs(attempt, ready)
            pending.add(ready.aligned(out, attempt.out_schema), outcome, ready.end)
            total.add(outcome)
            attempt.advance(ready.checked, outcome)

        _compute_rows(attempt, item, start, end, finish)
        pending.close_at(end)
    return total


def compute_fragments(attempt: Attempt, work: Sequence[Any], workers: int,
                      step: Callable[[Attempt, Any], Any] = refresh_fragment,
                      on_done: Callable[[Any], None] | None = None) -> list[Any]:
    """`step` of every planned fragment (or shard piece), `workers` at a time; by default each
    fragment's new column file. `on_done` is called with each result as it comes, in this thread.

    The first fragment that fails stops the others (no GPU time is spent on a refresh that cannot
    commit), and its error is the one raised.
    """
    error: BaseException | None = None
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gpufn-refresh")
    try:
        futures = [pool.submit(step, attempt, item) for item in work]
        for future in as_completed(futures):
            try:
                if future.exception() is not None:
                    raise future.exception()
                if on_done is not None:
                    on_done(future.result())
            except Exception as err:  # noqa: BLE001 - the first failure stops the others, then is raised
                error = err
                attempt.halt(interrupt=False)
                break
    except BaseException:  # the run was terminated (Dagster's interrupt): stop the call in flight too
        attempt.halt(interrupt=True)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        attempt.close()
    if error is not None:
        raise error
    return [f.result() for f in futures]
