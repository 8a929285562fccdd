"""The tables' schemas a code location's definitions are checked against (`assets.table_schemas`):
each distinct table read once where the location is defined, however many Functions compute on it;
nothing read where it is reconstructed from what was kept; a table created since is read then."""

from __future__ import annotations

import lancedb
import pyarrow as pa
import pytest
from dagster._core.definitions.definitions_load_context import DefinitionsLoadContext, DefinitionsLoadType
from dagster._core.definitions.repository_definition import RepositoryLoadData

from gpufn_dagster import build_definitions, gpu_function
from gpufn_dagster.assets.table_schemas import decode, state_key


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
