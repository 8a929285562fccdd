"""Unit layer: the refresh engine's pure parts -- signatures, alignment, fragment planning, type names."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest

from gpufn_dagster import make_function, refresh_column
from gpufn_dagster.function_spec.arrow_types import parse_arrow_type
from gpufn_dagster.k8s_syntax import parse_quantity
from gpufn_dagster.refresh.columns import ensure_columns
from gpufn_dagster.refresh.files import TableFiles
from gpufn_dagster.refresh.plan import plan_fragments
from gpufn_dagster.refresh.signature import FAILED, row_signatures
from gpufn_dagster.refresh.write import align_to_physical


def ident(x: float) -> float:
    return x


def signatures(values: list, data_type: pa.DataType, version: str | None = None) -> list[int]:
    function = make_function(ident, table="t", column="y", output_type=pa.float64(), version=version)
    return row_signatures(function, pa.record_batch({"x": pa.array(values, data_type)})).to_pylist()


def test_null_zero_and_negative_zero_are_three_different_inputs():
    floats = signatures([None, 0.0, -0.0, 0.0], pa.float64())
    assert len(set(floats[:3])) == 3 and floats[1] == floats[3]
    ints = signatures([None, 0], pa.int64())
    assert ints[0] != ints[1]
    nested = signatures([[None], [0.0], [-0.0], [], None], pa.list_(pa.float32()))
    assert len(set(nested)) == 5
    assert FAILED not in floats + ints + nested   # FAILED is reserved for rows whose last attempt failed


def test_a_new_function_version_changes_every_signature():
    assert set(signatures([1.0, 2.0], pa.float64(), "a")).isdisjoint(signatures([1.0, 2.0], pa.float64(), "b"))


def test_alignment_puts_live_rows_at_their_physical_offsets():
    schema = pa.schema([("y", pa.int64())])
    batch = pa.record_batch({"y": [10, 12, 15]}, schema=schema)
    aligned = align_to_physical(batch, np.array([0, 2, 5]), 0, schema)
    assert aligned.column("y").to_pylist() == [10, None, 12, None, None, 15]   # deleted rows 1, 3, 4 are NULL
    assert align_to_physical(batch, np.array([7, 8, 9]), 7, schema) is batch         # dense: left as it is
    assert align_to_physical(batch, np.array([8, 9, 11]), 7, schema).column("y").to_pylist() == [None, 10, 12, None, 15]


def test_planning_visits_only_fragments_whose_output_is_missing_or_stale(tmp_path: Path):
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"x": [1.0, 2.0]}), uri)
    lance.write_dataset(pa.table({"x": [3.0]}), uri, mode="append")
    function = make_function(ident, table="t", column="y")
    assert [w.reason for w in plan_fragments(ensure_columns(TableFiles(uri), function), function)] == ["new", "new"]
    refresh_column(uri, function)
    assert plan_fragments(lance.dataset(uri), function) == []
    lance.write_dataset(pa.table({"x": [4.0]}), uri, mode="append")
    dataset = lance.dataset(uri)
    work = plan_fragments(dataset, function)
    assert [(w.fragment_id, w.reason, w.live_rows) for w in work] == [(dataset.get_fragments()[-1].fragment_id, "new", 1)]
    refresh_column(uri, function)
    pinned = make_function(ident, table="t", column="y", version="2")
    assert [w.reason for w in plan_fragments(ensure_columns(TableFiles(uri), pinned), pinned)] == ["stale", "stale", "stale"]


@pytest.mark.parametrize(("name", "expected"), [
    ("int64", pa.int64()), ("string", pa.string()), ("list<float32>", pa.list_(pa.float32())),
    ("fixed_size_list<float32>[384]", pa.list_(pa.float32(), 384)), ("large_list<int8>", pa.large_list(pa.int8())),
    ("struct<a: int64, b: list<string>>", pa.struct([("a", pa.int64()), ("b", pa.list_(pa.string()))])),
    ("list<struct<x: float64, y: fixed_size_list<int32>[2]>>",
     pa.list_(pa.struct([("x", pa.float64()), ("y", pa.list_(pa.int32(), 2))]))),
])
def test_arrow_type_names_parse(name, expected):
    assert parse_arrow_type(name) == expected


@pytest.mark.parametrize("name", ["int65", "list<>", "fixed_size_list<float32>", "struct<a int64>", ""])
def test_bad_arrow_type_names_are_refused(name):
    with pytest.raises((ValueError, KeyError)):
        parse_arrow_type(name)


@pytest.mark.parametrize("text", ["64Gi", "500m", "1e3", "8", "0.5", "1.5Gi", "+3k", "-2M", "100n", "3E", "1Ei", ".5",
                                  "2e-3", "1E18"])
def test_quantities_parse_as_the_kubernetes_client_parses_them(text):
    from kubernetes.utils.quantity import parse_quantity as client_parse

    assert parse_quantity(text) == client_parse(text)
    assert isinstance(parse_quantity(text), Decimal)


@pytest.mark.parametrize("text", ["1e3Gi", "NaN", "1_000", "8 Gi", "１", "1e19"])
def test_what_kubernetes_refuses_is_not_a_quantity(text):
    with pytest.raises(ValueError):
        parse_quantity(text)


def test_a_finished_fragment_is_adopted_by_the_next_refresh_only_while_its_file_verifies(tmp_path: Path):
    """A refresh that fails after finishing fragment 0 leaves it checkpointed: the next refresh
    adopts it (counted as an adopted part); when its file was changed since, the next refresh
    computes it again and says a part failed its checksum."""
    from gpufn_dagster.errors import FunctionFailed

    calls: list[int] = []
    fail_at = {150}

    def double(x: int) -> int:
        if x in fail_at:
            raise ValueError(f"no {x}")
        calls.append(x)
        return 2 * x

    function = make_function(double, table="t", column="y")

    def failed_once(uri: str) -> None:
        with pytest.raises(FunctionFailed):
            refresh_column(uri, function, concurrency=1)
        assert len(calls) >= 100  # fragment 0 finished, fragment 1 failed at its 50th row

    for damage in (False, True):
        uri = str(tmp_path / f"t{damage}.lance")
        lance.write_dataset(pa.table({"x": list(range(200))}), uri, max_rows_per_file=100)
        fail_at.add(150)
        failed_once(uri)
        if damage:  # fragment 0's finished file, rewritten under its name
            files = TableFiles(uri)
            (done,) = [n for n in files.names("_gpufn/checkpoints") if n.endswith("done.json")]
            import json

            name = json.loads(files.read(f"_gpufn/checkpoints/{done}"))["file"]
            files.write(f"data/{name}", files.read(f"data/{name}") + b"\0")
        fail_at.clear()
        calls.clear()
        result = refresh_column(uri, function, concurrency=1)
        assert lance.dataset(uri).to_table(columns=["y"]).column("y").to_pylist() == [2 * x for x in range(200)]
        if damage:
            assert (result.parts_damaged, result.parts_adopted, result.rows_adopted) == (1, 0, 0)
            assert sorted(calls) == list(range(200))
        else:
            assert (result.parts_damaged, result.parts_adopted, result.rows_adopted) == (0, 1, 100)
            assert calls and min(calls) >= 100  # fragment 0 was not computed again
