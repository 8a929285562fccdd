"""Materializing a Function refreshes its column incrementally on a real Lance table: unfilled rows
are filled, rows whose inputs changed are recomputed, nothing else is (calls are counted), a
concurrent writer loses nothing, failures follow the error policy, and a SIGKILLed refresh
resumes where it stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import lance
import lancedb
import numpy as np
import pyarrow as pa
import pytest

from gpufn_dagster import function_of, gpu_function, make_function, refresh_column
from gpufn_dagster.assets.reporting import ERRORS_TABLE
from gpufn_dagster.refresh.files import TableFiles
from tests.storages import STORAGES

from ..helpers import make_docs, metadata, open_table, run, values

CALLS: list[str] = []


def shout(text: str) -> str:
    CALLS.append(text)
    return text.upper()


@pytest.fixture(autouse=True)
def _reset_calls():
    CALLS.clear()


@pytest.mark.parametrize("db_uri", STORAGES, indirect=True)
def test_refresh_fills_then_only_new_and_changed_rows(db_uri):
    make_docs(db_uri, 500)
    asset = gpu_function(table="docs", column="shout", batch_size=64)(shout)

    first = run(db_uri, asset)
    assert first.success and len(CALLS) == 500
    assert values(db_uri)[42] == "DOC 42"
    meta = metadata(first)
    assert meta["rows_computed"] == 500 and meta["dagster/row_count"] == 500
    assert meta["function_version"] == function_of(asset).version
    assert meta["table_version_after"] > meta["table_version_before"]

    CALLS.clear()
    assert run(db_uri, asset).success and CALLS == []  # nothing changed: nothing recomputed

    make_docs(db_uri, 3, start=500)  # append
    table = open_table(db_uri)
    table.update(where="id = 7", values={"text": "seven"})  # an input changed
    table.update(where="id = 8", values={"tag": "y"})  # a non-input column changed
    table.delete("id = 9")
    CALLS.clear()
    result = run(db_uri, asset)
    assert sorted(CALLS) == ["doc 500", "doc 501", "doc 502", "seven"]
    assert metadata(result)["rows_computed"] == 4
    now = values(db_uri)
    assert now[7] == "SEVEN" and now[8] == "DOC 8" and now[501] == "DOC 501" and 9 not in now
    assert all(v is not None for v in now.values())


@pytest.mark.parametrize("db_uri", STORAGES, indirect=True)
def test_new_function_version_recomputes_every_row_once(db_uri):
    make_docs(db_uri, 200)
    run(db_uri, gpu_function(table="docs", column="shout")(shout))

    def shout_v2(text: str) -> str:  # same column and asset, new code: a new Function version
        CALLS.append(text)
        return text.upper() + "!"

    CALLS.clear()
    asset = gpu_function(table="docs", column="shout", name="docs__shout")(shout_v2)
    result = run(db_uri, asset)
    assert len(CALLS) == 200
    assert set(values(db_uri).values()) == {f"DOC {i}!" for i in range(200)}
    assert metadata(result)["function_version"] == function_of(asset).version


@pytest.mark.parametrize("db_uri", STORAGES, indirect=True)
def test_concurrent_append_during_refresh_is_kept_and_filled_next_time(db_uri):
    make_docs(db_uri, 300)
    appended = []

    def slow_shout(text: str) -> str:
        if not appended:  # another writer appends while the refresh is computing
            make_docs(db_uri, 50, start=1000)
            appended.append(True)
        CALLS.append(text)
        return text.upper()

    asset = gpu_function(table="docs", column="shout", batch_size=50)(slow_shout)
    assert run(db_uri, asset).success
    after_first = values(db_uri)
    assert len(after_first) == 350  # the writer's rows survived the refresh's commit
    assert sum(v is None for v in after_first.values()) == 50
    CALLS.clear()
    assert run(db_uri, asset).success
    assert len(CALLS) == 50 and all(v is not None for v in values(db_uri).values())


def flaky(text: str) -> str:
    if text.endswith("3"):
        raise ValueError(f"cannot shout {text!r}")
    return text.upper()


def test_skip_policy_records_failed_rows_where_users_can_query_them(db_uri):
    make_docs(db_uri, 40)
    asset = gpu_function(table="docs", column="shout", on_error="skip")(flaky)
    result = run(db_uri, asset)
    assert result.success
    assert metadata(result)["rows_failed"] == 4  # 3, 13, 23, 33
    assert values(db_uri)[13] is None and values(db_uri)[12] == "DOC 12"
    errors = lancedb.connect(db_uri).open_table(ERRORS_TABLE).to_arrow().to_pylist()
    assert len(errors) == 4 and all("cannot shout" in e["error"] for e in errors)
    assert {e["function"] for e in errors} == {"docs__shout"}


def test_fail_policy_fails_the_run_and_leaves_the_table_alone(db_uri):
    make_docs(db_uri, 40)
    version = open_table(db_uri).version
    result = run(db_uri, gpu_function(table="docs", column="shout2")(flaky))
    assert not result.success
    failure = result.get_step_failure_events()[0].step_failure_data.error.cause
    assert failure.cls_name == "FunctionFailed"
    assert "failed on row id 3 (fragment 0, offset 3; text='doc 3')" in failure.message and "cannot shout 'doc 3'" in failure.message
    table = open_table(db_uri)
    assert table.version == version + 1  # only the (all-NULL) column was declared; no values committed
    assert table.count_rows("shout2 IS NOT NULL") == 0


def test_batch_function_failure_is_pinned_on_the_failing_rows(db_uri):
    make_docs(db_uri, 20)

    def batch_flaky(text: pa.Array) -> pa.Array:
        items = text.to_pylist()
        if any(t.endswith("5") for t in items):
            raise ValueError("five")
        return pa.array([t.upper() for t in items])

    result = run(db_uri, gpu_function(table="docs", column="shout", output_type=pa.string(), on_error="skip",
                                      batch_size=8)(batch_flaky))
    assert metadata(result)["rows_failed"] == 2  # doc 5 and doc 15, not their whole batches
    assert values(db_uri)[14] == "DOC 14" and values(db_uri)[15] is None


def test_progress_is_logged_with_rate_and_time_left(db_uri):
    make_docs(db_uri, 100)
    lines = []
    function = function_of(gpu_function(table="docs", column="shout", batch_size=10)(shout))
    refresh_column(open_table(db_uri).to_lance().uri, function, report=lambda p: lines.append(p.line()),
                   report_every=0.01)
    assert any("rows checked" in line and "rows/s" in line and "left" in line for line in lines)
    assert lines[-1].startswith("100/100 rows checked, 100 computed, 0 failed")


CALL_SIZES: list[int] = []


def doubled(x: pa.Array) -> pa.Array:
    CALL_SIZES.append(len(x))
    return pa.compute.multiply(x, 2)


def test_a_batch_size_above_65536_makes_calls_of_its_size_on_a_fragment_of_400000_rows(tmp_path):
    """BENCHMARKS.md's 262,144-row calls: reads come 1,024 rows at a time, so a 262,144-row call
    waits for 256 reads; before, a call was cut once 65,536 rows were read and asked for more rows
    than that (IndexError: pop from an empty deque). Pinned (`adapt_batch_size=False`): an adapting
    call's size follows the measured rate (65,536 rows in 0.32 s on a loaded machine aim at 203,072
    rows), and how calls grow is `BatchSizer`'s, tested there."""
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"x": pa.array(np.arange(400_000, dtype=np.int64))}), uri)
    assert len(lance.dataset(uri).get_fragments()) == 1
    CALL_SIZES.clear()
    result = refresh_column(uri, make_function(doubled, table="t", column="y", output_type=pa.int64(),
                                               batch_size=262_144, adapt_batch_size=False))
    assert (result.rows_computed, result.rows_failed) == (400_000, 0)
    assert CALL_SIZES == [262_144, 400_000 - 262_144], CALL_SIZES
    table = lance.dataset(uri).to_table(columns=["x", "y"])
    assert np.array_equal(table.column("y").to_numpy(), 2 * table.column("x").to_numpy())


class SlowModel:
    """A Function whose model takes a while to load, and whose second batch takes long too."""

    def __init__(self):
        time.sleep(1.5)
        self.batches = 0

    def __call__(self, text: pa.Array) -> pa.Array:
        self.batches += 1
        time.sleep(1.5 if self.batches == 2 else 0.0)
        return pa.array([t.upper() for t in text.to_pylist()])


def test_loading_the_model_is_reported_apart_and_progress_keeps_its_interval(db_uri):
    make_docs(db_uri, 100)
    stamped: list[tuple[float, str]] = []
    function = function_of(gpu_function(table="docs", column="shout", output_type=pa.string(),
                                         batch_size=50)(SlowModel))
    result = refresh_column(open_table(db_uri).to_lance().uri, function, report_every=0.25,
                            report=lambda p: stamped.append((time.monotonic(), p.line())))
    loading = [line for _, line in stamped if line.startswith("loading the Function")]
    assert len(loading) >= 3, stamped   # said while it loads, not only after
    assert 1.4 <= result.load_seconds < result.wall_seconds
    # The slow second batch did not silence the log: lines kept coming at about the promised interval.
    gaps = [b - a for (a, _), (b, _) in zip(stamped, stamped[1:])]
    assert max(gaps) < 1.2, gaps
    # rows/s is of computing alone: the 1.5 s load is not in it.
    assert result.compute_seconds < result.wall_seconds - 1.4
    assert result.rows_per_second == pytest.approx(100 / result.compute_seconds)
    assert "Function loaded in 1." in stamped[-1][1]


KILLABLE = textwrap.dedent("""
    import sys, time, lance
    from gpufn_dagster import make_function, refresh_column
    uri, log, delay, prefetch = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
    def slow(text: str) -> str:
        with open(log, "a") as f:
            f.write(text + "\\n")
        time.sleep(delay)
        return text.upper() + "@v2"
    fn = make_function(slow, table="docs", column="shout", batch_size=25, adapt_batch_size=False, version="%s",
                       checkpoint_seconds=0)
    refresh_column(uri, fn, prefetch=prefetch)
""")


@pytest.mark.parametrize("db_uri", STORAGES, indirect=True)
@pytest.mark.parametrize("prefetch", [0, 2], ids=["sequential", "prefetch"])
def test_sigkilled_refresh_resumes_and_never_mixes_versions(db_uri, tmp_path: Path, prefetch: int):
    make_docs(db_uri, 400)
    uri = open_table(db_uri).to_lance().uri
    run(db_uri, gpu_function(table="docs", column="shout")(shout))  # version 1 everywhere
    version_before = open_table(db_uri).version
    log = tmp_path / "calls.log"
    script = tmp_path / "refresh.py"
    script.write_text(KILLABLE % "release-2")
    process = subprocess.Popen([sys.executable, str(script), uri, str(log), "0.002", str(prefetch)])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not log.exists() or len(log.read_text().splitlines()) < 130):
        time.sleep(0.01)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    done_before_kill = len(log.read_text().splitlines())
    assert 130 <= done_before_kill < 400

    # Killed mid-refresh: the table never saw version-2 values.
    assert open_table(db_uri).version == version_before
    assert all(not v.endswith("@v2") for v in values(db_uri).values())

    log.unlink()
    subprocess.run([sys.executable, str(script), uri, str(log), "0", str(prefetch)], check=True)
    recomputed = len(log.read_text().splitlines())
    # At most the batches computed and not yet checkpointed (25 rows each: the one in flight, and
    # with prefetch those the model finished while the writer had not yet caught up) run twice.
    assert recomputed <= 400 - done_before_kill + 25 * (prefetch + 1)
    assert set(values(db_uri).values()) == {f"DOC {i}@v2" for i in range(400)}
    files = TableFiles(uri)
    assert files.dataset().validate() is None
    assert files.names("_gpufn/checkpoints") == []
    # The files the killed refresh wrote and never committed are gone; every version still reads.
    # (Lance's own temporary file of the write in flight, data/.tmp*, is left to Lance's
    # cleanup_old_versions: other writers' temporary files look the same.)
    dataset = files.dataset()
    referenced = {f.path for v in dataset.versions()
                  for fragment in files.dataset(v["version"]).get_fragments()
                  for f in fragment.metadata.files}
    assert {name for name in files.names("data") if not name.startswith(".tmp")} <= referenced
    for v in dataset.versions():
        assert files.dataset(v["version"]).to_table().num_rows == 400


def spread(x: int) -> list[float]:
    """A variable-length list per row: x copies of x."""
    return [float(x)] * (x % 4)


def described(x: int) -> dict:
    return {"n": x, "tags": [str(x)] * (x % 3)}


@pytest.mark.parametrize("storage", ["2.0", "2.1", "2.2"])
@pytest.mark.parametrize(("function", "output_type"), [(spread, "list<float32>"),
                                                      (described, "struct<n: int64, tags: list<string>>")])
def test_nested_outputs_commit_and_a_refresh_after_an_append_computes_only_the_new_rows(tmp_path, storage, function,
                                                                                        output_type):
    """The README's `output_type="list<float32>"`: a Function whose values nest (a list, a struct of a
    list) writes files Lance accepts in every file format -- 2.1+ lists only the leaves' fields --
    and the next refresh finds them (it computes the appended rows, nothing else)."""
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"x": pa.array(np.arange(100, dtype=np.int64))}), uri, data_storage_version=storage)
    spec = make_function(function, table="t", column="v", output_type=output_type)
    assert refresh_column(uri, spec).rows_computed == 100
    lance.write_dataset(pa.table({"x": pa.array(np.arange(100, 130, dtype=np.int64))}), uri, mode="append")
    again = refresh_column(uri, spec)
    assert (again.rows_computed, again.rows_failed) == (30, 0)
    assert refresh_column(uri, spec).rows_computed == 0
    table = lance.dataset(uri).to_table(columns=["x", "v"]).to_pylist()
    assert [row["v"] for row in table] == [function(row["x"]) for row in table]
