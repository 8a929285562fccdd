"""Splitting a refresh over workers (pure), and the lease every worker of it shares: each row
planned once, shards balanced by rows, fragments cut when workers outnumber them; a lease taken
by one refresh is adopted by the steps of the same refresh and waited for by any other."""

from __future__ import annotations

import random
import threading

import pytest

from gpufn_dagster.refresh.files import TableFiles
from gpufn_dagster.refresh.lease import ColumnLease
from gpufn_dagster.refresh.plan import FragmentWork
from gpufn_dagster.refresh.shards import split_work, workers_within_budget


def fragment(index: int, physical: int, live: int) -> FragmentWork:
    return FragmentWork(index, physical, live, "h", f"k{index}", "new")


@pytest.mark.parametrize("seed", range(200))
def test_every_fragment_is_covered_once_and_shards_are_balanced(seed):
    rng = random.Random(seed)
    work = []
    for i in range(rng.randint(1, 6)):
        physical = rng.randint(1, 50_000)
        work.append(fragment(i, physical, rng.choice([physical, rng.randint(0, physical)])))
    workers = rng.randint(1, 9)
    shards = split_work(work, workers)
    assert len(shards) <= workers
    pieces = {}
    for shard in shards:
        for piece in shard.pieces:
            pieces.setdefault(piece.fragment_id, []).append(piece)
    for w in work:  # the physical rows of every fragment, once, in order
        ranges = sorted((p.start, p.end) for p in pieces[w.fragment_id])
        assert ranges[0][0] == 0 and ranges[-1][1] == w.physical_rows
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    total = sum(w.live_rows for w in work)
    if total >= workers * 4096:  # enough work for every worker: none gets more than its share + a read
        assert len(shards) == workers
        assert max(s.rows for s in shards) <= total / workers + 1024


def test_one_large_fragment_feeds_every_worker():
    shards = split_work([fragment(0, 1_000_000, 1_000_000)], 8)
    assert [s.rows for s in shards] == [125_000] * 8


def test_the_gpu_budget_caps_workers():
    assert workers_within_budget(8, 2, 6, 10) == 3 and workers_within_budget(8, 1, None, None) == 8


def test_create_writes_only_once(tmp_path):
    files = TableFiles(str(tmp_path / "t.lance"))
    results = []
    barrier = threading.Barrier(8)

    def racer(i: int) -> None:
        barrier.wait()
        results.append(files.create("_gpufn/x", str(i).encode()))

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count(True) == 1 and files.read("_gpufn/x") in {str(i).encode() for i in range(8)}


def test_steps_of_one_refresh_adopt_its_lease_and_another_refresh_waits(tmp_path):
    files = TableFiles(str(tmp_path / "t.lance"))
    plan = ColumnLease(files, "sig", "run A", token="run-a", keep=True, ttl=30)
    with plan:
        pass  # kept for the next step
    with ColumnLease(files, "sig", "run A shard", token="run-a", keep=True, ttl=30) as shard:
        assert shard.generation == plan.generation  # adopted, not waited for
    lines: list[str] = []
    other = ColumnLease(files, "sig", "run B", ttl=30, on_wait=lines.append, poll=0.05, report_every=0.1)
    waiter = threading.Thread(target=other.acquire)
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive() and any("by run A" in line for line in lines)  # run B waits for run A
    commit = ColumnLease(files, "sig", "run A commit", token="run-a", ttl=30)
    commit.acquire()
    commit.release()  # the commit releases the refresh's lease
    waiter.join(10)
    assert not waiter.is_alive() and other.generation is not None
    other.release()
    assert files.names("_gpufn/leases/sig") == []
