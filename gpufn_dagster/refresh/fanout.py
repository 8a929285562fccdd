"""One refresh spread over several GPU workers: plan once, compute shards anywhere, commit once.

The three steps run in different processes (or pods) and share nothing but the table's storage:

1. `plan_refresh` takes the column's lease under the run's token, adds the columns, plans the
   stale fragments from metadata and splits them into shards balanced by rows (`shards`). The
   version it planned at is the one every shard reads.
2. `compute_shard` computes one shard at that version with the same pipeline as a one-worker
   refresh (`fragments`): whole fragments become finished fragment files, parts of fragments
   become checkpoint chunks. A shard killed midway is retried and resumes from its own
   checkpoints; the other shards' work is never redone.
3. The commit is `refresh_column(assemble_only=True)`: it plans again on the latest version,
   joins every fragment's files and chunks, and commits one `DataReplacement` over all of them,
   so readers never see a mix of Function versions. A fragment changed since the plan is left
   for the next refresh, as rows appended meanwhile are.

No scheduler of our own: the steps are Dagster steps of one run (`fanout_asset`), placed like
any GPU step -- a pod on the class's node pool with `k8s_job_executor`, a local slot embedded.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..functions import Function
from .batches import BatchSizer
from .checkpoint import CheckpointStore
from .columns import ensure_columns
from .execute import BatchFit
from .files import TableFiles
from .fragments import PREFETCH, Attempt, Outcome, compute_fragments, refresh_fragment, refresh_range
from .gpu_stats import GpuSampler, visible_gpus
from .lease import ColumnLease
from .leftovers import WrittenFiles
from .plan import FragmentWork, plan_fragments
from .progress import Progress, Ticker
from .shards import Piece, Shard, split_work, why_fewer_shards, workers_within_budget
from .signature import check_input_types
from .state import load_state
from .upstream import check_upstream

# A refresh spread over steps holds its lease between them too, while a shard's pod may wait for a
# GPU node: renewed while a step runs, it lapses this long after the last step of a killed run.
FANOUT_LEASE_SECONDS = 900.0


@dataclass(frozen=True)
class RefreshPlan:
    """What the plan step decided: the version every shard reads, and the shards."""

    read_version: int
    shards: tuple[Shard, ...]
    workers_asked: int
    workers: int  # after the GPU budgets
    gpu_budget: int | None  # the most GPUs the refresh may hold at once (None: no budget)
    gpus: int  # the GPUs its shards hold at once at most
    rows: int  # estimated rows to compute (live rows of visited fragments)
    fragments: int  # fragments visited
    plan_seconds: float
    fewer_because: str = ""  # why fewer shards than asked ('' when as many)
    started_at: float = 0.0  # when planning began (epoch seconds: shards and commit run in other processes)

    def summary(self) -> dict[str, Any]:
        """The plan as the run's metadata shows it."""
        return {"workers_asked": self.workers_asked, "workers": len(self.shards),
                "fewer_workers_because": self.fewer_because or "-", "gpu_budget": self.gpu_budget,
                "gpus_held_at_most": self.gpus, "rows_planned": self.rows, "plan_seconds": round(self.plan_seconds, 3),
                "fragments_planned": self.fragments, "read_version": self.read_version}


@dataclass
class ShardResult:
    """What one shard's worker did, for the run's metadata."""

    index: int
    rows_planned: int
    rows_computed: int
    rows_failed: int
    rows_checked: int
    pieces: int
    wall_seconds: float
    compute_seconds: float
    busy_seconds: float
    load_seconds: float
    gpu: dict[str, float] = field(default_factory=dict)
    first_values_at: float | None = None  # when its first computed values came back (epoch seconds)
    devices: tuple[str, ...] = ()  # the GPUs its worker saw (none: it computed on a CPU)

    @property
    def rows_per_second(self) -> float:
        return self.rows_computed / self.compute_seconds if self.compute_seconds > 0 else 0.0


def _lease(files: TableFiles, function: Function, token: str, holder: str | None,
           on_wait: Callable[[str], None] | None, ttl: float) -> ColumnLease:
    return ColumnLease(files, function.sig_column, holder or f"pid {os.getpid()} on {socket.gethostname()}",
                       ttl=ttl, on_wait=on_wait, token=token, keep=True)


def plan_refresh(
    table_uri: str,
    function: Function,
    *,
    workers: int,
    lease_token: str,
    gpu_budget: int | None = None,
    storage_options: dict[str, str] | None = None,
    upstream: Sequence[Function] = (),
    holder: str | None = None,
    on_wait: Callable[[str], None] | None = None,
    lease_seconds: float = FANOUT_LEASE_SECONDS,
) -> RefreshPlan:
    """Plan a refresh over up to `workers` workers, from fragment metadata alone.

    Args:
        table_uri: the Lance dataset, a local path or an object store's URI.
        function: the Function spec.
        workers: the workers asked for; fewer when the GPU budgets or the rows to compute are smaller.
        lease_token: the refresh's owner across its steps (the run id); the lease stays held for them.
        gpu_budget: the class's cap on GPUs one refresh holds at once (the Function's own is `max_gpus`).
        storage_options, upstream, holder, on_wait, lease_seconds: as for `refresh_column`.

    Example:
        >>> import lance, pyarrow as pa, tempfile
        >>> from gpufn_dagster.functions import make_function
        >>> uri = tempfile.mkdtemp() + "/t.lance"
        >>> _ = lance.write_dataset(pa.table({"x": list(range(10_000))}), uri)
        >>> def double(x: int) -> int:
        ...     return 2 * x
        >>> plan = plan_refresh(uri, make_function(double, table="t", column="y"), workers=4, lease_token="run-1")
        >>> [shard.rows for shard in plan.shards]
        [2500, 2500, 2500, 2500]
    """
    started, started_at = time.monotonic(), time.time()
    files = TableFiles(table_uri, storage_options)
    dataset = files.dataset()
    check_input_types(function, dataset.schema)
    check_upstream(files, dataset, function, upstream)
    with _lease(files, function, lease_token, holder, on_wait, lease_seconds):
        dataset = ensure_columns(files, function)
        work = plan_fragments(dataset, function, load_state(files, function.sig_column))
        budgets = (function.max_gpus, gpu_budget)
        allowed = workers_within_budget(workers, function.gpu_count, *budgets)
        shards = tuple(split_work(work, allowed))
    budget = min((b for b in budgets if b is not None), default=None)
    rows = sum(w.live_rows for w in work)
    return RefreshPlan(read_version=dataset.version, shards=shards, workers_asked=workers, workers=allowed,
                       gpu_budget=budget, gpus=len(shards) * function.gpu_count, rows=rows, fragments=len(work),
                       plan_seconds=time.monotonic() - started, started_at=started_at,
                       fewer_because=why_fewer_shards(workers, allowed, len(shards), rows, budget, function.gpu_count))


def compute_shard(
    table_uri: str,
    function: Function,
    shard: Shard,
    read_version: int,
    *,
    lease_token: str,
    storage_options: dict[str, str] | None = None,
    report: Callable[[Progress], None] | None = None,
    report_every: float = 5.0,
    concurrency: int | None = None,
    holder: str | None = None,
    on_wait: Callable[[str], None] | None = None,
    lease_seconds: float = FANOUT_LEASE_SECONDS,
    prefetch: int = PREFETCH,
) -> ShardResult:
    """Compute one shard of a planned refresh at the planned version; commits nothing.

    Args:
        table_uri: the Lance dataset, as planned.
        function: the Function spec.
        shard: the shard to compute (`RefreshPlan.shards`).
        read_version: the version the plan read (`RefreshPlan.read_version`).
        lease_token: the refresh's owner (the run id the plan was made under).
        storage_options, report, report_every, concurrency, holder, on_wait, lease_seconds,
        prefetch: as for `refresh_column`.
    """
    started = time.monotonic()
    files = TableFiles(table_uri, storage_options)
    dataset = files.dataset(read_version)
    workers = concurrency or min(4, os.cpu_count() or 1)
    progress = Progress()
    attempt: Attempt | None = None
    with GpuSampler() as gpu, _lease(files, function, lease_token, holder, on_wait, lease_seconds):
        planned = {w.fragment_id: w for w in plan_fragments(dataset, function, load_state(files, function.sig_column))}
        tasks = [(planned[p.fragment_id], p) for p in shard.pieces if p.fragment_id in planned]
        progress.restart(sum(p.rows for _, p in tasks))
        attempt = Attempt(files, dataset, function, CheckpointStore(files, function.sig_column, function.version),
                          WrittenFiles(files, function.sig_column), report, progress, None, BatchFit(),
                          BatchSizer(function.batch_size, function.max_batch_size, adapt=function.adapt_batch_size),
                          prefetch)
        try:
            with Ticker(report, progress, report_every):
                outcomes = compute_fragments(attempt, tasks, workers, step=_compute_piece)
        finally:
            if attempt.call is not None and hasattr(attempt.call, "close"):
                attempt.call.close()
    total = Outcome()
    for outcome in outcomes:
        total.add(outcome)
    if report:
        report(progress)
    first = progress.first_values_at
    return ShardResult(index=shard.index, rows_planned=shard.rows, rows_computed=total.computed,
                       rows_failed=len(total.errors), rows_checked=progress.rows_scanned, pieces=len(tasks),
                       wall_seconds=time.monotonic() - started, compute_seconds=progress.computing_seconds(),
                       busy_seconds=progress.busy_seconds, load_seconds=progress.load_seconds, gpu=gpu.figures(),
                       first_values_at=None if first is None else time.time() - (time.monotonic() - first),
                       devices=visible_gpus(gpu.devices))


def _compute_piece(attempt: Attempt, task: tuple[FragmentWork, Piece]) -> Outcome:
    """A whole fragment becomes its finished file; part of one, checkpoint chunks for the commit."""
    item, piece = task
    if piece.start == 0 and piece.end >= item.physical_rows:
        return refresh_fragment(attempt, item).outcome
    return refresh_range(attempt, item, piece)
