"""Refreshing a slice of a table (the engine under a partition), on real Lance tables on disk and
on the suite's object store: the slice's stale rows computed and nothing else, slices of one
fragment refreshed side by side with nothing lost or computed twice, and the same slice twice
computing each row once."""

from __future__ import annotations

import threading

import lance
import numpy as np
import pyarrow as pa
import pytest

from gpufn_dagster import make_function
from gpufn_dagster.refresh.engine import ColumnRefresh, RefreshOptions
from gpufn_dagster.refresh.files import TableFiles
from tests.storages import STORAGES

CALLED: list[int] = []
GATE = threading.Event()
BOTH = threading.Barrier(2, timeout=60)
_lock = threading.Lock()
_first_calls = [0]


def tenfold(x: pa.Array) -> pa.Array:
    with _lock:
        CALLED.extend(x.to_pylist())
    return pa.compute.multiply(x, 10)


def tenfold_after_gate(x: pa.Array) -> pa.Array:
    """Waits until the test opens the gate."""
    GATE.wait(60)
    return tenfold(x)


def tenfold_together(x: pa.Array) -> pa.Array:
    """The first call of each of two refreshes waits for the other's: both compute at once, and
    both read the same table version."""
    with _lock:
        _first_calls[0] += 1
        first = _first_calls[0] <= 2
    if first:
        BOTH.wait()
    return tenfold(x)


@pytest.fixture(autouse=True)
def _reset():
    CALLED.clear()
    GATE.clear()
    BOTH.reset()
    _first_calls[0] = 0


def _table(files: TableFiles, days: list[int]) -> None:
    """One fragment with rows of days 0..2 interleaved, then one fragment per day in `days`."""
    mixed = pa.table({"x": list(range(300)), "day": [i % 3 for i in range(300)]})
    lance.write_dataset(mixed, files.uri, storage_options=files.storage_options or None)
    for day in days:
        lance.write_dataset(pa.table({"x": list(range(1000 + 100 * day, 1010 + 100 * day)), "day": [day] * 10}),
                            files.uri, mode="append", storage_options=files.storage_options or None)


def _values(files: TableFiles) -> dict[int, int | None]:
    data = files.dataset().to_table(columns=["x", "y"]).to_pydict()
    return dict(zip(data["x"], data["y"], strict=True))


def _refresh(files: TableFiles, function, where: str | None, holder: str = "run"):
    return ColumnRefresh(files, function, RefreshOptions(where=where, holder=holder, concurrency=2)).refresh()


@pytest.mark.parametrize("db_uri", STORAGES, indirect=True)
def test_a_slice_refresh_computes_its_stale_rows_and_leaves_every_other_row_untouched(db_uri):
    files = TableFiles(f"{db_uri}/slice.lance")
    _table(files, days=[1, 2])
    function = make_function(tenfold, table="t", column="y", inputs=["x"], output_type=pa.int64())

    result = _refresh(files, function, "day = 1")
    day1 = {x for x in range(300) if x % 3 == 1} | set(range(1100, 1110))
    assert sorted(CALLED) == sorted(day1)
    assert result.rows_computed == len(day1) == result.rows_checked
    assert {x: v for x, v in _values(files).items() if v is not None} == {x: 10 * x for x in day1}
    # the pure day-2 fragment was never written: its column has no file of its own
    fragments = files.dataset().get_fragments()
    y_id = files.dataset().lance_schema.field("y").id()
    assert [any(y_id in f.fields for f in fr.metadata.files) for fr in fragments] == [True, True, False]

    CALLED.clear()
    assert _refresh(files, function, "day = 1").rows_computed == 0 and CALLED == []
    # an append into day 1 and one into day 2: the slice picks up only its own
    lance.write_dataset(pa.table({"x": [5000, 6000], "day": [1, 2]}), files.uri, mode="append",
                        storage_options=files.storage_options or None)
    assert _refresh(files, function, "day = 1").rows_computed == 1 and CALLED == [5000]
    CALLED.clear()
    # the whole column afterwards computes only what no slice did
    whole = _refresh(files, function, None)
    assert sorted(CALLED) == sorted({x for x in _values(files) if x not in day1 | {5000}})
    assert whole.rows_computed == len(CALLED)
    assert all(v == 10 * x for x, v in _values(files).items())


def test_two_slices_of_one_fragment_commit_side_by_side_and_neither_loses_its_rows(tmp_path):
    files = TableFiles(str(tmp_path / "side.lance"))
    _table(files, days=[])
    function = make_function(tenfold_together, table="t", column="y", inputs=["x"], output_type=pa.int64())
    results: dict[str, object] = {}

    def refresh(day: int) -> None:
        results[day] = _refresh(files, function, f"day = {day}", holder=f"run {day}")

    # both compute at once (the Function's first calls meet): neither waits for the other's lease
    threads = [threading.Thread(target=refresh, args=(day,)) for day in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert set(results) == {0, 1}
    assert results[0].version_before == results[1].version_before
    assert sorted(CALLED) == sorted(x for x in range(300) if x % 3 in (0, 1))  # each row once
    assert results[0].rows_computed == results[1].rows_computed == 100
    values = _values(files)
    assert {x: v for x, v in values.items() if v is not None} == {x: 10 * x for x in range(300) if x % 3 != 2}
    # the slice that committed second rebased: its new file holds the other's rows too, nothing recomputed
    CALLED.clear()
    assert _refresh(files, function, None).rows_computed == 100
    assert sorted(CALLED) == [x for x in range(300) if x % 3 == 2]


def test_the_same_slice_twice_at_once_computes_each_row_once(tmp_path):
    files = TableFiles(str(tmp_path / "twice.lance"))
    _table(files, days=[1])
    function = make_function(tenfold_after_gate, table="t", column="y", inputs=["x"], output_type=pa.int64())
    lines: list[str] = []
    results = []
    threads = [threading.Thread(target=lambda h=h: results.append(ColumnRefresh(files, function, RefreshOptions(
        where="day = 1", holder=h, on_wait=lines.append)).refresh())) for h in ("run a", "run b")]
    for thread in threads:
        thread.start()
    for _ in range(600):
        if lines:
            break
        threading.Event().wait(0.05)
    GATE.set()
    for thread in threads:
        thread.join(120)
    assert lines and "waiting for the refresh of this column" in lines[0]
    assert sorted(r.rows_computed for r in results) == [0, 110]
    assert sorted(CALLED) == sorted({x for x in range(300) if x % 3 == 1} | set(range(1100, 1110)))
