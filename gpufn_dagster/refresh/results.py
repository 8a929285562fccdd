"""What the engine's verbs return: frozen values, pickled between the steps of a fanned-out refresh
(the plan goes to every shard, the shards' results to the commit) and read by the Dagster layer."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .execute import RowError
from .shards import Shard


@dataclass(frozen=True)
class RefreshResult:
    """What a refresh (or the commit of a fanned-out one) did, as its materialization reports it."""

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
    errors: tuple[RowError, ...]
    recovered: tuple[tuple[int, int | None], ...]  # rows that had failed before and now succeeded: (address, row id)
    leftover_files_removed: int = 0  # data files earlier killed or failed refreshes left behind
    load_seconds: float = 0.0  # constructing the Function's callable (loading its model), all attempts
    compute_seconds: float = 0.0  # computing rows, over every attempt, the load and the commit left out
    busy_seconds: float = 0.0  # of those, the time spent inside the Function
    first_values_seconds: float | None = None  # from the start to the first computed values (None: none computed)
    first_call_seconds: float | None = None  # of those, the Function's call that computed them
    oom_splits: int = 0  # batches retried in halves after running out of device memory
    batch_rows_that_fit: int | None = None  # the most rows a call took after a split (None: no split)
    batch_rows_largest: int = 0  # the most rows one batch was sized to (the probe, then adapted)
    gpu: Mapping[str, float] = field(default_factory=dict)  # NVIDIA's figures over the refresh, when available
    versions_published: int = 0  # intermediate commits (publish_every_rows) before the final one
    fragments_left: int = 0  # assembling shards: fragments that changed meanwhile, left for the next refresh
    devices: tuple[str, ...] = ()  # the GPUs the worker saw (none: it computed on a CPU)
    rows_adopted: int = 0  # rows whose values came from another refresh's checkpoints (a killed run's), not computed
    parts_adopted: int = 0  # the checkpointed parts those rows came in, each checksum-verified before use
    parts_damaged: int = 0  # checkpointed parts that failed their checksum: removed, their rows computed again
    fragments_compacted: int = 0  # fragments whose Function files were made one after the commit (`compaction`)
    computed_rows: Any = None  # addresses of the rows given a value (`RefreshOptions.keep_rows`; else None)

    @property
    def busy_fraction(self) -> float:
        """Time inside the Function ÷ time computing: how busy the worker kept the model (1.0 = never idle)."""
        return self.busy_seconds / self.compute_seconds if self.compute_seconds > 0 else 0.0

    @property
    def rows_per_second(self) -> float:
        """Rows computed per second of computing (not of waiting for a lease or loading a model)."""
        return self.rows_computed / self.compute_seconds if self.compute_seconds > 0 else 0.0


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


@dataclass(frozen=True)
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
    gpu: Mapping[str, float] = field(default_factory=dict)
    first_values_at: float | None = None  # when its first computed values came back (epoch seconds)
    first_call_seconds: float | None = None  # how long the call that computed them took
    devices: tuple[str, ...] = ()  # the GPUs its worker saw (none: it computed on a CPU)
    rows_adopted: int = 0  # rows restored from checkpoints an earlier attempt (a killed one) saved
    parts_adopted: int = 0  # the checkpointed parts those rows came in, each checksum-verified before use
    parts_damaged: int = 0  # checkpointed parts that failed their checksum: removed, their rows computed again
    fragments_compacted: int = 0  # fragments whose Function files were made one after the commit (`compaction`)
    computed_rows: Any = None  # addresses of the rows given a value (`RefreshOptions.keep_rows`; else None)
    run_id: str | None = None  # the run whose step computed it (a re-execution reuses its parent's shards)
    # How long its step held its GPUs (x GPUs): from taking its local slots (on its own pod: from
    # the step's start) until it let them go; None: not measured (the engine alone, outside a step).
    gpu_held_seconds: float | None = None

    @property
    def rows_per_second(self) -> float:
        return self.rows_computed / self.compute_seconds if self.compute_seconds > 0 else 0.0
