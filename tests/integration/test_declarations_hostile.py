"""Hostile Function declarations and commits: caught when definitions load naming the Function and
field, or reported with Lance's own reason -- never a run that computes every row and then fails."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import lancedb
import pyarrow as pa
import pytest

from gpufn_dagster import FunctionDefinitionError, build_definitions, gpu_function, make_function, refresh_column
from gpufn_dagster.assets.reporting import ERRORS_TABLE
from gpufn_dagster.errors import CommitRefused
from gpufn_dagster.assets.resources import STABLE_ROW_IDS

CALLS: list[str] = []


@pytest.fixture(autouse=True)
def _reset():
    CALLS.clear()


def docs(db_uri: str, rows: int = 30):
    return lancedb.connect(db_uri).create_table(
        "docs", pa.table({"id": list(range(rows)), "text": [f"doc {i}" for i in range(rows)],
                          "title": [f"t{i}" for i in range(rows)]}), storage_options=STABLE_ROW_IDS)


def upper(text: str) -> str:
    CALLS.append(text)
    return text.upper()








def test_a_function_cannot_overwrite_a_users_column(db_uri):
    table = docs(db_uri)
    asset = gpu_function(table="docs", column="title", name="docs__title")(upper)
    with pytest.raises(FunctionDefinitionError, match=r"field 'column': 'title' of table 'docs' holds the table's "
                                                      r"own data"):
        build_definitions(assets=[asset], db_uri=db_uri)
    # And at run time too (the table may have gained the column after definitions loaded).
    from gpufn_dagster import function_of

    with pytest.raises(FunctionDefinitionError, match="'title' is a column of table 'docs' that no Function computes"):
        refresh_column(table.to_lance().uri, function_of(asset))
    assert CALLS == [] and "_gpufn_sig_title" not in lancedb.connect(db_uri).open_table("docs").schema.names


def seven(text: str) -> int:
    return "seven" if text.endswith("7") else len(text)


def test_a_value_of_the_wrong_type_fails_its_row_alone(db_uri):
    docs(db_uri)
    asset = gpu_function(table="docs", column="n", on_error="skip")(seven)
    defs = build_definitions(assets=[asset], db_uri=db_uri)
    result = dg.materialize([asset], resources=defs.resources, instance=dg.DagsterInstance.ephemeral())
    assert result.success
    values = dict(zip(*lancedb.connect(db_uri).open_table("docs").to_lance().to_table(
        columns=["id", "n"]).to_pydict().values(), strict=True))
    assert values[7] is None and values[17] is None and values[8] == 5
    errors = lancedb.connect(db_uri).open_table(ERRORS_TABLE).to_arrow().to_pylist()
    assert len(errors) == 3  # doc 7, 17, 27
    assert "Function 'docs__n' returned 'seven' (str) for row id 7 (fragment 0, offset 7; text='doc 7'), which is not " \
           "a int64" in errors[0]["error"]

    failing = gpu_function(table="docs", column="m", on_error="fail")(seven)
    run = dg.materialize([failing], resources=defs.resources, instance=dg.DagsterInstance.ephemeral(),
                         raise_on_error=False)
    error = run.get_step_failure_events()[0].step_failure_data.error.cause
    assert "returned 'seven' (str) for row id 7 (fragment 0, offset 7; text='doc 7'), which is not a int64" in error.message


def test_a_concurrent_compaction_is_retried_as_a_race(db_uri):
    table = docs(db_uri, 10)
    for start in range(10, 40, 10):
        ids = list(range(start, start + 10))
        table.add(pa.table({"id": ids, "text": [f"doc {i}" for i in ids], "title": ["t"] * 10}))
    compacted: list[bool] = []

    def compacting(text: str) -> str:
        if not compacted:  # another writer compacts the fragments this refresh is rewriting
            compacted.append(True)
            lancedb.connect(db_uri).open_table("docs").optimize()
        CALLS.append(text)
        return text.upper()

    result = refresh_column(table.to_lance().uri, make_function(compacting, table="docs", column="u"))
    assert compacted and result.rows_total == 40
    # The figures are the final attempt's (the compacted fragment), not both attempts added up.
    assert (result.fragments_visited, result.fragments_total, result.rows_checked) == (1, 1, 40)
    assert lancedb.connect(db_uri).open_table("docs").count_rows("u IS NULL") == 0


def test_a_commit_lance_refuses_is_reported_not_retried(db_uri):
    """The object store loses a data file the refresh wrote (a lifecycle rule, a hand clean-up):
    Lance refuses the commit as a missing file -- not a race -- so it is reported, not retried."""
    table = docs(db_uri, 10)
    table.add(pa.table({"id": list(range(10, 20)), "text": [f"doc {i}" for i in range(10, 20)], "title": ["t"] * 10}))
    data = Path(table.to_lance().uri) / "data"

    def losing(text: str) -> str:
        if text == "doc 10":  # the first fragment's file is written; it vanishes before the commit
            for written in data.glob("gpufn-*.lance"):
                written.unlink()
        CALLS.append(text)
        return text.upper()

    with pytest.raises(CommitRefused, match=r"Lance refused the commit of Function 'docs__u' to table 'docs' "
                                            r"\(version \d+\): .*Not found"):
        refresh_column(table.to_lance().uri, make_function(losing, table="docs", column="u"), concurrency=1)
    assert len(CALLS) == 20  # computed once; a retry would have computed the lost fragment again
