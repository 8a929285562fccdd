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


def test_a_kept_lease_whose_run_ended_is_taken_over_at_once_and_a_live_ones_is_not(tmp_path):
    """A fanned-out run killed between steps leaves its lease with no process holding it; a later
    refresh takes it over as soon as `ended` says the holder's run is over, never while it runs."""
    files = TableFiles(str(tmp_path / "t.lance"))
    with ColumnLease(files, "sig", "run A", token="run-a", keep=True, ttl=900):
        pass  # left for its shards, which were killed
    over: set[str] = set()
    lines: list[str] = []
    later = ColumnLease(files, "sig", "run B", token="run-b", ttl=30, poll=0.05, on_wait=lines.append,
                        ended=lambda token: token in over)
    waiter = threading.Thread(target=later.acquire)
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive()  # run A may still come back: run B waits
    over.add("run-a")
    waiter.join(10)
    assert not waiter.is_alive() and later.generation == 2
    assert any("its run has ended" in line for line in lines)
    later.release()


def _work() -> FragmentWork:
    return FragmentWork(fragment_id=0, physical_rows=100, live_rows=100, inputs_hash="h", content_key="k",
                        reason="new")


def test_a_checkpointed_chunk_is_used_only_while_its_bytes_match_its_checksum(tmp_path):
    import pyarrow as pa

    from gpufn_dagster.errors import PartDamaged
    from gpufn_dagster.refresh.checkpoint import CheckpointStore

    files = TableFiles(str(tmp_path / "t.lance"))
    store = CheckpointStore(files, "sig", "v1")
    batch = pa.record_batch({"y": list(range(50))})
    store.save_chunk(_work(), 0, 50, [batch], {"computed": 50, "by": "run-a"})
    ((end, name),) = store.chunks(_work()).values()
    batches, outcome = store.load_chunk(name)
    assert end == 50 and batches[0].column("y").to_pylist() == list(range(50)) and outcome["by"] == "run-a"
    data = bytearray(files.read(name))
    data[-100] ^= 0xFF  # one byte changed where it lies
    files.write(name, bytes(data))
    with pytest.raises(PartDamaged, match="failed its checksum"):
        store.load_chunk(name)
    assert store.chunks(_work()) == {}  # removed: its rows are computed again


def test_a_finished_fragment_is_adopted_only_while_its_file_is_the_one_it_recorded(tmp_path):
    from gpufn_dagster.errors import PartDamaged
    from gpufn_dagster.refresh.checkpoint import CheckpointStore

    files = TableFiles(str(tmp_path / "t.lance"))
    store = CheckpointStore(files, "sig", "v1")
    files.write("data/f.lance", b"the fragment's values")
    record = {"file": "f.lance", "checksum": files.stored_checksum("data/f.lance"), "rows": 100}
    store.save_fragment(_work(), record)
    assert store.load_fragment(_work()) == record
    files.write("data/f.lance", b"other values, other size")
    with pytest.raises(PartDamaged, match="failed its checksum"):
        store.load_fragment(_work())
    assert store.load_fragment(_work()) is None and not files.exists("data/f.lance")  # computed again
