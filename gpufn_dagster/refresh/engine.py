"""Refreshing a Function column: plan, compute per fragment, write, commit once.

The column's values for a fragment are written as one new Lance data file aligned to the
fragment's physical rows (deleted rows hold NULL), and all fragments are committed in a single
`DataReplacement` at the version the plan read. DataReplacement only conflicts with a writer that
touches the same fragment *and* field (or compacts it), so rows appended, updated or deleted
meanwhile are kept; appended rows are filled by the next refresh. One commit means readers never
see a column half from one Function version and half from another.

Fragments are processed by a small thread pool (Lance scans and writes release the GIL); calls
into the Function are serialized by a lock, because one worker's model is not assumed to be
thread-safe.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..functions import Function
from .checkpoint import CheckpointStore
from .columns import ensure_columns
from .execute import RowError, call_function
from .plan import FragmentWork, field_ids, plan_fragments
from .signature import row_signatures, scan_expressions
from .write import FragmentFileWriter, align_to_physical

ADDRESS = "_rowaddr"
_COMMIT_ATTEMPTS = 5


@dataclass
class Progress:
    """What the run log shows during a long refresh."""

    rows_scanned: int = 0
    rows_to_scan: int = 0
    rows_computed: int = 0
    rows_failed: int = 0
    started: float = field(default_factory=time.monotonic)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    @property
    def rate(self) -> float:
        return self.rows_scanned / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def seconds_left(self) -> float | None:
        return (self.rows_to_scan - self.rows_scanned) / self.rate if self.rate > 0 else None

    def line(self) -> str:
        left = self.seconds_left
        eta = f"{left:.0f}s left" if left is not None else "time left unknown"
        return (f"{self.rows_scanned:,}/{self.rows_to_scan:,} rows checked, {self.rows_computed:,} computed, "
                f"{self.rows_failed:,} failed, {self.rate:,.0f} rows/s, {eta}")


@dataclass
class RefreshResult:
    function_version: str
    version_before: int
    version_after: int
    rows_computed: int
    rows_failed: int
    rows_checked: int
    fragments_visited: int
    fragments_total: int
    wall_seconds: float
    errors: list[RowError]

    @property
    def rows_per_second(self) -> float:
        return self.rows_computed / self.wall_seconds if self.wall_seconds > 0 else 0.0


class _Run:
    """State shared by the fragment workers of one refresh attempt."""

    def __init__(self, dataset: lance.LanceDataset, function: Function, store: CheckpointStore,
                 report: Callable[[Progress], None] | None, report_every: float, progress: Progress):
        self.dataset, self.function, self.store = dataset, function, store
        self.report, self.report_every, self.progress = report, report_every, progress
        self.lock = threading.Lock()
        self.call_lock = threading.Lock()
        self.call: Any = None
        self.errors: list[RowError] = []
        self.last_report = time.monotonic()
        names = [*function.columns, function.sig_column]
        self.out_schema = pa.schema([dataset.schema.field(n) for n in names])
        self.out_ids = field_ids(dataset, names)
        # A fragment the Function never wrote needs only its inputs; others also their stored outputs.
        self.new_scan = {n: f"`{n}`" for n in function.inputs} | scan_expressions(function, dataset.schema)
        self.stale_scan = self.new_scan | {n: f"`{n}`" for n in names if n not in self.new_scan}

    def compute(self, inputs: pa.RecordBatch, addresses: np.ndarray) -> tuple[pa.Array, list[RowError]]:
        with self.call_lock:
            if self.call is None:
                self.call = self.function.open()
            return call_function(self.call, self.function, inputs, addresses)

    def advance(self, scanned: int, computed: int, errors: list[RowError]) -> None:
        with self.lock:
            self.progress.rows_scanned += scanned
            self.progress.rows_computed += computed
            self.progress.rows_failed += len(errors)
            self.errors.extend(errors)
            if self.report and time.monotonic() - self.last_report >= self.report_every:
                self.report(self.progress)
                self.last_report = time.monotonic()

    def close(self) -> None:
        if self.call is not None and hasattr(self.call, "close"):
            self.call.close()


def _outputs(run: _Run, batch: pa.RecordBatch, addresses: np.ndarray,
             new: bool) -> tuple[pa.RecordBatch, list[RowError], int]:
    """Output columns for a scanned batch: current rows keep their values, stale rows are computed.

    In a fragment the Function never wrote (`new`), every row is stale and nothing stored is read.
    """
    function = run.function
    now = row_signatures(function, batch)
    if new:
        stale_idx = np.arange(batch.num_rows)
        old: list[pa.Array] = []
    else:
        stored = batch.column(function.sig_column)
        stale_idx = np.flatnonzero(pc.fill_null(pc.not_equal(stored, now), True).to_numpy(zero_copy_only=False))
        old = [batch.column(name) for name in function.columns]
    errors: list[RowError] = []
    if len(stale_idx) == batch.num_rows:
        values, errors = run.compute(batch.select(list(function.inputs)), addresses)
        merged = [values] if len(function.columns) == 1 else values.flatten()
    elif len(stale_idx):
        values, errors = run.compute(batch.select(list(function.inputs)).take(pa.array(stale_idx)),
                                     addresses[stale_idx])
        new = [values] if len(function.columns) == 1 else values.flatten()
        selector = np.arange(batch.num_rows)
        selector[stale_idx] = batch.num_rows + np.arange(len(stale_idx))
        merged = [pa.concat_arrays([o, n.cast(o.type)]).take(pa.array(selector)) for o, n in zip(old, new, strict=True)]
    else:
        merged = old
    merged = [m.cast(f.type) for m, f in zip(merged, run.out_schema, strict=False)]
    return pa.RecordBatch.from_arrays([*merged, now], schema=run.out_schema), errors, len(stale_idx)


def _refresh_fragment(run: _Run, item: FragmentWork) -> lance.LanceOperation.DataReplacementGroup:
    """Compute one fragment's new column file (reusing checkpointed batches); returns its replacement."""
    done = run.store.load_fragment(item)
    if done is not None and (Path(run.dataset.uri) / "data" / done["file"]).exists():
        run.advance(item.live_rows, 0, [RowError(**e) for e in done.get("errors", [])])
        return lance.LanceOperation.DataReplacementGroup(item.fragment_id, lance.fragment.DataFile(
            done["file"], run.out_ids, list(range(len(run.out_ids))), done["major"], done["minor"]))
    fragment = run.dataset.get_fragment(item.fragment_id)
    writer = FragmentFileWriter(run.dataset, f"gpufn-{run.function.version}-{item.inputs_hash}", run.out_schema)
    saved = run.store.chunks(item)
    next_offset = skip_until = 0
    fragment_errors: list[RowError] = []
    pending: list[pa.RecordBatch] = []
    pending_errors: list[RowError] = []
    pending_start, last_checkpoint = 0, time.monotonic()
    new = item.reason == "new"
    scanner = fragment.scanner(columns=run.new_scan if new else run.stale_scan, batch_size=run.function.batch_size,
                               with_row_address=True, strict_batch_size=True)
    for batch in scanner.to_batches():
        if batch.num_rows == 0:
            continue
        addresses = batch.column(ADDRESS).to_numpy()
        offsets = (addresses & 0xFFFFFFFF).astype(np.int64)
        start, end = next_offset, int(offsets[-1]) + 1
        if end <= skip_until:  # inside a chunk restored from a checkpoint
            next_offset = end
            run.advance(batch.num_rows, 0, [])
            continue
        if start in saved:
            skip_until, path = saved[start]
            batches, saved_errors = run.store.load_chunk(path)
            for restored in batches:
                writer.write(restored)
            errors = [RowError(**e) for e in saved_errors]
            fragment_errors.extend(errors)
            next_offset = pending_start = skip_until
            run.advance(batch.num_rows, 0, errors)
            continue
        out, errors, computed = _outputs(run, batch, addresses, new)
        aligned = align_to_physical(out, offsets, start, run.out_schema)
        writer.write(aligned)
        next_offset = end
        fragment_errors.extend(errors)
        pending.append(aligned)
        pending_errors.extend(errors)
        run.advance(batch.num_rows, computed, errors)
        if time.monotonic() - last_checkpoint >= run.function.checkpoint_seconds:
            run.store.save_chunk(item, pending_start, end, pending, [e.__dict__ for e in pending_errors])
            pending, pending_errors, pending_start, last_checkpoint = [], [], end, time.monotonic()
    writer.pad_to(item.physical_rows)
    writer.close()
    run.store.save_fragment(item, {"file": writer.name, "major": writer.major, "minor": writer.minor,
                                   "errors": [e.__dict__ for e in fragment_errors]})
    run.store.discard_batches(item)
    return lance.LanceOperation.DataReplacementGroup(item.fragment_id, writer.data_file(run.out_ids))


def refresh_column(
    table_uri: str,
    function: Function,
    *,
    report: Callable[[Progress], None] | None = None,
    report_every: float = 5.0,
    concurrency: int | None = None,
) -> RefreshResult:
    """Bring the Function's column up to date; returns what was done. Safe to kill and re-run."""
    started = time.monotonic()
    dataset = ensure_columns(table_uri, function)
    version_before = dataset.version
    store = CheckpointStore(dataset.uri, function.sig_column, function.version)
    progress = Progress()
    visited = 0
    workers = concurrency or min(4, os.cpu_count() or 1)
    run = None
    try:
        for _attempt in range(_COMMIT_ATTEMPTS):
            work = plan_fragments(dataset, function)
            visited += len(work)
            progress.rows_to_scan = progress.rows_scanned + sum(w.live_rows for w in work)
            previous_call = run.call if run else None
            run = _Run(dataset, function, store, report, report_every, progress)
            run.call = previous_call
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gpufn-refresh") as pool:
                groups = list(pool.map(functools.partial(_refresh_fragment, run), work))
            if not groups:
                version_after = dataset.version
                break
            try:
                committed = lance.LanceDataset.commit(
                    dataset.uri, lance.LanceOperation.DataReplacement(groups), read_version=dataset.version,
                    commit_message=f"gpufn refresh {function.name} version {function.version}")
                version_after = committed.version
                break
            except OSError:
                # An incompatible concurrent commit (compaction of a fragment we rewrote, or another
                # refresh of this column). Re-plan on the latest version; finished fragments whose
                # state did not change are reused from their checkpoints.
                dataset = lance.dataset(table_uri)
        else:
            raise RuntimeError(f"refresh of {function.name!r} lost {_COMMIT_ATTEMPTS} commit races in a row")
    finally:
        if run is not None:
            run.close()
    store.clear()
    if report:
        report(progress)
    return RefreshResult(
        function_version=function.version, version_before=version_before, version_after=version_after,
        rows_computed=progress.rows_computed, rows_failed=progress.rows_failed, rows_checked=progress.rows_scanned,
        fragments_visited=visited, fragments_total=len(dataset.get_fragments()),
        wall_seconds=time.monotonic() - started, errors=run.errors if run else [],
    )
