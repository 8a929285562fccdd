"""Splitting one refresh over several GPU workers: which rows each worker computes (pure).

The plan is made from fragment metadata alone (`plan_fragments`), so its estimate of the rows to
compute is each visited fragment's live rows: exact for fragments the Function never wrote, an
upper bound for stale ones. Shards are balanced on that estimate, in fragment order; a fragment
larger than a shard's share is cut into ranges of physical rows, so a table with fewer large
fragments than workers still keeps every worker busy. A range never starts or ends inside a
read, and never covers fewer than `min_rows` estimated rows unless the fragment itself is that
small, so a shard is never mostly overhead.
"""

from __future__ import annotations

from dataclasses import dataclass

from .plan import FragmentWork


@dataclass(frozen=True)
class Piece:
    """Physical rows [start, end) of one fragment, and how many live rows they hold (estimated)."""

    fragment_id: int
    start: int
    end: int
    rows: int


@dataclass(frozen=True)
class Shard:
    """What one worker computes."""

    index: int
    pieces: tuple[Piece, ...]

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.pieces)

    @property
    def mapping_key(self) -> str:
        """Its name among the run's steps (`<asset>.compute[shard_3]`)."""
        return f"shard_{self.index}"


MIN_SHARD_ROWS = 1024  # a shard computes at least this many (estimated) rows, or it is mostly overhead


def split_work(work: list[FragmentWork], workers: int, min_rows: int = MIN_SHARD_ROWS) -> list[Shard]:
    """At most `workers` shards with about equal rows to compute, covering every visited fragment once.

    >>> from gpufn_dagster.refresh.plan import FragmentWork
    >>> def frag(i, rows): return FragmentWork(i, rows, rows, "h", "k", "new")
    >>> [[(p.fragment_id, p.start, p.end) for p in s.pieces] for s in split_work([frag(0, 10000)], 4)]
    [[(0, 0, 2500)], [(0, 2500, 5000)], [(0, 5000, 7500)], [(0, 7500, 10000)]]
    >>> [s.rows for s in split_work([frag(0, 3000), frag(1, 1000), frag(2, 4000)], 2)]
    [4000, 4000]
    >>> len(split_work([frag(0, 100)], 8)), split_work([], 3)
    (1, [])
    """
    total = sum(w.live_rows for w in work)
    if total == 0 or workers <= 1:
        pieces = tuple(Piece(w.fragment_id, 0, w.physical_rows, w.live_rows) for w in work)
        return [Shard(0, pieces)] if pieces else []
    workers = max(1, min(workers, total // max(min_rows, 1) or 1))
    shards: list[list[Piece]] = [[] for _ in range(workers)]
    filled = [0] * workers
    target = [total * (i + 1) // workers for i in range(workers)]  # cumulative rows after shard i
    done = 0
    index = 0
    for w in work:
        if w.live_rows == 0:  # every row deleted: nothing to compute, but its file is still rewritten
            shards[index].append(Piece(w.fragment_id, 0, w.physical_rows, 0))
            continue
        start, left = 0, w.live_rows
        density = w.live_rows / w.physical_rows if w.physical_rows else 0.0
        while left > 0:
            room = target[index] - done
            if room <= 0 and index < workers - 1:
                index += 1
                continue
            take = left if index == workers - 1 or left - room < min_rows // 2 else max(room, min(min_rows, left))
            end = w.physical_rows if take == left else min(w.physical_rows, start + max(1, round(take / density)))
            shards[index].append(Piece(w.fragment_id, start, end, take))
            filled[index] += take
            done += take
            left -= take
            start = end
    return [Shard(i, tuple(pieces)) for i, pieces in enumerate(shards) if pieces]


def workers_within_budget(workers: int, gpu_count: int, *budgets: int | None) -> int:
    """How many workers a refresh may start: what it asked for, within every GPU budget that is set.

    >>> workers_within_budget(8, 2, 6, None), workers_within_budget(4, 1, None), workers_within_budget(4, 0, 2)
    (3, 4, 4)
    """
    if gpu_count <= 0:
        return workers
    for budget in budgets:
        if budget is not None:
            workers = min(workers, max(1, budget // gpu_count))
    return workers


def why_fewer_shards(asked: int, allowed: int, used: int, rows: int, budget: int | None = None,
                     gpu_count: int = 1, min_rows: int = MIN_SHARD_ROWS) -> str:
    """Why a refresh that asked for `asked` workers uses `used` shards ('' when it uses them all).

    `allowed` is what the GPU budget `budget` leaves; `rows` the rows planned.

    >>> why_fewer_shards(8, 8, 1, 500)
    'only 500 rows to compute, and a shard takes at least 1,024 rows'
    >>> why_fewer_shards(8, 3, 3, 100_000, budget=6, gpu_count=2)
    'the GPU budget of 6 GPUs allows 3 workers of 2 GPUs'
    >>> why_fewer_shards(8, 8, 0, 0), why_fewer_shards(4, 4, 4, 10_000)
    ('no row to compute', '')
    """
    if used >= asked:
        return ""
    if used == 0:
        return "no row to compute"
    reasons = []
    if allowed < asked:
        reasons.append(f"the GPU budget of {budget} GPUs allows {allowed} worker{'s' if allowed != 1 else ''} of "
                       f"{gpu_count} GPU{'s' if gpu_count != 1 else ''}")
    if used < allowed:
        reasons.append(f"only {rows:,} rows to compute, and a shard takes at least {min_rows:,} rows")
    return "; ".join(reasons)
