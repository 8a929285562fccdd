"""Materialized views refresh incrementally when materialized, and Function columns on a view refresh
after it like on any table: only rows new to the view are computed."""

from __future__ import annotations

import dagster as dg
import lancedb
import pyarrow as pa
import pytest

from gpufn_dagster import TableNotFound, build_definitions, gpu_function, materialized_view_asset
from gpufn_dagster.assets.resources import STABLE_ROW_IDS
from tests.storages import STORAGES

CALLS: list[str] = []


def excited(text: str) -> str:
    CALLS.append(text)
    return text + "!"


def add_rows(db_uri: str, start: int, rows: int) -> None:
    data = pa.table({"id": list(range(start, start + rows)), "text": [f"t{i}" for i in range(start, start + rows)],
                     "lang": ["en" if i % 2 == 0 else "fr" for i in range(start, start + rows)]})
    db = lancedb.connect(db_uri)
    if "src" in db.list_tables().tables:
        db.open_table("src").add(data)
    else:
        db.create_table("src", data, storage_options=STABLE_ROW_IDS)


def materialize(db_uri: str, assets: list) -> list[dict]:
    defs = build_definitions(assets=assets, db_uri=db_uri)
    result = dg.materialize(assets, resources=defs.resources, instance=dg.DagsterInstance.ephemeral())
    return [{k: v.value for k, v in e.materialization.metadata.items()} for e in result.get_asset_materialization_events()]


def test_view_refreshes_incrementally(db_uri):
    add_rows(db_uri, 0, 100)
    view = materialized_view_asset("src_fr", source="src", select=["id", "text"], where="lang = 'fr'")
    (meta,) = materialize(db_uri, [view])
    assert meta["dagster/row_count"] == 50
    assert (meta["refresh_mode"], meta["rows_written"]) == ("create", 50)  # the first build wrote them all
    add_rows(db_uri, 100, 10)
    lancedb.connect(db_uri).open_table("src").delete("id = 1")
    (meta,) = materialize(db_uri, [view])
    assert meta["refresh_mode"] == "incremental" and meta["rows_written"] == 5
    assert meta["dagster/row_count"] == 54


@pytest.mark.parametrize("db_uri", STORAGES, indirect=True)
def test_function_on_view_computes_only_rows_new_to_the_view(db_uri):
    CALLS.clear()  # run once per storage: each run counts its own calls
    add_rows(db_uri, 0, 100)
    view = materialized_view_asset("src_en", source="src", select=["id", "text"], where="lang = 'en'")
    fn = gpu_function(table="src_en", column="loud", source_asset="src_en")(excited)

    view_meta, fn_meta = materialize(db_uri, [view, fn])
    assert view_meta["dagster/row_count"] == 50
    assert fn_meta["rows_computed"] == 50 and len(CALLS) == 50

    add_rows(db_uri, 100, 10)
    lancedb.connect(db_uri).open_table("src").update(where="id = 2", values={"text": "two"})
    CALLS.clear()
    view_meta, fn_meta = materialize(db_uri, [view, fn])
    # lancedb rebuilds a view that another writer (the Function) touched; the values survive it.
    assert view_meta["function_rows_kept"] == 50
    assert sorted(CALLS) == ["t100", "t102", "t104", "t106", "t108", "two"]
    table = lancedb.connect(db_uri).open_table("src_en").to_arrow()
    assert table.num_rows == 55 and None not in table.column("loud").to_pylist()


def test_view_over_missing_source_says_so(db_uri):
    view = materialized_view_asset("nothing_en", source="nothing")
    defs = build_definitions(assets=[view], db_uri=db_uri)
    result = dg.materialize([view], resources=defs.resources, raise_on_error=False)
    error = result.get_step_failure_events()[0].step_failure_data.error.cause
    assert error.cls_name == TableNotFound.__name__ and "source table 'nothing' does not exist" in error.message
