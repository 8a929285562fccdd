"""A table's Function files made one per fragment when asked (issue 41 item 3): once a fragment
holds more than `max_function_files` of them, the refresh that let go of its lease makes them one
file -- the same values and signatures, nothing recomputed, indexes kept -- and never while a
refresh of the table is in flight or when another writer changed the table meanwhile. On a local
directory and on the suite's object store; off by default, through Dagster's own materialize."""

from __future__ import annotations

import dagster as dg
import lance
import lancedb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from gpufn_dagster import build_definitions, gpu_function, make_function, refresh_column
from gpufn_dagster.assets.resources import STABLE_ROW_IDS
from gpufn_dagster.refresh import compaction
from gpufn_dagster.refresh.compaction import MAX_FUNCTION_FILES, compact_function_files
from gpufn_dagster.refresh.files import TableFiles
from gpufn_dagster.refresh.lease import ColumnLease
from tests.storages import STORAGES

ROWS, FRAGMENT_ROWS = 1000, 250


def adding(k: int):
    def plus(x: pa.Array) -> pa.Array:
        return pc.add(x, k)
    return plus


def table(db_uri: str) -> str:
    """Table `t` of ROWS rows in fragments of FRAGMENT_ROWS (one per add); its Lance URI."""
    def rows(start: int) -> pa.Table:
        return pa.table({"id": pa.array(np.arange(start, start + FRAGMENT_ROWS)),
                         "x": pa.array(np.arange(start, start + FRAGMENT_ROWS))})
    created = lancedb.connect(db_uri).create_table("t", rows(0), storage_options=STABLE_ROW_IDS)
    for start in range(FRAGMENT_ROWS, ROWS, FRAGMENT_ROWS):
        created.add(rows(start))
    return created.to_lance().uri


def functions(count: int) -> list:
    return [make_function(adding(k), table="t", column=f"y{k}", output_type=pa.int64()) for k in range(count)]


def files_per_fragment(uri: str) -> list[int]:
    return [len(f.data_files()) for f in lance.dataset(uri).get_fragments()]


def snapshot(uri: str) -> pa.Table:
    """Every column, signatures included, in row order."""
    return lance.dataset(uri).to_table().sort_by("id")


@pytest.mark.parametrize("db_uri", STORAGES, indirect=True)
def test_files_per_fragment_stay_bounded_with_the_same_values_and_nothing_recomputed(db_uri):
    uri = table(db_uri)
    fragments = len(lance.dataset(uri).get_fragments())
    assert fragments == ROWS // FRAGMENT_ROWS
    results = [refresh_column(uri, f, max_function_files=3) for f in functions(8)]
    # 1 base file + at most 3 Function files before a refresh compacts them into one
    assert [r.fragments_compacted for r in results] == [0, 0, 0, fragments, 0, 0, fragments, 0]
    assert files_per_fragment(uri) == [3] * fragments  # base, the 7 first Functions' file, y7's
    before = snapshot(uri)
    for k in range(8):
        assert before[f"y{k}"].to_pylist() == [x + k for x in range(ROWS)]
    assert [refresh_column(uri, f, max_function_files=3).rows_computed for f in functions(8)] == [0] * 8

    # A new version of one Function recomputes its column alone, in a file of its own beside the merged one.
    def times(x: pa.Array) -> pa.Array:
        return pc.multiply(x, 10)
    changed = refresh_column(uri, make_function(times, table="t", column="y2", output_type=pa.int64()),
                             max_function_files=3)
    assert changed.rows_computed == ROWS and changed.fragments_compacted == 0
    after = snapshot(uri)
    assert after["y2"].to_pylist() == [x * 10 for x in range(ROWS)]
    assert all(after[c].equals(before[c]) for c in before.column_names if c not in ("y2", "_gpufn_sig_y2"))


@pytest.mark.parametrize("db_uri", STORAGES, indirect=True)
def test_a_refresh_in_flight_or_a_concurrent_writer_leaves_the_files_as_they_are(db_uri, monkeypatch):
    uri = table(db_uri)
    for f in functions(4):
        refresh_column(uri, f, max_function_files=None)
    files = TableFiles(uri, None)
    piled = files_per_fragment(uri)
    with ColumnLease(files, "_gpufn_sig_y1", "a refresh in flight"):
        done = compact_function_files(files, max_files=2)
    assert done.fragments == 0 and "_gpufn_sig_y1" in done.skipped and files_per_fragment(uri) == piled

    written = []
    real = compaction._merged_file

    def meddling(*args, **kwargs):
        if not written:  # another writer deletes rows while the merged files are written
            lance.dataset(uri).delete("id < 5")
        written.append(real(*args, **kwargs))
        return written[-1]

    monkeypatch.setattr(compaction, "_merged_file", meddling)
    done = compact_function_files(files, max_files=2)
    assert done.fragments == 0 and "another writer" in done.skipped
    assert files_per_fragment(uri) == piled and lance.dataset(uri).count_rows() == ROWS - 5
    assert not any(files.exists(f"data/{w.path}") for w in written)  # its uncommitted files are gone
    monkeypatch.setattr(compaction, "_merged_file", real)
    assert compact_function_files(files, max_files=2).fragments == len(piled)  # the next try compacts
    assert lance.dataset(uri).count_rows() == ROWS - 5
    assert snapshot(uri)["y3"].to_pylist() == [x + 3 for x in range(5, ROWS)]


def test_an_indexed_function_column_keeps_its_file_and_its_index(tmp_path):
    uri = table(str(tmp_path / "db"))
    for f in functions(4):
        refresh_column(uri, f, max_function_files=None)
    lance.dataset(uri).create_scalar_index("y1", "BTREE")
    assert compact_function_files(TableFiles(uri), max_files=2).fragments == ROWS // FRAGMENT_ROWS
    dataset = lance.dataset(uri)
    (index,) = dataset.describe_indices()
    assert index.num_rows_indexed == ROWS  # every fragment still covered
    assert files_per_fragment(uri) == [3] * (ROWS // FRAGMENT_ROWS)  # base, y1's own, the other three's
    assert "ScalarIndexQuery" in dataset.scanner(filter="y1 = 11", columns=["id"]).explain_plan()


def test_materializing_many_functions_leaves_their_files_as_they_are_by_default(tmp_path):
    """Compaction is opt-in (`RefreshOptions.max_function_files`): a Dagster run of more Functions
    than its bound writes one file per Function and fragment and reports no compaction."""
    db_uri = str(tmp_path / "db")
    table(db_uri)
    count = MAX_FUNCTION_FILES + 1
    assets = [gpu_function(table="t", column=f"y{k}", output_type=pa.int64())(adding(k)) for k in range(count)]
    defs = build_definitions(assets=assets, db_uri=db_uri)
    result = dg.materialize(list(defs.assets), resources=defs.resources, instance=dg.DagsterInstance.ephemeral())
    assert not any("fragments_compacted" in e.materialization.metadata for e in result.get_asset_materialization_events())
    uri = lancedb.connect(db_uri).open_table("t").to_lance().uri
    assert files_per_fragment(uri) == [1 + count] * (ROWS // FRAGMENT_ROWS)
    assert compact_function_files(TableFiles(uri)).fragments == ROWS // FRAGMENT_ROWS  # at the bound, when asked
    values = snapshot(uri)
    assert all(values[f"y{k}"].to_pylist() == [x + k for x in range(ROWS)] for k in range(count))
