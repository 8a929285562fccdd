"""Refreshing a Function column: the engine's doorway, one object with a verb per step.

`ColumnRefresh(files, function, options)` is the refresh of one Function's column of one table.
Its verbs:

- `refresh()`: plan, compute per fragment, write, commit once -- the whole refresh on one worker.
- `plan(workers)`, `compute_shard(shard, read_version)`, `commit_shards()`: the same refresh
  spread over several GPU workers, as three steps in different processes (or pods) that share
  nothing but the table's storage. The plan takes the column's lease under the run's token, adds
  the columns, plans the stale fragments from metadata and splits them into shards balanced by
  rows (`shards`); the version it read is the one every shard reads. A shard computes its rows
  with the same pipeline as `refresh` (`fragments`): whole fragments become finished fragment
  files, parts of fragments checkpoint chunks; a shard killed midway is retried and resumes from
  its own checkpoints, and the other shards' work is never redone. The commit plans again on
  the latest version and joins every fragment's files and chunks without calling the Function.

The column's values for a fragment are written as one new Lance data file aligned to the
fragment's physical rows (deleted rows hold NULL; `fragments` computes them), and all fragments
are committed in a single `DataReplacement` at the version the plan read (`commit`).
DataReplacement only conflicts with a writer that touches the same fragment *and* field (or
compacts it), so rows appended, updated or deleted meanwhile are kept; appended rows are filled
by the next refresh, and a fragment changed since a fanned-out plan is left for it too. One
commit means readers never see a column half from one Function version and half from another.

A fragment in which no row changes is not rewritten (a rewrite would drop its rows from the
vector index). Rows that fail under on_error="skip" are stored with the signature `FAILED`, so
the next refresh retries them. Refreshes of one column are serialized by a lease (`lease`); a
fanned-out refresh holds one lease from its plan to its commit. A Function reading another
Function's column refuses to start while that column is not current.

No scheduler of our own: the steps of a fanned-out refresh are Dagster steps of one run
(`fanout_asset`), placed like any GPU step.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import lance
import numpy as np

from ..errors import CommitRacesLost
from ..function_spec.functions import Function
from .columns import ensure_columns
from .checkpoint import CheckpointStore
from .commit import Publisher, commit_groups, state_after
from .compaction import compact_function_files
from .files import TableFiles
from .fragments import PREFETCH, Attempt, FragmentResult, Outcome, assemble_fragment, compute_fragments, \
    refresh_fragment, refresh_range
from .gpu_stats import GpuSampler, visible_gpus
from .leftovers import WrittenFiles
from .lease import DEFAULT_TTL, ColumnLease
from .plan import FragmentWork, content_keys, plan_fragments
from .progress import Progress, Ticker
from .results import RefreshPlan, RefreshResult, ShardResult
from .shards import Piece, Shard, split_work, why_fewer_shards, workers_within_budget
from .signature import check_input_types
from .slices import COMMIT_LOCK, rebase_groups, scope
from .state import ColumnState, load_state, settle_state
from .upstream import check_upstream
from .worker import FunctionInstance, InstanceSource, Worker

_log = logging.getLogger(__name__)
_COMMIT_ATTEMPTS = 5
# A refresh spread over steps holds its lease between them too, while a shard's pod may wait for a
# GPU node: renewed while a step runs, it lapses this long after the last step of a killed run.
FANOUT_LEASE_SECONDS = 900.0


@dataclass(frozen=True)
class RefreshOptions:
    """How a refresh runs and reports; every field has a default.

    Attributes:
        report: called with the progress every `report_every` seconds and at the end.
        concurrency: fragments processed at once (default: up to 4, by CPU count).
        upstream: Functions whose output columns this one reads; the refresh refuses to start
            while one of them is not current (`UpstreamNotCurrent`).
        holder: who refreshes (a run id), shown to a refresh of the same column that waits.
        on_wait: called with a line while this refresh waits for another one of the same column.
        lease_seconds: how long a killed refresh blocks the next one of the same column (default
            60 s for one step, `FANOUT_LEASE_SECONDS` for the lease a plan leaves to its shards).
        prefetch: batches each fragment thread reads and hashes ahead of the one the model works
            on; 0 calls the Function from the fragment threads in turn, reading nothing ahead.
        lease_token: the lease's owner across processes (a run id): a refresh spread over
            several steps holds one lease from its plan to its commit. Its verbs need one.
        instances: where the Function's loaded instance comes from (default: loaded by this
            refresh and closed when it ends; `embedded.warm.warm_instances` keeps it warm for the next).
        where: a Lance filter: refresh only the rows it selects (a partition's slice, `slices`);
            other rows are neither computed nor passed to the Function, and slices of one column
            refresh side by side.
        keep_rows: keep the addresses of the rows given a value (`RefreshResult.computed_rows`), for
            a caller that reports them per part of `where` (a single-run backfill's partitions).
        lease_holder_ended: given another refresh's `lease_token`, whether it has ended for good (its
            run and every re-execution of it are over): a fanned-out run killed between steps
            leaves its lease for `FANOUT_LEASE_SECONDS`, and this refresh takes it over at once
            instead, adopting the parts it checkpointed (`assets.run_family`).
        max_function_files: after its commit, a fragment holding more Function files than this
            (one per Function on the table) gets them made one file (`compaction`), when no refresh
            of the table is in flight. None (the default) never compacts: measured in fresh reader
            processes, a compacted table's values read slower, not faster (BENCHMARKS.md).

    >>> RefreshOptions(concurrency=2, upstream=[]).upstream
    ()
    """

    report: Callable[[Progress], None] | None = None
    report_every: float = 5.0
    concurrency: int | None = None
    upstream: Sequence[Function] = ()
    holder: str | None = None
    on_wait: Callable[[str], None] | None = None
    lease_seconds: float | None = None
    prefetch: int = PREFETCH
    lease_token: str | None = None
    instances: InstanceSource = FunctionInstance
    where: str | None = None
    keep_rows: bool = False
    lease_holder_ended: Callable[[str], bool] | None = None
    max_function_files: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "upstream", tuple(self.upstream))

    @property
    def workers(self) -> int:
        """Fragment threads of one worker."""
        return self.concurrency or min(4, os.cpu_count() or 1)


class ColumnRefresh:
    """The refresh of one Function's column of one table; see the module's docstring for its verbs.

    Args:
        files: the table and the engine's files beside it (`LanceDBResource.table_files`, or
            `TableFiles(uri, storage_options)` for a local path or an object store's URI).
        function: the Function spec (`make_function`).
        options: how it runs and reports (`RefreshOptions`).

    Example:
        >>> import lance, pyarrow as pa, tempfile
        >>> from gpufn_dagster.function_spec.functions import make_function
        >>> uri = tempfile.mkdtemp() + "/t.lance"
        >>> _ = lance.write_dataset(pa.table({"x": list(range(10_000))}), uri)
        >>> def double(x: int) -> int:
        ...     return 2 * x
        >>> column = ColumnRefresh(TableFiles(uri), make_function(double, table="t", column="y"),
        ...                        RefreshOptions(lease_token="run-1"))
        >>> plan = column.plan(workers=4)
        >>> [shard.rows for shard in plan.shards]
        [2500, 2500, 2500, 2500]
        >>> [column.compute_shard(s, plan.read_version).rows_computed for s in plan.shards]
        [2500, 2500, 2500, 2500]
        >>> column.commit_shards().fragments_rewritten, column.refresh().rows_computed
        (1, 0)
    """

    def __init__(self, files: TableFiles, function: Function, options: RefreshOptions | None = None):
        self.files, self.function, self.options = files, function, options or RefreshOptions()

    # --- the verbs --------------------------------------------------------------------------

    def refresh(self) -> RefreshResult:
        """Bring the column up to date on this worker; returns what was done. Safe to kill and re-run."""
        return self._commit_refreshed(refresh_fragment)

    def plan(self, workers: int, *, gpu_budget: int | None = None) -> RefreshPlan:
        """Plan a refresh over up to `workers` workers, from fragment metadata alone; the lease stays
        held for the shards and the commit.

        Args:
            workers: the workers asked for; fewer when the GPU budgets or the rows to compute are smaller.
            gpu_budget: the class's cap on GPUs one refresh holds at once (the Function's own is `max_gpus`).
        """
        self._token()
        started, started_at = time.monotonic(), time.time()
        self._checked()
        with self._lease(keep=True):
            dataset = ensure_columns(self.files, self.function)
            work = self._plan(dataset, load_state(self.files, self.function.sig_column))
            budgets = (self.function.options.max_gpus, gpu_budget)
            allowed = workers_within_budget(workers, self.function.gpu_count, *budgets)
            shards = tuple(split_work(work, allowed))
        budget = min((b for b in budgets if b is not None), default=None)
        rows = sum(w.live_rows for w in work)
        return RefreshPlan(read_version=dataset.version, shards=shards, workers_asked=workers, workers=allowed,
                           gpu_budget=budget, gpus=len(shards) * self.function.gpu_count, rows=rows,
                           fragments=len(work), plan_seconds=time.monotonic() - started, started_at=started_at,
                           fewer_because=why_fewer_shards(workers, allowed, len(shards), rows, budget,
                                                          self.function.gpu_count))

    def compute_shard(self, shard: Shard, read_version: int) -> ShardResult:
        """Compute one shard of a planned refresh at the planned version (`RefreshPlan.read_version`);
        commits nothing."""
        self._token()
        started = time.monotonic()
        dataset = self.files.dataset(read_version)
        progress = Progress()
        with GpuSampler() as gpu, self._lease(keep=True), self._worker() as worker:
            planned = {w.fragment_id: w for w in self._plan(dataset, load_state(self.files, self.function.sig_column))}
            tasks = [(planned[p.fragment_id], p) for p in shard.pieces if p.fragment_id in planned]
            progress.restart(sum(p.rows for _, p in tasks))
            with Ticker(self.options.report, progress, self.options.report_every):
                outcomes = compute_fragments(Attempt(worker, dataset, progress), tasks, self.options.workers,
                                             step=_compute_piece)
            progress.stop()
        total = Outcome()
        for outcome in outcomes:
            total.add(outcome)
        self._report(progress)
        first = progress.first_values_at
        return ShardResult(index=shard.index, rows_planned=shard.rows, rows_computed=total.computed,
                           rows_adopted=total.adopted, computed_rows=_joined(worker.computed_rows),
                           parts_adopted=progress.parts_adopted, parts_damaged=progress.parts_damaged,
                           rows_failed=len(total.errors), rows_checked=progress.rows_scanned, pieces=len(tasks),
                           wall_seconds=time.monotonic() - started, compute_seconds=progress.computing_seconds(),
                           busy_seconds=progress.busy_seconds, load_seconds=progress.load_seconds, gpu=gpu.figures(),
                           first_values_at=None if first is None else time.time() - (time.monotonic() - first),
                           first_call_seconds=progress.first_call_seconds, devices=visible_gpus(gpu.devices))

    def commit_shards(self) -> RefreshResult:
        """Join the checkpoints the shards computed into fragment files and commit them once, never
        calling the Function; releases the lease. A fragment the shards do not cover (it changed
        since the plan) is left for the next refresh (`RefreshResult.fragments_left`)."""
        self._token()
        return self._commit_refreshed(assemble_fragment)

    # --- what the verbs share ---------------------------------------------------------------

    def rows_checkpointed(self) -> int:
        """The rows of this column (of this refresh's slice) its checkpoints hold now: what a terminated
        refresh leaves for the next one, which resumes from them."""
        return CheckpointStore(self.files, scope(self.function.sig_column, self.options.where),
                               self.function.version).rows_saved()

    def _token(self) -> str:
        if not self.options.lease_token:
            raise ValueError(f"Function {self.function.name!r}: the steps of a fanned-out refresh share one lease; "
                             "give RefreshOptions(lease_token=<the run id>)")
        return self.options.lease_token

    def _checked(self) -> None:
        """Refuse to start on inputs of the wrong type or an upstream column that is not current."""
        dataset = self.files.dataset()
        check_input_types(self.function, dataset.schema)
        check_upstream(self.files, dataset, self.function, self.options.upstream, self.options.where)

    def _plan(self, dataset: lance.LanceDataset, state: ColumnState) -> list[FragmentWork]:
        return plan_fragments(dataset, self.function, state, where=self.options.where)

    def _lease(self, *, keep: bool) -> ColumnLease:
        """The column's (or the slice's) lease; `keep` leaves it to the next step of the same
        fanned-out refresh."""
        ttl = self.options.lease_seconds
        return ColumnLease(self.files, scope(self.function.sig_column, self.options.where),
                           self.options.holder or f"pid {os.getpid()} on {socket.gethostname()}",
                           ttl=ttl if ttl is not None else FANOUT_LEASE_SECONDS if keep else DEFAULT_TTL,
                           on_wait=self.options.on_wait, token=self.options.lease_token, keep=keep,
                           ended=self.options.lease_holder_ended)

    @contextmanager
    def _worker(self) -> Iterator[Worker]:
        """What every attempt of one verb shares; the Function's instance is closed at the end."""
        worker = Worker.of(self.files, self.function, self.options.prefetch, self.options.report, self.options.instances,
                           scope=scope(self.function.sig_column, self.options.where), keep_rows=self.options.keep_rows)
        try:
            yield worker
        finally:
            worker.instance.close()

    def _commit_lock(self) -> ColumnLease | nullcontext[None]:
        """Slices of one column commit one at a time (a rebase is never overtaken); a whole-column
        refresh holds the column's lease already."""
        if self.options.where is None:
            return nullcontext()
        return ColumnLease(self.files, scope(self.function.sig_column, None, COMMIT_LOCK),
                           self.options.holder or f"pid {os.getpid()} on {socket.gethostname()}", ttl=DEFAULT_TTL,
                           on_wait=None, poll=0.05)

    def _commit(self, dataset: lance.LanceDataset, results: list[FragmentResult],
                written: WrittenFiles) -> lance.LanceDataset | None:
        """One DataReplacement of the rewritten fragments; a slice that lost the race to another
        slice of the same fragments rebases its files onto the latest version (`slices`) and commits
        again, never recomputing. None: plan again (a fragment was compacted away, or races kept
        being lost)."""
        groups = [r.group for r in results]
        committed = commit_groups(self.files, dataset, self.function, groups)
        if committed is not None or self.options.where is None:
            return committed
        names = [*self.function.columns, self.function.sig_column]
        for _attempt in range(_COMMIT_ATTEMPTS):
            latest = self.files.dataset()
            rebased = rebase_groups(self.files, latest, names,
                                    [(g, r.work.rows) for g, r in zip(groups, results, strict=True)], written.note)
            if rebased is None:
                return None
            committed = commit_groups(self.files, latest, self.function, rebased)
            if committed is not None:
                return committed
            groups = rebased
        return None

    def _report(self, progress: Progress) -> None:
        if self.options.report:
            self.options.report(progress)

    def _commit_refreshed(self, step: Callable[[Attempt, FragmentWork], FragmentResult]) -> RefreshResult:
        """Plan, `step` every stale fragment, commit once; re-plan after a lost commit race."""
        started = time.monotonic()
        function, files = self.function, self.files
        self._checked()
        visited = rewritten = published = 0
        lease = self._lease(keep=False)
        with GpuSampler() as gpu, lease:
            progress = Progress()  # its clock starts once the lease is held: waiting for it is not computing
            with self._worker() as worker:
                dataset = ensure_columns(files, function)
                version_before = dataset.version
                state = load_state(files, function.sig_column)
                for _attempt in range(_COMMIT_ATTEMPTS):
                    work = self._plan(dataset, state)
                    visited = len(work)  # the final attempt covers every fragment; earlier ones are reused
                    progress.restart(sum(w.live_rows for w in work))
                    publisher = Publisher(files, dataset, function, state, lease)
                    with Ticker(self.options.report, progress, self.options.report_every):
                        results = compute_fragments(Attempt(worker, dataset, progress), work, self.options.workers,
                                                    step=step, on_done=publisher.add)
                    published += publisher.commits
                    rewritten += len(publisher.published)
                    computed_until = time.monotonic()  # its commit is not computing
                    progress.stop(computed_until)
                    total = Outcome()  # the last attempt's results cover every fragment (earlier ones are reused)
                    for result in results:
                        total.add(result.outcome)
                    state = state_after(state, results)
                    groups = [r.group for r in results
                              if r.group is not None and r.work.fragment_id not in publisher.published]
                    if not groups:
                        dataset = publisher.latest or dataset
                        break
                    with self._commit_lock():
                        settle_state(files, function.sig_column, state)  # failed files are known before the commit
                        lease.check()
                        committed = self._commit(dataset, [r for r in results if r.group is not None
                                                           and r.work.fragment_id not in publisher.published],
                                                 worker.written)
                    if committed is not None:
                        dataset = committed
                        rewritten += len(groups)
                        break
                    # A concurrent commit touched a fragment we rewrote (compaction, an update). Re-plan on
                    # the latest version; finished fragments whose state did not change are reused from
                    # their checkpoints.
                    dataset = files.dataset()
                else:
                    raise CommitRacesLost(f"refresh of {function.name!r} lost {_COMMIT_ATTEMPTS} commit races in a "
                                          "row to concurrent writers of the same fragments (compaction?); run it again")
            with self._commit_lock():
                settle_state(files, function.sig_column, state, content_keys(dataset, function),
                             lambda: _files_in_use(dataset))
            files_removed = worker.written.settle(dataset)
            worker.store.clear()
        self._report(progress)
        return RefreshResult(
            function_version=function.version, version_before=version_before, version_after=dataset.version,
            rows_computed=total.computed, rows_adopted=total.adopted, computed_rows=_joined(worker.computed_rows),
            parts_adopted=progress.parts_adopted, parts_damaged=progress.parts_damaged,
            rows_failed=len(total.errors), rows_checked=progress.rows_scanned,
            rows_total=dataset.count_rows(), fragments_visited=visited, fragments_rewritten=rewritten,
            fragments_total=len(dataset.get_fragments()), wall_seconds=time.monotonic() - started,
            lease_wait_seconds=lease.waited, errors=tuple(total.errors), recovered=tuple(total.recovered),
            leftover_files_removed=files_removed, load_seconds=progress.load_seconds,
            compute_seconds=progress.computing_seconds(computed_until), busy_seconds=progress.busy_seconds,
            oom_splits=worker.fit.splits, batch_rows_that_fit=worker.fit.rows, gpu=gpu.figures(),
            devices=visible_gpus(gpu.devices), batch_rows_largest=worker.sizer.largest,
            first_values_seconds=None if progress.first_values_at is None else progress.first_values_at - started,
            first_call_seconds=progress.first_call_seconds,
            fragments_left=sum(r.incomplete for r in results), versions_published=published,
            fragments_compacted=self._compact(),
        )

    def _compact(self) -> int:
        """Once this refresh let go of its lease: the Function files of fragments where they piled up
        made one file each (`compaction`); how many fragments."""
        if self.options.max_function_files is None:
            return 0
        try:
            return compact_function_files(self.files, self.options.max_function_files).fragments
        except Exception as error:  # noqa: BLE001 -- the refresh committed: it does not fail for upkeep
            _log.warning("%s: the Function files of %s were left as they are (compacting them failed: %s)",
                         self.function.name, self.files.uri, error)
            return 0


def _joined(parts: list[np.ndarray] | None) -> np.ndarray | None:
    """The addresses a worker kept (`RefreshOptions.keep_rows`), as one array (None: not kept)."""
    if parts is None:
        return None
    return np.concatenate(parts) if parts else np.array([], dtype=np.uint64)


def _files_in_use(dataset: lance.LanceDataset) -> set[str]:
    return {f.path for fragment in dataset.get_fragments() for f in fragment.metadata.files}


def _compute_piece(attempt: Attempt, task: tuple[FragmentWork, Piece]) -> Outcome:
    """A whole fragment becomes its finished file; part of one, checkpoint chunks for the commit."""
    item, piece = task
    if piece.start == 0 and piece.end >= item.physical_rows:
        return refresh_fragment(attempt, item).outcome
    return refresh_range(attempt, item, piece)


def refresh_column(table: str | TableFiles, function: Function, *, storage_options: dict[str, str] | None = None,
                   **options: Any) -> RefreshResult:
    """Bring the Function's column up to date on this worker: `ColumnRefresh(...).refresh()`.

    Args:
        table: the Lance dataset (`<db>/<table>.lance`): a local path or an object store's URI
            (`s3://bucket/db/t.lance`), or its `TableFiles`; checkpoints, state and the lease
            live beside it.
        function: the Function spec (`make_function`).
        storage_options: how to reach an object store (endpoint, region, credentials), as Lance
            takes them, for a URI; none reads the `AWS_*` environment variables.
        options: the fields of `RefreshOptions` (report, concurrency, upstream, holder, ...).

    Example:
        >>> import lance, pyarrow as pa, tempfile
        >>> uri = tempfile.mkdtemp() + "/t.lance"
        >>> _ = lance.write_dataset(pa.table({"x": [1, 2, 3]}), uri)
        >>> def double(x: int) -> int:
        ...     return 2 * x
        >>> from gpufn_dagster.function_spec.functions import make_function
        >>> f = make_function(double, table="t", column="y")
        >>> refresh_column(uri, f).rows_computed, refresh_column(uri, f).rows_computed
        (3, 0)
        >>> lance.dataset(uri).to_table(columns=["y"]).column("y").to_pylist()
        [2, 4, 6]
    """
    files = table if isinstance(table, TableFiles) else TableFiles(table, storage_options)
    return ColumnRefresh(files, function, RefreshOptions(**options)).refresh()
