"""Refreshing a Function column: plan, compute per fragment, write, commit once.

The column's values for a fragment are written as one new Lance data file aligned to the
fragment's physical rows (deleted rows hold NULL), and all fragments are committed in a single
`DataReplacement` at the version the plan read. DataReplacement only conflicts with a writer that
touches the same fragment *and* field (or compacts it), so rows appended, updated or deleted
meanwhile are kept; appended rows are filled by the next refresh. One commit means readers never
see a column half from one Function version and half from another.
"""

from __future__ import annotations

import time
from pathlib import Path
from collections.abc import Callable
from dataclasses import dataclass, field

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..functions import Function, FunctionDefinitionError
from .arrow_types import datafusion_type
from .checkpoint import CheckpointStore
from .execute import RowError, call_function
from .plan import field_ids, plan_fragments, signature_expression
from .write import FragmentFileWriter, align_to_physical

SIG_NOW = "__gpufn_sig_now"
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


VIEW_DEFINITION_KEY = b"mv.definition"
SIG_COLUMN_KEY = "gpufn.sig_column"


def is_view(schema: pa.Schema) -> bool:
    return VIEW_DEFINITION_KEY in (schema.metadata or {})


def declared_fields(function: Function, on_view: bool) -> list[pa.Field]:
    """The output and signature fields, tagged with the signature column they belong to.

    On a lancedb materialized view every column the view's query does not produce must be a
    lancedb computed column, or the view refuses to refresh; there they are declared as SQL
    computed columns that yield NULL (rows the view adds stay unfilled until this engine fills
    them).
    """
    fields = [*function.output_fields, pa.field(function.sig_column, pa.binary())]
    tagged = []
    for f in fields:
        metadata = {SIG_COLUMN_KEY: function.sig_column, "gpufn.function": function.name}
        if on_view:
            metadata.update({"computed_column": "true", "computed_column.kind": "sql", "computed_column.inputs": "[]",
                             "computed_column.expression": f"arrow_cast(NULL, '{datafusion_type(f.type)}')"})
        tagged.append(f.with_metadata(metadata))
    return tagged


def ensure_columns(table_uri: str, function: Function) -> lance.LanceDataset:
    """Add the output and signature columns (all-NULL, metadata only) if missing; check their types."""
    for attempt in range(_COMMIT_ATTEMPTS):
        dataset = lance.dataset(table_uri)
        schema = dataset.schema
        wanted = declared_fields(function, is_view(schema))
        for name in function.inputs:
            if name not in schema.names:
                raise FunctionDefinitionError(
                    f"Function {function.name!r}: field 'inputs': table {function.table!r} has no column {name!r}; "
                    f"it has {', '.join(n for n in schema.names if not n.startswith('_gpufn'))}")
        for f in wanted:
            if f.name in schema.names and schema.field(f.name).type != f.type:
                raise FunctionDefinitionError(
                    f"Function {function.name!r}: field 'output_type': column {f.name!r} of table "
                    f"{function.table!r} is {schema.field(f.name).type}, the Function returns {f.type}")
        missing = [f for f in wanted if f.name not in schema.names]
        if not missing:
            return dataset
        try:
            dataset.add_columns(missing)
            return lance.dataset(table_uri)
        except OSError:  # a concurrent commit won the race; re-read and retry
            if attempt == _COMMIT_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def _compute_batch(
    call, function: Function, batch: pa.RecordBatch, addresses: np.ndarray
) -> tuple[list[pa.Array], list[RowError], int]:
    """Output columns for a scanned batch: current rows keep their values, stale rows are computed."""
    stored, now = batch.column(function.sig_column), batch.column(SIG_NOW)
    stale = pc.fill_null(pc.or_kleene(pc.is_null(stored), pc.not_equal(stored, now)), True)
    stale_idx = np.flatnonzero(stale.to_numpy(zero_copy_only=False))
    old = [batch.column(name) for name in function.columns]
    if len(stale_idx) == 0:
        return old, [], 0
    inputs = batch.select(list(function.inputs)).take(pa.array(stale_idx))
    values, errors = call_function(call, function, inputs, addresses[stale_idx].tolist())
    new = [values] if len(function.columns) == 1 else [values.field(i) for i in range(len(function.columns))]
    selector = np.arange(batch.num_rows)
    selector[stale_idx] = batch.num_rows + np.arange(len(stale_idx))
    take = pa.array(selector)
    merged = [pa.concat_arrays([o, n.cast(o.type)]).take(take) for o, n in zip(old, new, strict=True)]
    return merged, errors, len(stale_idx)


def _error_records(errors: list[RowError]) -> list[dict]:
    return [{"row_address": e.row_address, "error": e.error, "traceback": e.traceback} for e in errors]


def refresh_column(
    table_uri: str,
    function: Function,
    *,
    report: Callable[[Progress], None] | None = None,
    report_every: float = 5.0,
) -> RefreshResult:
    """Bring the Function's column up to date; returns what was done. Safe to kill and re-run."""
    started = time.monotonic()
    dataset = ensure_columns(table_uri, function)
    version_before = dataset.version
    store = CheckpointStore(dataset.uri, function.sig_column, function.version)
    call = None
    progress = Progress()
    last_report = time.monotonic()
    computed = failed = checked = visited = 0
    errors: list[RowError] = []
    try:
        for _attempt in range(_COMMIT_ATTEMPTS):
            work = plan_fragments(dataset, function)
            progress.rows_to_scan = progress.rows_scanned + sum(w.live_rows for w in work)
            out_schema = pa.schema([*(dataset.schema.field(c) for c in function.columns),
                                    dataset.schema.field(function.sig_column)])
            out_ids = field_ids(dataset, [*function.columns, function.sig_column])
            sig_expr = signature_expression(function, dataset.schema)
            scan_columns = {name: f"`{name}`" for name in dict.fromkeys(
                [*function.inputs, *function.columns, function.sig_column])}
            scan_columns[SIG_NOW] = sig_expr
            groups = []
            for item in work:
                visited += 1
                done = store.load_fragment(item)
                if done is not None and (Path(dataset.uri) / "data" / done["file"]).exists():
                    groups.append(lance.LanceOperation.DataReplacementGroup(item.fragment_id, lance.fragment.DataFile(
                        done["file"], out_ids, list(range(len(out_ids))), done["major"], done["minor"])))
                    progress.rows_scanned += item.live_rows
                    continue
                fragment = dataset.get_fragment(item.fragment_id)
                writer = FragmentFileWriter(dataset, f"gpufn-{function.version}-{item.inputs_hash}", out_schema)
                next_offset = 0
                fragment_computed = fragment_failed = 0
                scanner = fragment.scanner(columns=scan_columns, batch_size=function.batch_size,
                                           with_row_address=True, strict_batch_size=True)
                for batch in scanner.to_batches():
                    if batch.num_rows == 0:
                        continue
                    addresses = batch.column(ADDRESS).to_numpy()
                    offsets = (addresses & 0xFFFFFFFF).astype(np.int64)
                    start, end = next_offset, int(offsets[-1]) + 1
                    saved = store.load_batch(item, start, end)
                    if saved is not None:
                        aligned, batch_errors = saved
                        errors.extend(RowError(**e) for e in batch_errors)
                        failed += len(batch_errors)
                        fragment_failed += len(batch_errors)
                    else:
                        if call is None:
                            call = function.open()
                        columns, batch_errors, n = _compute_batch(call, function, batch, addresses)
                        computed += n
                        fragment_computed += n
                        failed += len(batch_errors)
                        fragment_failed += len(batch_errors)
                        errors.extend(batch_errors)
                        out = pa.RecordBatch.from_arrays([*columns, batch.column(SIG_NOW)], schema=out_schema)
                        writer.pad_to(start)
                        aligned = align_to_physical(out, offsets, start, out_schema)
                        store.save_batch(item, start, end, aligned, _error_records(batch_errors))
                    writer.pad_to(start)
                    writer.write(aligned)
                    next_offset = end
                    checked += batch.num_rows
                    progress.rows_scanned += batch.num_rows
                    progress.rows_computed, progress.rows_failed = computed, failed
                    if report and time.monotonic() - last_report >= report_every:
                        report(progress)
                        last_report = time.monotonic()
                writer.pad_to(item.physical_rows)
                writer.close()
                store.save_fragment(item, {"file": writer.name, "major": writer.major, "minor": writer.minor,
                                           "computed": fragment_computed, "failed": fragment_failed})
                store.discard_batches(item)
                groups.append(lance.LanceOperation.DataReplacementGroup(item.fragment_id, writer.data_file(out_ids)))
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
        if call is not None and hasattr(call, "close"):
            call.close()
    store.clear()
    progress.rows_computed, progress.rows_failed = computed, failed
    if report:
        report(progress)
    return RefreshResult(
        function_version=function.version, version_before=version_before, version_after=version_after,
        rows_computed=computed, rows_failed=failed, rows_checked=checked, fragments_visited=visited,
        fragments_total=len(dataset.get_fragments()), wall_seconds=time.monotonic() - started, errors=errors,
    )
