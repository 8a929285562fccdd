"""The tables' schemas a code location's definitions are checked against (`assets.table_schemas`):
each distinct table read once where the location is defined, however many Functions compute on it;
nothing read where it is reconstructed from what was kept; a table created since is read then; with a
schemas state file (`gpufn refresh-state`), nothing read where it is defined either, and what the
snapshot finds wrong judged on the tables themselves."""

from __future__ import annotations

import shutil

import lancedb
import pyarrow as pa
import pytest
from dagster._core.definitions.definitions_load_context import DefinitionsLoadContext, DefinitionsLoadType
from dagster._core.definitions.repository_definition import RepositoryLoadData

from gpufn_dagster import build_definitions, gpu_function
from gpufn_dagster.assets.table_schemas import decode, read_state, refreshing, state_key, write_state


def upper(text: str) -> str:
    return text.upper()


@pytest.fixture
def opens(monkeypatch):
    """Every table opened, by name, while the test runs."""
    opened: list[str] = []
    real = lancedb.db.LanceDBConnection.open_table

    def counting(self, name, *args, **kwargs):
        opened.append(name)
        return real(self, name, *args, **kwargs)

    monkeypatch.setattr(lancedb.db.LanceDBConnection, "open_table", counting)
    return opened


def fifty(db_uri: str):
    return build_definitions(assets=[gpu_function(table="docs", column=f"c{i}")(upper) for i in range(50)], db_uri=db_uri)


def test_fifty_functions_on_one_table_read_it_once_and_a_reconstruction_reads_nothing(tmp_path, opens):
    db_uri = str(tmp_path / "db")
    lancedb.connect(db_uri).create_table("docs", pa.table({"id": [1], "text": ["a"]}))
    defining = DefinitionsLoadContext(DefinitionsLoadType.INITIALIZATION)
    with DefinitionsLoadContext.scoped(defining):
        fifty(db_uri)
    assert opens == ["docs"]
    kept = defining.get_pending_reconstruction_metadata()
    assert decode(kept[state_key(db_uri)])["docs"].names == ["id", "text"]

    opens.clear()
    with DefinitionsLoadContext.scoped(DefinitionsLoadContext(
            DefinitionsLoadType.RECONSTRUCTION, RepositoryLoadData(cacheable_asset_data={}, reconstruction_metadata=kept))):
        fifty(db_uri)
    assert opens == []

    # What was kept still checks: a column the kept schema lacks fails the reconstruction as the definition.
    with DefinitionsLoadContext.scoped(DefinitionsLoadContext(
            DefinitionsLoadType.RECONSTRUCTION, RepositoryLoadData(cacheable_asset_data={}, reconstruction_metadata=kept))):
        with pytest.raises(Exception, match="field 'inputs'.*'title'"):
            build_definitions(assets=[gpu_function(table="docs", column="t", inputs=["title"])(upper)], db_uri=db_uri)
    assert opens == []


def test_a_reconstruction_reads_a_table_the_definer_did_not(tmp_path, opens):
    db_uri = str(tmp_path / "db")
    kept = {state_key(db_uri): '{"docs": null}'}  # the code server found no table `docs` (an asset makes it)
    lancedb.connect(db_uri).create_table("notes", pa.table({"id": [1], "text": ["a"]}))
    with DefinitionsLoadContext.scoped(DefinitionsLoadContext(
            DefinitionsLoadType.RECONSTRUCTION, RepositoryLoadData(cacheable_asset_data={}, reconstruction_metadata=kept))):
        build_definitions(assets=[gpu_function(table="notes", column="n")(upper)], db_uri=db_uri)
    assert opens == ["notes"]


def with_state(db_uri: str, state, *columns: str, udf=upper):
    return build_definitions(assets=[gpu_function(table="docs", column=c)(udf) for c in columns],
                             db_uri=db_uri, schemas_state=state)


def titled(title: str) -> str:
    return title.title()


def mistyped(titel: str) -> str:
    return titel


def test_a_definer_given_a_state_file_opens_no_table_and_keeps_the_files_schemas_for_its_runs(tmp_path, opens):
    db_uri, state = str(tmp_path / "db"), tmp_path / "state" / "schemas.json"
    lancedb.connect(db_uri).create_table("docs", pa.table({"id": [1], "text": ["a"]}))
    with refreshing() as written:  # what `gpufn refresh-state` does
        with_state(db_uri, state, "a")
    assert written == [(state, db_uri, ["docs"])] and opens == ["docs"]
    opens.clear()
    shutil.rmtree(db_uri)  # no table to open, nor a database: the load must not need one
    defining = DefinitionsLoadContext(DefinitionsLoadType.INITIALIZATION)
    with DefinitionsLoadContext.scoped(defining):
        with_state(db_uri, state, *(f"c{i}" for i in range(50)))
    assert opens == [] and not (tmp_path / "db").exists()
    assert decode(defining.get_pending_reconstruction_metadata()[state_key(db_uri)])["docs"].names == ["id", "text"]


def test_what_a_stale_state_finds_wrong_is_judged_on_the_tables(tmp_path, opens):
    """A column added after the snapshot loads (read anew); a typo still fails, naming the field."""
    db_uri, state = str(tmp_path / "db"), tmp_path / "schemas.json"
    docs = lancedb.connect(db_uri).create_table("docs", pa.table({"id": [1], "text": ["a"]}))
    with refreshing():
        with_state(db_uri, state, "a")
    docs.add(pa.table({"id": [2], "text": ["b"]}))
    docs.add_columns({"title": "text"})  # since the snapshot
    opens.clear()
    with pytest.warns(UserWarning, match=f"{state}: the schemas state is older than the tables of {db_uri}"):
        with_state(db_uri, state, "t", udf=titled)
    assert opens == ["docs"]
    with pytest.raises(Exception, match="field 'inputs': table 'docs' has no column 'titel'; it has id, text, title") as err:
        with_state(db_uri, state, "t", udf=mistyped)
    assert f"the schemas state file {state} showed this, and reading the tables of {db_uri} confirmed it" in str(err.value)
    assert read_state(state, db_uri)["docs"].names == ["id", "text"]  # the load writes no state: refresh-state does


def test_a_state_file_for_another_database_or_unreadable_is_not_used(tmp_path, opens):
    db_uri, state = str(tmp_path / "db"), tmp_path / "schemas.json"
    lancedb.connect(db_uri).create_table("docs", pa.table({"id": [1], "text": ["a"]}))
    write_state(state, "s3://elsewhere/db", {"docs": pa.schema([("id", pa.int64())])})
    with_state(db_uri, state, "a")
    assert opens == ["docs"]
    opens.clear()
    state.write_text("{not json")
    with pytest.warns(UserWarning, match=f"{state}: not a schemas state file gpufn refresh-state wrote"):
        with_state(db_uri, state, "a")
    assert opens == ["docs"]
