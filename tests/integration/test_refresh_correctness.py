"""What acceptance testing found wrong in the refresh, on real Lance tables and real Dagster runs:
list inputs whose elements change, inputs of every type Lance stores, the live row count, failed
rows retried, compaction keeping the vector index, chained Functions, two runs of one Function at
once, and a version that covers the code a Function calls."""

from __future__ import annotations

import datetime
import decimal
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import dagster as dg
import lance
import lancedb
import numpy as np
import pyarrow as pa
import pytest
from lancedb.index import IvfFlat

from gpufn_dagster import build_definitions, gpu_function, make_function, refresh_column
from gpufn_dagster.assets.reporting import ERRORS_TABLE
from gpufn_dagster.errors import UpstreamNotCurrent
from gpufn_dagster.refresh.files import TableFiles
from gpufn_dagster.assets.resources import STABLE_ROW_IDS
from tests.storages import STORAGES

CALLS: list[object] = []


@pytest.fixture(autouse=True)
def _reset_calls():
    CALLS.clear()


def create(db_uri: str, table: pa.Table, name: str = "t"):
    return lancedb.connect(db_uri).create_table(name, table, storage_options=STABLE_ROW_IDS)


def materialize(db_uri: str, *assets, instance=None) -> dg.ExecuteInProcessResult:
    defs = build_definitions(assets=list(assets), db_uri=db_uri)
    return dg.materialize(list(defs.assets), resources=defs.resources,
                          instance=instance or dg.DagsterInstance.ephemeral(), raise_on_error=False)


def metadata(result: dg.ExecuteInProcessResult, key: str) -> dict[str, object]:
    events = [e for e in result.get_asset_materialization_events() if e.asset_key.to_user_string() == key]
    return {k: v.value for k, v in events[-1].materialization.metadata.items()}


def column(db_uri: str, name: str, table: str = "t") -> dict[int, object]:
    data = lancedb.connect(db_uri).open_table(table).to_lance().to_table(columns=["id", name]).to_pydict()
    return dict(zip(data["id"], data[name], strict=True))


def describe(value: object) -> str:
    CALLS.append(value)
    return json.dumps(value, default=str)


# 1. List inputs whose elements change ---------------------------------------------------------

LIST_CHANGES = [
    (pa.list_(pa.string()), ["Hello, world"], ["Hello", " world"]),
    (pa.list_(pa.string()), ["p", None], ["p"]),
    (pa.list_(pa.float64()), [1.0, None], [1.0]),
    (pa.list_(pa.list_(pa.int64())), [[1, 2], [3]], [[1], [2, 3]]),
]


@pytest.mark.parametrize(("data_type", "before", "after"), LIST_CHANGES, ids=lambda v: str(v))
def test_a_list_input_whose_elements_change_is_recomputed(db_uri, data_type, before, after):
    rows = 20
    create(db_uri, pa.table({"id": list(range(rows)), "v": pa.array([before] * rows, data_type)}))
    asset = gpu_function(table="t", column="d", output_type=pa.string())(lambda_free_describe("v"))
    assert materialize(db_uri, asset).success and len(CALLS) == rows
    lancedb.connect(db_uri).open_table("t").merge_insert("id").when_matched_update_all().execute(
        pa.table({"id": [5], "v": pa.array([after], data_type)}))
    CALLS.clear()
    result = materialize(db_uri, asset)
    assert CALLS == [after]
    assert metadata(result, "t__d")["rows_computed"] == 1
    assert column(db_uri, "d")[5] == json.dumps(after)


def lambda_free_describe(name: str):
    """A row Function of one input called `name` (Functions take inputs by parameter name)."""
    namespace: dict[str, object] = {"describe": describe}
    exec(f"def describe_{name}({name}):\n    return describe({name})\n", namespace)
    return namespace[f"describe_{name}"]


# 2. Every Arrow type Lance stores works as an input ------------------------------------------

EVERY_TYPE = {
    "d32": (pa.date32(), lambda i: datetime.date(2026, 1, 1) + datetime.timedelta(days=i)),
    "d64": (pa.date64(), lambda i: datetime.date(2026, 1, 1) + datetime.timedelta(days=i)),
    "dec": (pa.decimal128(12, 3), lambda i: decimal.Decimal(i) / 8),
    "dec256": (pa.decimal256(50, 2), lambda i: decimal.Decimal(i) / 4),
    "t32": (pa.time32("s"), lambda i: datetime.time(0, 0, i % 60)),
    "ts": (pa.timestamp("us", tz="UTC"), lambda i: datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
           + datetime.timedelta(seconds=i)),
    "dur": (pa.duration("ms"), lambda i: datetime.timedelta(milliseconds=i)),
    "f16": (pa.float16(), lambda i: np.float16(i / 2)),
    "fsb": (pa.binary(2), lambda i: bytes([i % 256, 7])),
    "bits": (pa.bool_(), lambda i: i % 2 == 0),
    "tags": (pa.map_(pa.string(), pa.int64()), lambda i: [("k", i)]),
    "pair": (pa.struct([("a", pa.int64()), ("b", pa.string())]), lambda i: {"a": i, "b": f"x{i}"}),
    "vec": (pa.list_(pa.float32(), 2), lambda i: [float(i), None if i % 3 == 0 else 1.0]),
    "words": (pa.large_list(pa.large_string()), lambda i: [f"w{i}", ""]),
    "lang": (pa.dictionary(pa.int32(), pa.string()), lambda i: ["en", "de"][i % 2]),
}


def every_type_function(d32, d64, dec, dec256, t32, ts, dur, f16, fsb, bits, tags, pair, vec, words, lang) -> str:
    CALLS.append(d32)
    return f"{d32}|{dec}|{pair}|{lang}"


def test_every_type_lance_stores_works_as_an_input(db_uri):
    rows = 12
    columns = {"id": pa.array(range(rows), pa.int64())}
    for name, (data_type, make) in EVERY_TYPE.items():
        columns[name] = pa.array([make(i) for i in range(rows)], data_type)
    create(db_uri, pa.table(columns))
    asset = gpu_function(table="t", column="out")(every_type_function)
    first = materialize(db_uri, asset)
    assert first.success, first.get_step_failure_events()
    assert len(CALLS) == rows and column(db_uri, "out")[3] == "2026-01-04|0.375|{'a': 3, 'b': 'x3'}|de"

    table = lancedb.connect(db_uri).open_table("t")
    for index, (name, (data_type, make)) in enumerate(EVERY_TYPE.items()):  # one input of one row each
        row = table.to_lance().to_table(filter=f"id = {index % rows}").to_pylist()[0]
        row[name] = pa.array([make(index + 101)], data_type)[0].as_py()
        table.merge_insert("id").when_matched_update_all().execute(pa.Table.from_pylist([row], schema=table.schema))
    CALLS.clear()
    second = materialize(db_uri, asset)
    assert second.success
    assert metadata(second, "t__out")["rows_computed"] == rows  # 15 inputs changed, one per row, over all 12 rows
    CALLS.clear()
    table.merge_insert("id").when_matched_update_all().execute(
        pa.Table.from_pylist([{**table.to_lance().to_table(filter="id = 4").to_pylist()[0],
                               "dec": decimal.Decimal("9.125")}], schema=table.schema))
    third = materialize(db_uri, asset)
    assert len(CALLS) == 1 and metadata(third, "t__out")["rows_computed"] == 1


# 3. dagster/row_count is the table's live row count ------------------------------------------

def shout(text: str) -> str:
    CALLS.append(text)
    return text.upper()


def docs(n: int, start: int = 0) -> pa.Table:
    return pa.table({"id": list(range(start, start + n)), "text": [f"doc {i}" for i in range(start, start + n)]})


def test_row_count_is_the_live_row_count_of_the_table(db_uri):
    create(db_uri, docs(300), "docs")
    asset = gpu_function(table="docs", column="shout")(shout)
    assert metadata(materialize(db_uri, asset), "docs__shout")["dagster/row_count"] == 300
    assert metadata(materialize(db_uri, asset), "docs__shout")["dagster/row_count"] == 300  # a no-op refresh
    lancedb.connect(db_uri).open_table("docs").add(docs(5, start=300))
    after_append = metadata(materialize(db_uri, asset), "docs__shout")
    assert after_append["rows_computed"] == 5 and after_append["dagster/row_count"] == 305
    lancedb.connect(db_uri).open_table("docs").delete("id < 10")
    assert metadata(materialize(db_uri, asset), "docs__shout")["dagster/row_count"] == 295


# 5. Failed rows are retried -------------------------------------------------------------------

BROKEN = {"on": True}


def fragile(text: str) -> str:
    CALLS.append(text)
    if BROKEN["on"] and text.endswith("3"):
        raise ValueError(f"cannot handle {text!r}")
    return text.upper()


def test_failed_rows_stay_stale_and_are_retried_by_the_next_refresh(db_uri):
    create(db_uri, docs(40), "docs")
    BROKEN["on"] = True
    asset = gpu_function(table="docs", column="shout", on_error="skip", batch_size=16)(fragile)
    first = materialize(db_uri, asset)
    assert metadata(first, "docs__shout")["rows_failed"] == 4  # doc 3, 13, 23, 33
    CALLS.clear()
    again = materialize(db_uri, asset)  # still broken: only the failed rows are tried again
    assert sorted(CALLS) == ["doc 13", "doc 23", "doc 3", "doc 33"]
    assert metadata(again, "docs__shout")["rows_failed"] == 4
    assert metadata(again, "docs__shout")["fragments_rewritten"] == 0  # nothing changed, nothing rewritten

    BROKEN["on"] = False  # fixed outside its code: the version stays, only the failed rows are stale
    CALLS.clear()
    fixed = materialize(db_uri, asset)
    assert sorted(CALLS) == ["doc 13", "doc 23", "doc 3", "doc 33"]
    meta = metadata(fixed, "docs__shout")
    assert meta["rows_failed"] == 0 and meta["rows_retried_ok"] == 4
    assert column(db_uri, "shout", "docs")[13] == "DOC 13"
    CALLS.clear()
    materialize(db_uri, asset)
    assert CALLS == []

    errors = lancedb.connect(db_uri).open_table(ERRORS_TABLE).to_arrow().to_pylist()
    by_run = sorted((e["retried"], e["outcome"]) for e in errors)
    assert by_run == [(False, "failed")] * 4 + [(True, "failed")] * 4 + [(True, "succeeded")] * 4


# 6. Compaction does not cost the vector index -------------------------------------------------

def embed(text: str) -> list:
    CALLS.append(text)
    rng = np.random.default_rng(abs(hash(text)) % 2**32)
    return rng.random(8).astype(np.float32).tolist()


def test_a_compacted_table_keeps_its_function_columns_and_their_index(db_uri):
    create(db_uri, docs(300), "docs")
    table = lancedb.connect(db_uri).open_table("docs")
    for start in range(300, 1000, 100):
        table.add(docs(100, start=start))
    asset = gpu_function(table="docs", column="vec", output_type=pa.list_(pa.float32(), 8))(embed)
    assert materialize(db_uri, asset).success and len(CALLS) == 1000
    table = lancedb.connect(db_uri).open_table("docs")
    table.create_index("vec", config=IvfFlat(num_partitions=2))
    table.optimize()  # compacts the 8 fragments into one file each holding every column
    assert len(table.to_lance().get_fragments()) == 1
    stats = table.index_stats("vec_idx")
    assert stats.num_indexed_rows == 1000 and stats.num_unindexed_rows == 0
    version = table.version

    CALLS.clear()
    meta = metadata(materialize(db_uri, asset), "docs__vec")
    assert CALLS == [] and meta["rows_computed"] == 0 and meta["fragments_rewritten"] == 0
    table = lancedb.connect(db_uri).open_table("docs")
    assert table.version == version
    stats = table.index_stats("vec_idx")
    assert stats.num_indexed_rows == 1000 and stats.num_unindexed_rows == 0
    # Found current once, the compacted fragment is not even read again.
    assert metadata(materialize(db_uri, asset), "docs__vec")["fragments_visited"] == "0/1"


# 7. Chained Functions -------------------------------------------------------------------------

def first_word(text: str) -> str:
    CALLS.append(("first", text))
    return text.split()[0]


def word_length(word: str) -> int:
    CALLS.append(("length", word))
    return len(word)


def test_a_function_reading_another_functions_column_runs_after_it(db_uri):
    create(db_uri, docs(30), "docs")
    upstream = gpu_function(table="docs", column="word")(first_word)
    downstream = gpu_function(table="docs", column="word_len")(word_length)
    # Definitions load although `word` does not exist yet, and the lineage has the edge.
    defs = build_definitions(assets=[downstream, upstream], db_uri=db_uri)
    graph = defs.resolve_asset_graph()
    assert dg.AssetKey("docs__word") in graph.get(dg.AssetKey("docs__word_len")).parent_keys

    # Materialize all: upstream first, then downstream, in one run.
    result = dg.materialize(list(defs.assets), resources=defs.resources, instance=dg.DagsterInstance.ephemeral())
    assert [c[0] for c in CALLS] == ["first"] * 30 + ["length"] * 30
    assert column(db_uri, "word_len", "docs")[7] == 3 and result.success

    # Upstream stale for some rows: downstream alone refuses, naming it, and computes nothing.
    lancedb.connect(db_uri).open_table("docs").update(where="id < 4", values={"text": "changed text"})
    CALLS.clear()
    (downstream_def,) = [a for a in defs.assets if a.key == dg.AssetKey("docs__word_len")]
    alone = dg.materialize([downstream_def], resources=defs.resources, instance=dg.DagsterInstance.ephemeral(),
                           raise_on_error=False)
    assert not alone.success and CALLS == []
    error = alone.get_step_failure_events()[0].step_failure_data.error
    message = error.cause.message if error.cause else error.message
    assert "docs__word" in message and "not current for 4 of 30 rows" in message and "materialize" in message

    # In order, only the changed rows recompute, downstream too.
    CALLS.clear()
    dg.materialize(list(defs.assets), resources=defs.resources, instance=dg.DagsterInstance.ephemeral())
    assert sorted(CALLS) == [("first", "changed text")] * 4 + [("length", "changed")] * 4
    assert column(db_uri, "word_len", "docs")[2] == 7


def test_a_run_of_chained_functions_computes_the_one_read_first_whatever_their_names(db_uri):
    """The Function read is a step the reader's step waits for, in the job Dagster builds (a run of
    both from the CLI or the UI): here the reader's name sorts first, so a run that ordered them by
    name alone, or started both at once, fails it."""
    create(db_uri, docs(12), "docs")
    upstream = gpu_function(table="docs", column="z_word")(first_word)

    def a_len(z_word: str) -> int:
        CALLS.append(("length", z_word))
        return len(z_word)

    reader = gpu_function(table="docs", column="a_len")(a_len)
    defs = build_definitions(assets=[reader, upstream], db_uri=db_uri)
    job = defs.resolve_implicit_global_asset_job_def()
    assert "docs__z_word" in {d.node for d in job.graph.dependencies[dg.NodeInvocation("docs__a_len")].values()}
    result = dg.materialize(list(defs.assets), resources=defs.resources, instance=dg.DagsterInstance.ephemeral(),
                            raise_on_error=False)
    assert result.success
    assert [c[0] for c in CALLS] == ["first"] * 12 + ["length"] * 12
    assert column(db_uri, "a_len", "docs")[7] == len(column(db_uri, "z_word", "docs")[7])


def test_refresh_column_refuses_an_upstream_column_never_computed(tmp_path):
    uri = str(tmp_path / "docs.lance")
    lance.write_dataset(docs(10), uri)
    upstream = make_function(first_word, table="docs", column="word")
    downstream = make_function(word_length, table="docs", column="word_len")
    with pytest.raises(UpstreamNotCurrent, match="docs__word"):
        refresh_column(uri, downstream, upstream=[upstream])
    assert "word_len" not in lance.dataset(uri).schema.names  # nothing was declared or computed


# 8. Two runs of one Function at once ----------------------------------------------------------

CONCURRENT = textwrap.dedent("""
    import os, sys, time
    from gpufn_dagster import make_function, refresh_column
    uri, log, name, waiting = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    def slow(text: str) -> str:
        with open(log, "a") as f:
            f.write(text + "\\n")
        deadline = time.monotonic() + 120
        while text == "doc 150" and not os.path.exists(waiting) and time.monotonic() < deadline:
            time.sleep(0.05)  # the first run holds on until the second one is seen waiting
        return text.upper()
    def on_wait(line):
        print("WAIT", line, flush=True)
        open(waiting, "w").close()
    fn = make_function(slow, table="docs", column="shout", batch_size=20, version="v1")
    result = refresh_column(uri, fn, holder=name, on_wait=on_wait, concurrency=1)
    print("COMPUTED", result.rows_computed, flush=True)
""")


@pytest.mark.parametrize("db_uri", STORAGES, indirect=True)
def test_two_refreshes_of_one_function_at_once_compute_each_row_once(db_uri, tmp_path: Path):
    create(db_uri, docs(200), "docs")
    uri = lancedb.connect(db_uri).open_table("docs").to_lance().uri
    script, log, waiting = tmp_path / "refresh.py", tmp_path / "calls.log", tmp_path / "second-waits"
    script.write_text(CONCURRENT)
    args = [str(log), "run-A", str(waiting)]
    first = subprocess.Popen([sys.executable, str(script), uri, *args], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (log.exists() and log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)  # the first run holds the lease once it computes
    args[1] = "run-B"
    second = subprocess.Popen([sys.executable, str(script), uri, *args], stdout=subprocess.PIPE, text=True)
    out_first, _ = first.communicate(timeout=300)
    out_second, _ = second.communicate(timeout=300)
    assert first.returncode == 0 and second.returncode == 0
    assert sorted(log.read_text().splitlines()) == sorted(f"doc {i}" for i in range(200))  # each row once
    assert "COMPUTED 200" in out_first and "COMPUTED 0" in out_second
    assert "WAIT waiting for the refresh of this column by run-A" in out_second


@pytest.mark.parametrize("db_uri", STORAGES, indirect=True)
def test_a_lease_left_by_a_killed_run_expires(db_uri, tmp_path: Path):
    create(db_uri, docs(50), "docs")
    uri = lancedb.connect(db_uri).open_table("docs").to_lance().uri
    files, lease = TableFiles(uri), "_gpufn/leases/_gpufn_sig_shout/000000000007.json"
    # Held by a worker on another node that was killed: nobody renews it.
    files.write(lease, json.dumps({"holder": "run dead", "token": "x", "host": "node-gone", "pid": 1,
                                   "renewed_at": time.time(), "expires_at": time.time() + 3}).encode())
    lines: list[str] = []
    started = time.monotonic()
    result = refresh_column(uri, make_function(shout, table="docs", column="shout"), on_wait=lines.append)
    assert result.rows_computed == 50 and 2 <= time.monotonic() - started < 60
    assert any("waiting for the refresh of this column by run dead" in line for line in lines)
    assert any("void: it expired" in line for line in lines)
    assert files.names("_gpufn/leases/_gpufn_sig_shout") == []  # taken over, then released at the end


def test_a_lease_of_a_killed_process_on_this_host_is_taken_at_once(db_uri, tmp_path: Path):
    create(db_uri, docs(20), "docs")
    uri = lancedb.connect(db_uri).open_table("docs").to_lance().uri
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    os.kill(sleeper.pid, signal.SIGKILL)
    sleeper.wait()
    TableFiles(uri).write("_gpufn/leases/_gpufn_sig_shout/000000000001.json", json.dumps(
        {"holder": "run killed", "token": "x", "host": os.uname().nodename, "pid": sleeper.pid,
         "renewed_at": time.time(), "expires_at": time.time() + 600}).encode())
    lines: list[str] = []
    result = refresh_column(uri, make_function(shout, table="docs", column="shout"), on_wait=lines.append)
    assert result.rows_computed == 20 and any("its process is gone" in line for line in lines)


# 8b. Different Functions and a user's append, all at once, on either storage ------------------

RACING = textwrap.dedent("""
    import os, sys, time
    from gpufn_dagster import make_function, refresh_column
    uri, column, started, go = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    def compute(text: str) -> str:
        with open(started, "a") as log:
            log.write(text + "\\n")
        deadline = time.monotonic() + 120
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.02)  # computing while the other refresh and the user's appends go on
        return f"{column}:{text}"
    fn = make_function(compute, table="docs", column=column, batch_size=50, version="v1")
    result = refresh_column(uri, fn, concurrency=2)
    print("COMPUTED", result.rows_computed, "VERSION", result.version_after, flush=True)
""")


@pytest.mark.parametrize("db_uri", STORAGES, indirect=True)
def test_two_functions_and_an_append_at_once_lose_nothing(db_uri, tmp_path: Path):
    """Lance commits race on the table's storage (conditional writes on S3): two refreshes of
    different Functions and a user's appends all land, and nothing computed is lost."""
    table = create(db_uri, docs(200), "docs")
    table.add(docs(200, start=200))  # two fragments
    uri = table.to_lance().uri
    script, go = tmp_path / "race.py", tmp_path / "go"
    script.write_text(RACING)
    started = {column: tmp_path / f"{column}-started" for column in ("left", "right")}
    refreshes = {column: subprocess.Popen([sys.executable, str(script), uri, column, str(started[column]), str(go)],
                                          stdout=subprocess.PIPE, text=True) for column in started}
    deadline = time.monotonic() + 120
    while not all(path.exists() for path in started.values()) and time.monotonic() < deadline:
        time.sleep(0.05)  # both refreshes planned and are computing
    for start in range(1000, 1100, 20):
        lancedb.connect(db_uri).open_table("docs").add(docs(20, start=start))  # five commits meanwhile
    go.touch()
    outputs = {column: process.communicate(timeout=300)[0] for column, process in refreshes.items()}
    assert all(process.returncode == 0 for process in refreshes.values()), outputs

    rows = lance.dataset(uri).to_table(columns=["id", "text", "left", "right"]).to_pylist()
    assert sorted(r["id"] for r in rows) == [*range(400), *range(1000, 1100)]  # every appended row kept
    for column, path in started.items():
        calls = path.read_text().splitlines()
        assert len(calls) == len(set(calls)), f"{column}: a row was computed twice"
        # A refresh whose commit raced a schema change re-plans and may fill appended rows too; every
        # value it computed landed, and every row it did not compute is NULL (filled next time).
        assert {r["text"] for r in rows if r[column] is not None} == set(calls)
        assert all(r[column] == f"{column}:{r['text']}" for r in rows if r[column] is not None)
        assert all(r[column] is not None for r in rows if r["id"] < 1000)
    messages = [(t.transaction_properties or {}).get("__lance_commit_message", "")
                for t in TableFiles(uri).dataset().get_transactions() if t is not None]
    # Each refresh committed its column once, over every fragment it computed.
    assert sum("gpufn refresh docs__left " in m for m in messages) == 1
    assert sum("gpufn refresh docs__right " in m for m in messages) == 1


# 8c. A long refresh publishes finished fragments as it goes ---------------------------------------

@pytest.mark.parametrize("db_uri", STORAGES, indirect=True)
def test_publish_every_rows_shows_finished_fragments_before_the_refresh_ends(db_uri):
    table = create(db_uri, docs(100), "docs")
    for start in range(100, 400, 100):
        table.add(docs(100, start=start))  # four fragments, refreshed in order (concurrency 1)
    uri = table.to_lance().uri
    seen: dict[str, int] = {}

    def shout(text: str) -> str:
        if text == "doc 300":  # the last fragment starts: what does a reader see now?
            seen["filled"] = lance.dataset(uri).count_rows("shout IS NOT NULL")
        return text.upper()

    function = make_function(shout, table="docs", column="shout", publish_every_rows=150)
    result = refresh_column(uri, function, concurrency=1)
    assert seen["filled"] == 200  # fragments 0 and 1 were published while fragment 3 was computing
    assert result.rows_computed == 400 and result.versions_published == 2
    kinds = [type(t.operation).__name__ for t in TableFiles(uri).dataset().get_transactions() if t is not None]
    assert kinds.count("DataReplacement") == 2, kinds  # two intermediate commits, nothing left for a final one
    assert lance.dataset(uri).count_rows("shout IS NULL") == 0
    assert refresh_column(uri, function, concurrency=1).rows_computed == 0


# 9. The version covers the code a Function calls ----------------------------------------------





# Files a killed refresh left behind -------------------------------------------------------------

KILLED = textwrap.dedent("""
    import sys, time
    from gpufn_dagster import make_function, refresh_column
    uri, log = sys.argv[1], sys.argv[2]
    def slow(text: str) -> str:
        with open(log, "a") as f:
            f.write(text + "\\n")
        time.sleep(0.005)
        return text.upper()
    fn = make_function(slow, table="docs", column="shout", batch_size=25, version="v1", checkpoint_seconds=0)
    refresh_column(uri, fn, concurrency=1)
""")


@pytest.mark.parametrize("db_uri", STORAGES, indirect=True)
def test_files_a_killed_refresh_wrote_are_removed_by_the_next_one(db_uri, tmp_path: Path):
    table = create(db_uri, docs(100), "docs")
    for start in range(100, 400, 100):
        table.add(docs(100, start=start))  # four fragments, refreshed one after the other
    uri = table.to_lance().uri
    script, log = tmp_path / "refresh.py", tmp_path / "calls.log"
    script.write_text(KILLED)
    process = subprocess.Popen([sys.executable, str(script), uri, str(log)])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not log.exists() or len(log.read_text().splitlines()) < 230):
        time.sleep(0.01)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    files = TableFiles(uri)
    written_before = {name for name in files.names("data") if name.startswith("gpufn-")}
    assert len(written_before) >= 2  # the two fragments it finished
    lancedb.connect(db_uri).open_table("docs").delete("id = 5")  # fragment 0 changed: its file is now useless
    subprocess.run([sys.executable, str(script), uri, str(log)], check=True)

    dataset = files.dataset()
    referenced = {f.path for v in dataset.versions() for fragment in files.dataset(v["version"]).get_fragments()
                  for f in fragment.metadata.files}
    left = {name for name in files.names("data") if not name.startswith(".tmp")} - referenced
    assert left == set(), left
    assert dataset.count_rows("shout IS NULL") == 0 and dataset.count_rows() == 399
    assert files.names("_gpufn/written") == []
