"""The GPU worker's pipeline on real Lance tables: out-of-memory batches split instead of failing,
reading ahead never changes what is written, batches grow from a small probe (or stay pinned),
a failing fragment stops the others, and a materialization says what the worker did."""

from __future__ import annotations

import time

import lance
import lancedb
import pyarrow as pa
import pytest

from gpufn_dagster import gpu_function, make_function, refresh_column
from gpufn_dagster.errors import FunctionFailed
from gpufn_dagster.assets.resources import STABLE_ROW_IDS

from ..helpers import make_docs, metadata, open_table, run, values



class OutOfMemoryError(RuntimeError):
    """Named like torch's `torch.cuda.OutOfMemoryError`, which is what the engine recognizes."""


class SmallGpu:
    """A model that runs out of device memory on more than `fits` rows at once, as a GPU would."""

    fits = 40
    calls: list[tuple[int, bool]] = []  # (rows, ran out of memory)

    def __call__(self, text: pa.Array) -> pa.Array:
        too_big = len(text) > self.fits
        SmallGpu.calls.append((len(text), too_big))
        if too_big:
            raise OutOfMemoryError(f"CUDA out of memory. Tried to allocate {len(text)} rows")
        return pa.array([t.upper() for t in text.to_pylist()])


def uri_of(db_uri: str) -> str:
    return open_table(db_uri).to_lance().uri


def test_out_of_memory_splits_the_batch_and_every_row_is_filled(db_uri):
    make_docs(db_uri, 300)
    SmallGpu.calls = []
    result = run(db_uri, gpu_function(table="docs", column="shout", output_type=pa.string(), batch_size=64)(SmallGpu))
    assert result.success
    assert values(db_uri) == {i: f"DOC {i}" for i in range(300)}
    found = metadata(result)
    ran_out = sum(1 for _, oom in SmallGpu.calls if oom)
    assert ran_out >= 1 and found["oom_splits"] == ran_out
    assert found["batch_rows_that_fit"] <= SmallGpu.fits and found["rows_failed"] == 0
    # Later batches stay at the size that fit: after the first split nothing too big is tried again.
    first = next(i for i, (_, oom) in enumerate(SmallGpu.calls) if oom)
    assert all(rows <= found["batch_rows_that_fit"] for rows, _ in SmallGpu.calls[first + 1:])
    assert sum(rows for rows, oom in SmallGpu.calls if not oom) == 300  # each row computed once


def test_an_error_the_function_declares_as_out_of_memory_splits_too(db_uri):
    make_docs(db_uri, 100)
    sizes: list[int] = []

    class DeviceFull(Exception):
        pass

    def shout(text: pa.Array) -> pa.Array:
        sizes.append(len(text))
        if len(text) > 10:
            raise DeviceFull("no room")
        return pa.array([t.upper() for t in text.to_pylist()])

    shout.oom_errors = (DeviceFull,)
    result = refresh_column(uri_of(db_uri), make_function(shout, table="docs", column="shout",
                                                          output_type=pa.string(), batch_size=32))
    assert result.rows_computed == 100 and result.rows_failed == 0 and result.oom_splits >= 2
    assert result.batch_rows_that_fit == 8  # 32 -> 16 -> 8
    assert values(db_uri)[99] == "DOC 99"


def test_a_single_row_that_never_fits_fails_alone_under_skip_and_is_named_under_fail(db_uri):
    make_docs(db_uri, 50)

    def huge_doc_7(text: pa.Array) -> pa.Array:
        if "doc 7" in text.to_pylist():
            raise OutOfMemoryError("CUDA out of memory")
        return pa.array([t.upper() for t in text.to_pylist()])

    skip = make_function(huge_doc_7, table="docs", column="shout", output_type=pa.string(), batch_size=16,
                         on_error="skip")
    result = refresh_column(uri_of(db_uri), skip)
    assert result.rows_failed == 1 and result.rows_computed == 49  # the other 49 got a value
    (error,) = result.errors
    assert "ran out of device memory on a single row" in error.error and error.row_address == 7
    assert values(db_uri)[7] is None and values(db_uri)[8] == "DOC 8"

    fail = make_function(huge_doc_7, table="docs", column="shout2", output_type=pa.string(), batch_size=16)
    with pytest.raises(FunctionFailed, match=r"ran out of device memory on a single row, row id 7 \(fragment 0, offset 7; text='doc 7'\)"):
        refresh_column(uri_of(db_uri), fail)


def _fragmented_docs(db_uri: str, name: str, rows_each: int = 120) -> str:
    """A table of five fragments of `rows_each` rows (ids in order)."""
    db = lancedb.connect(db_uri)
    table = None
    for part in range(5):
        rows = range(part * rows_each, (part + 1) * rows_each)
        data = pa.table({"id": list(rows), "text": [f"doc {i}" for i in rows]})
        table = db.create_table(name, data, storage_options=STABLE_ROW_IDS) if table is None else table
        if part:
            table.add(data)
    return table.to_lance().uri


def flaky_upper(text: pa.Array) -> pa.Array:
    items = text.to_pylist()
    if any(t.endswith("3") for t in items):
        raise ValueError("three")
    return pa.array([t.upper() for t in items])


def test_reading_ahead_writes_exactly_what_the_sequential_path_writes(db_uri):
    columns = {}
    for prefetch in (0, 2):
        uri = _fragmented_docs(db_uri, f"docs_{prefetch}")
        function = make_function(flaky_upper, table=f"docs_{prefetch}", column="shout", output_type=pa.string(),
                                 batch_size=16, on_error="skip")
        first = refresh_column(uri, function, prefetch=prefetch)
        lance.dataset(uri).update({"text": "'changed ' || text"}, where="id % 37 = 0")
        second = refresh_column(uri, function, prefetch=prefetch)
        table = lance.dataset(uri).to_table(columns=["id", "shout", "_gpufn_sig_shout"]).sort_by("id")
        columns[prefetch] = (table.to_pydict(), [sorted(e.row_address for e in r.errors) for r in (first, second)],
                             [(r.rows_computed, r.rows_failed, r.fragments_rewritten) for r in (first, second)])
    assert columns[0] == columns[2]
    data, errors, counts = columns[2]
    stale = {i for i in range(600) if i % 37 == 0} | {i for i in range(600) if i % 10 == 3}  # changed or failed
    assert counts[0] == (540, 60, 5) and counts[1][:2] == (len(stale) - 60, 60)  # computed: given a value
    assert data["shout"][1] == "DOC 1" and data["shout"][3] is None and data["shout"][37] == "CHANGED DOC 37"


def test_batches_grow_from_the_probe_toward_the_target_and_a_pinned_size_stays(db_uri):
    make_docs(db_uri, 3000)
    sizes: list[int] = []

    def per_call_cost(text: pa.Array) -> pa.Array:
        sizes.append(len(text))
        time.sleep(0.02)  # a fixed cost per call, like a kernel launch: bigger calls are cheaper per row
        return pa.array([t.upper() for t in text.to_pylist()])

    adaptive = make_function(per_call_cost, table="docs", column="shout", output_type=pa.string(), batch_size=16,
                             max_batch_size=512)
    result = refresh_column(uri_of(db_uri), adaptive)
    assert sizes[0] == 16 and max(sizes) == 512 == result.batch_rows_largest
    for i in range(1, len(sizes)):  # grown by at most 4x a step (rounded up to whole 16-row reads)
        assert sizes[i] <= 4 * max(sizes[:i]) + 15, sizes
    assert len(sizes) < 3000 / 16 / 2  # far fewer calls than at the probe's size

    sizes.clear()
    pinned = make_function(per_call_cost, table="docs", column="shout2", output_type=pa.string(), batch_size=16,
                           adapt_batch_size=False)
    result = refresh_column(uri_of(db_uri), pinned)
    assert set(sizes[:-1]) == {16} and result.batch_rows_largest == 16
    assert sum(sizes) == 3000


def test_an_explicit_batch_size_is_the_most_rows_any_call_takes(db_uri):
    """Users set batch_size to what their model, device or API accepts: the probe starts at or below it
    and adapting never goes past it, however fast the calls are."""
    make_docs(db_uri, 2000)
    sizes: list[int] = []

    def fast(text: pa.Array) -> pa.Array:
        sizes.append(len(text))
        return pa.array([t.upper() for t in text.to_pylist()])

    for column, batch_size in (("small", 16), ("large", 300)):
        sizes.clear()
        result = refresh_column(uri_of(db_uri), make_function(fast, table="docs", column=column,
                                                              output_type=pa.string(), batch_size=batch_size))
        assert result.rows_computed == 2000 and sum(sizes) == 2000
        assert max(sizes) == batch_size == result.batch_rows_largest, sizes  # reached, never exceeded
        assert sizes[0] == min(batch_size, 64)
    sizes.clear()
    unset = make_function(fast, table="docs", column="unset", output_type=pa.string())
    refresh_column(uri_of(db_uri), unset)
    assert sizes[0] == 64 and max(sizes) > 64  # without it: the probe grows as before


def test_a_failing_fragment_stops_the_others_instead_of_computing_on(db_uri):
    uri = _fragmented_docs(db_uri, "docs", rows_each=300)
    computed: list[str] = []

    def slow_then_fails(text: pa.Array) -> pa.Array:
        items = text.to_pylist()
        computed.extend(items)
        if "doc 20" in items:
            raise ValueError("doc 20 is broken")
        time.sleep(0.05)
        return pa.array([t.upper() for t in items])

    function = make_function(slow_then_fails, table="docs", column="shout", output_type=pa.string(), batch_size=10,
                             adapt_batch_size=False)
    with pytest.raises(FunctionFailed, match="doc 20 is broken"):
        refresh_column(uri, function, concurrency=2)
    # The first fragment failed at its third call. The second one, computing beside it, stopped
    # within the calls it had staged ahead (it would have computed all its 300 rows); the last three
    # were never started (or stopped at once if one began as the first fragment's thread came free).
    second = [t for t in computed if 300 <= int(t.split()[1]) < 600]
    assert len(second) < 200, len(second)
    assert len(computed) < 300, len(computed)
    assert lance.dataset(uri).to_table(columns=["shout"]).column("shout").null_count == 1500


def test_the_materialization_says_when_values_came_and_how_busy_the_function_was(db_uri):
    make_docs(db_uri, 400)

    def sleepy(text: pa.Array) -> pa.Array:
        time.sleep(0.2)  # long beside the reading, so the fraction is clear even on a loaded machine
        return pa.array([t.upper() for t in text.to_pylist()])

    result = run(db_uri, gpu_function(table="docs", column="shout", output_type=pa.string(),
                                      batch_size=32)(sleepy))
    found = metadata(result)
    assert 0 < found["first_values_seconds"] < found["wall_seconds"]
    assert 0.5 < found["busy_fraction"] <= 1.0  # the Function's sleep, not reading, filled the time
    assert found["batch_rows_largest"] >= 32 and "oom_splits" not in found
    assert "gpu_utilization_mean_percent" not in found  # no NVIDIA driver here: no GPU figures, no error


def _sleepy(calls: list[float], before_call=None):
    """A batch UDF that sleeps 30 ms a call (a stand-in for a GPU kernel), timing each call itself."""
    def sleepy(text: pa.Array) -> pa.Array:
        began = time.perf_counter()
        if before_call is not None:
            before_call(len(calls))
        time.sleep(0.03)
        values = pa.array([t.upper() for t in text.to_pylist()])
        calls.append(time.perf_counter() - began)
        return values
    return sleepy


def test_a_refreshs_figures_are_what_the_test_measured_even_when_it_lost_a_commit_race(db_uri):
    """rows_per_second, busy_fraction and wall_seconds against the test's own clock, for a refresh a
    concurrent writer made re-plan (its second attempt reuses its checkpoints in no time: its
    figures were once that attempt's alone, 16,000 rows/s and busy 0 for a 25 rows/s model)."""
    make_docs(db_uri, 1200)
    uri = uri_of(db_uri)
    calls: list[float] = []
    raced: list[int] = []

    def size(text: pa.Array) -> pa.Array:
        return pa.array([len(t) for t in text.to_pylist()], pa.int64())

    def race(call: int) -> None:  # another Function's refresh commits a rewrite of the same fragment
        if call == 10 and not raced:
            raced.append(refresh_column(uri, make_function(size, table="docs", column="size",
                                                           output_type=pa.int64())).version_after)

    function = make_function(_sleepy(calls, race), table="docs", column="shout", output_type=pa.string(),
                             batch_size=20, adapt_batch_size=False, checkpoint_seconds=0)
    began = time.perf_counter()
    result = refresh_column(uri, function)
    wall = time.perf_counter() - began
    assert raced and result.rows_computed == 1200 and result.version_after > raced[0]
    assert abs(result.wall_seconds - wall) <= 0.1 * wall
    assert abs(result.rows_per_second - 1200 / wall) <= 0.2 * (1200 / wall), (result.rows_per_second, 1200 / wall)
    assert abs(result.busy_fraction - sum(calls) / wall) <= 0.1, (result.busy_fraction, sum(calls) / wall)


def test_a_fanned_out_refreshs_figures_are_the_whole_refreshs_and_each_shards(db_uri):
    import dagster as dg

    from gpufn_dagster import build_definitions, gpu_function

    make_docs(db_uri, 4000)
    calls: list[float] = []
    asset = gpu_function(table="docs", column="shout", output_type=pa.string(), workers=2, batch_size=40,
                         adapt_batch_size=False, gpu_class="default", checkpoint_seconds=0)(_sleepy(calls))
    defs = build_definitions(assets=[asset], db_uri=db_uri)
    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize([asset], resources=defs.resources, instance=instance)
    assert result.success
    # The refresh's span by Dagster's own clock: the plan step's start to the commit step's end (the
    # shards run one after the other here, in-process).
    logs = {(e.step_key, e.dagster_event_type): e.timestamp for e in instance.all_logs(result.run_id)
            if e.is_dagster_event}
    wall = (logs[("docs__shout.docs__shout_commit", dg.DagsterEventType.STEP_SUCCESS)]
            - logs[("docs__shout.docs__shout_plan", dg.DagsterEventType.STEP_START)])
    (event,) = result.get_asset_materialization_events()
    meta = {k: v.value for k, v in event.materialization.metadata.items()}
    assert meta["rows_computed"] == 4000 and meta["workers"] == 2
    assert abs(meta["wall_seconds"] - wall) <= 0.1 * wall, (meta["wall_seconds"], wall)  # plan to commit, not the commit's
    assert abs(meta["rows_per_second"] - 4000 / wall) <= 0.2 * (4000 / wall), (meta["rows_per_second"], 4000 / wall)
    assert abs(meta["busy_fraction"] - sum(calls) / wall) <= 0.1, (meta["busy_fraction"], sum(calls) / wall)
    assert meta["first_values_seconds"] < 0.5 * wall
    # No GPU here: the shards computed on the CPU, and no GPU time is billed for them.
    assert meta["device"] == "cpu" and meta["gpu_seconds"] == 0.0 and "cost_usd" not in meta
    assert "no GPU was visible to the worker" in meta["gpu_billing"]
    rows = [r.data for r in meta["shards"].records]
    assert [r["rows_computed"] for r in rows] == [2000, 2000]  # each shard's rows, rate and busy share
    assert all(abs(r["busy_fraction"] - 1.0) <= 0.3 for r in rows), rows


def test_a_gpu_function_that_ran_on_the_cpu_says_so_and_bills_no_gpu_time(db_uri):
    make_docs(db_uri, 50)
    asset = gpu_function(table="docs", column="shout", output_type=pa.string(), gpu_class="default")(
        lambda_free_upper)
    found = metadata(run(db_uri, asset))
    assert found["device"] == "cpu"  # no GPU on this machine: the worker computed on its CPU
    assert found["gpu_seconds"] == 0.0 and "cost_usd" not in found  # the class has a price; nothing is billed
    assert found["gpu_billing"] == "no GPU was visible to the worker: it computed on the CPU, and no GPU time is billed"


def lambda_free_upper(text: pa.Array) -> pa.Array:
    return pa.array([t.upper() for t in text.to_pylist()])


def test_a_failing_row_is_named_by_its_stable_row_id_and_its_values_not_only_its_address(db_uri):
    make_docs(db_uri, 10)
    make_docs(db_uri, 10, start=10)  # a second fragment: its rows' addresses are 2**32 + offset

    def fragile(text: str) -> str:
        if text == "doc 15":
            raise ValueError("cannot shout")
        return text.upper()

    with pytest.raises(FunctionFailed) as err:
        refresh_column(uri_of(db_uri), make_function(fragile, table="docs", column="shout"))
    assert "failed on row id 15 (fragment 1, offset 5; text='doc 15'): ValueError('cannot shout')" in str(err.value)
    assert "4294967301" not in str(err.value)  # the physical address, which a user cannot look up
    asset = gpu_function(table="docs", column="shout2", on_error="skip")(fragile)
    run(db_uri, asset)
    (row,) = lancedb.connect(db_uri).open_table("gpufn_errors").to_arrow().to_pylist()
    assert (row["row_id"], row["row_address"]) == (15, 2**32 + 5)
