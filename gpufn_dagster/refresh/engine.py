"""Refreshing a Function column: plan, compute per fragment, write, commit once.

The column's values for a fragment are written as one new Lance data file aligned to the
fragment's physical rows (deleted rows hold NULL; `fragments` computes them), and all fragments
are committed in a single `DataReplacement` at the version the plan read. DataReplacement only
conflicts with a writer that touches the same fragment *and* field (or compacts it), so rows
appended, updated or deleted meanwhile are kept; appended rows are filled by the next refresh.
One commit means readers never see a column half from one Function version and half from another.

A fragment in which no row changes is not rewritten (a rewrite would drop its rows from the
vector index). Rows that fail under on_error="skip" are stored with the signature `FAILED`, so
the next refresh retries them. Refreshes of one column are serialized by a lease (`lease`), and
a Function reading another Function's column refuses to start while that column is not current.

A refresh spread over several workers (`fanout`) ends here too: its commit step runs this with
`assemble_only`, joining the shards' checkpoints into fragment files without calling the Function.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import lance
from lance.commit import CommitConflictError

from ..errors import CommitRacesLost, CommitRefused
from ..functions import Function
from .batches import BatchSizer
from .checkpoint import CheckpointStore
from .columns import ensure_columns
from .execute import BatchFit, RowError
from .files import TableFiles
from .fragments import PREFETCH, Attempt, FragmentResult, Outcome, compute_fragments
from .gpu_stats import GpuSampler, visible_gpus
from .lease import DEFAULT_TTL, ColumnLease
from .leftovers import WrittenFiles
from .plan import content_keys, plan_fragments
from .progress import Progress, Ticker
from .signature import check_input_types
from .state import ColumnState, load_state, save_state
from .upstream import check_upstream

_COMMIT_ATTEMPTS = 5


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
    compute_seconds: float = 0.0  # computing rows, over every attempt, the load and the commit left out
    busy_seconds: float = 0.0  # of those, the time spent inside the Function
    first_values_seconds: float | None = None  # from the start to the first computed values (None: none computed)
    oom_splits: int = 0  # batches retried in halves after running out of device memory
    batch_rows_that_fit: int | None = None  # the most rows a call took after a split (None: no split)
    batch_rows_largest: int = 0  # the most rows one batch was sized to (the probe, then adapted)
    gpu: dict[str, float] = field(default_factory=dict)  # NVIDIA's figures over the refresh, when available
    versions_published: int = 0  # intermediate commits (publish_every_rows) before the final one
    fragments_left: int = 0  # assembling shards: fragments that changed meanwhile, left for the next refresh
    devices: tuple[str, ...] = ()  # the GPUs the worker saw (none: it computed on a CPU)

    @property
    def busy_fraction(self) -> float:
        """Time inside the Function ÷ time computing: how busy the worker kept the model (1.0 = never idle)."""
        return self.busy_seconds / self.compute_seconds if self.compute_seconds > 0 else 0.0

    @property
    def rows_per_second(self) -> float:
        """Rows computed per second of computing (not of waiting for a lease or loading a model)."""
        return self.rows_computed / self.compute_seconds if self.compute_seconds > 0 else 0.0


def _state_after(state: ColumnState, results: list[FragmentResult]) -> ColumnState:
    """The column state with this attempt's findings added (not yet pruned)."""
    return ColumnState(
        verified=state.verified | {r.work.content_key for r in results
                                   if r.group is None and not r.outcome.errors and not r.incomplete},
        failed_files=state.failed_files | {r.file for r in results if r.file and r.outcome.errors})


class _Publisher:
    """`publish_every_rows`: commits finished fragments as the refresh goes, so a days-long backfill
    shows results before it ends. Each commit is a DataReplacement at the version the plan read,
    like the final one; it holds only whole fragments of one Function version, so a reader of any
    version sees each fragment's values all from one version. A commit that loses a race leaves its
    fragments to the final commit."""

    def __init__(self, files: TableFiles, dataset: lance.LanceDataset, function: Function, state: ColumnState,
                 lease: ColumnLease):
        self.files, self.dataset, self.function, self.state, self.lease = files, dataset, function, state, lease
        self.every = function.publish_every_rows
        self.pending: list[FragmentResult] = []
        self.published: set[int] = set()  # fragment ids committed already
        self.latest: lance.LanceDataset | None = None
        self.commits = 0

    def add(self, result: FragmentResult) -> None:
        if self.every is None or result.group is None:
            return
        self.pending.append(result)
        if sum(r.work.live_rows for r in self.pending) >= self.every:
            self.state = _state_after(self.state, self.pending)
            save_state(self.files, self.function.sig_column, self.state)
            self.lease.check()
            committed = _commit(self.files, self.dataset, self.function, [r.group for r in self.pending])
            if committed is not None:
                self.published |= {r.work.fragment_id for r in self.pending}
                self.latest, self.commits = committed, self.commits + 1
            self.pending = []


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
    assemble_only: bool = False,
    lease_token: str | None = None,
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
        assemble_only: join the checkpoints shards of this refresh computed (`fanout`) into
            fragment files and commit them, never calling the Function; a fragment they do not
            cover (it changed since the plan) is left for the next refresh.
        lease_token: the lease's owner across processes (a run id): a refresh spread over
            several steps holds one lease from its plan to its commit.

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
    visited = rewritten = published = 0
    workers = concurrency or min(4, os.cpu_count() or 1)
    call: Any = None
    fit = BatchFit()
    sizer = BatchSizer(function.batch_size, function.max_batch_size, adapt=function.adapt_batch_size)
    lease = ColumnLease(files, function.sig_column, holder or f"pid {os.getpid()} on {socket.gethostname()}",
                        ttl=lease_seconds, on_wait=on_wait, token=lease_token)
    with GpuSampler() as gpu, lease:
        progress = Progress()  # its clock starts once the lease is held: waiting for it is not computing
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
                attempt = Attempt(files, dataset, function, store, written, report, progress, call, fit, sizer, prefetch,
                                  assemble_only=assemble_only)
                publisher = _Publisher(files, dataset, function, state, lease)
                with Ticker(report, progress, report_every):
                    results = compute_fragments(attempt, work, workers, on_done=publisher.add)
                published += publisher.commits
                rewritten += len(publisher.published)
                call = attempt.call
                computed_until = time.monotonic()  # its commit is not computing
                total = Outcome()  # the last attempt's results cover every fragment (earlier ones are reused)
                for result in results:
                    total.add(result.outcome)
                state = _state_after(state, results)
                groups = [r.group for r in results
                          if r.group is not None and r.work.fragment_id not in publisher.published]
                if not groups:
                    dataset = publisher.latest or dataset
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
        leftover_files_removed=files_removed, load_seconds=progress.load_seconds,
        compute_seconds=progress.computing_seconds(computed_until), busy_seconds=progress.busy_seconds,
        oom_splits=fit.splits, batch_rows_that_fit=fit.rows, gpu=gpu.figures(), devices=visible_gpus(gpu.devices),
        batch_rows_largest=sizer.largest,
        first_values_seconds=None if progress.first_values_at is None else progress.first_values_at - started,
        fragments_left=sum(r.incomplete for r in results), versions_published=published,
    )
