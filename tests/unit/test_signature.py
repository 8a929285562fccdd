"""Unit layer: per-row signatures tell apart any two distinct Arrow values a column can hold.

A signature that collides leaves an old value in place after its input changed, silently. The
fuzz draws values from small domains on purpose (short lists, a few strings with separators and
NUL bytes, nulls at every level) so that near-identical values are common, and checks every
distinct value gets its own hash -- directly, and through a real Lance scan (where top-level
strings are digested by Lance instead)."""

from __future__ import annotations

import datetime
import decimal
import random
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest

from gpufn_dagster.function_spec.functions import make_function
from gpufn_dagster.refresh.signature import (FAILED, UnsupportedInputType, row_signatures, scan_expressions,
                                             unsupported_reason, value_hashes)

SEED = 20261130
STRINGS = ["", "a", "b", ",", "a,b", "Hello", " world", "Hello, world", "\x00", "p", "[", "]"]


def scalar(data_type: pa.DataType, rng: random.Random, depth: int = 0):
    """A random Python value for `data_type`, NULL one time in five."""
    if rng.random() < 0.2:
        return None
    if pa.types.is_boolean(data_type):
        return rng.random() < 0.5
    if pa.types.is_integer(data_type):
        return rng.choice([0, 1, 2, 3, -1 if pa.types.is_signed_integer(data_type) else 4])
    if pa.types.is_floating(data_type):
        return rng.choice([0.0, -0.0, 1.0, 1.5, -2.0])
    if pa.types.is_decimal(data_type):
        return decimal.Decimal(rng.choice(["0.00", "1.50", "-1.50", "2.25"]))
    if pa.types.is_date(data_type):
        return datetime.date(2026, 1, 1) + datetime.timedelta(days=rng.randrange(3))
    if pa.types.is_timestamp(data_type) or pa.types.is_duration(data_type) or pa.types.is_time(data_type):
        return rng.randrange(3)
    if pa.types.is_fixed_size_binary(data_type):
        return bytes(rng.choice([0, 1, 44]) for _ in range(data_type.byte_width))
    if pa.types.is_string(data_type) or pa.types.is_large_string(data_type):
        return rng.choice(STRINGS)
    if pa.types.is_binary(data_type) or pa.types.is_large_binary(data_type):
        return rng.choice(STRINGS).encode()
    if pa.types.is_fixed_size_list(data_type):
        return [scalar(data_type.value_type, rng, depth + 1) for _ in range(data_type.list_size)]
    if pa.types.is_map(data_type):
        return [(rng.choice(STRINGS), scalar(data_type.item_type, rng, depth + 1)) for _ in range(rng.randrange(3))]
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        return [scalar(data_type.value_type, rng, depth + 1) for _ in range(rng.randrange(4))]
    if pa.types.is_struct(data_type):
        return {f.name: scalar(f.type, rng, depth + 1) for f in data_type}
    raise AssertionError(data_type)


TYPES = [
    pa.int8(), pa.int64(), pa.uint32(), pa.float16(), pa.float32(), pa.float64(), pa.bool_(),
    pa.date32(), pa.date64(), pa.time32("s"), pa.time64("us"), pa.timestamp("us", tz="UTC"), pa.duration("ms"),
    pa.decimal128(10, 2), pa.decimal256(40, 2), pa.binary(3), pa.string(), pa.large_string(), pa.binary(),
    pa.large_binary(), pa.list_(pa.string()), pa.list_(pa.float64()), pa.large_list(pa.int64()),
    pa.list_(pa.list_(pa.int32())), pa.list_(pa.float32(), 3), pa.list_(pa.list_(pa.string()), 2),
    pa.struct([("a", pa.int64()), ("b", pa.string())]), pa.list_(pa.struct([("x", pa.int8()), ("y", pa.bool_())])),
    pa.map_(pa.string(), pa.int64()),
]


def canonical(value) -> str:
    """A text that differs exactly when two Python values of one Arrow type differ (-0.0 is not 0.0)."""
    if isinstance(value, float):
        return f"f{value.hex()}"
    if isinstance(value, (list, tuple)):
        return "[" + ";".join(canonical(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ";".join(f"{k}={canonical(v)}" for k, v in value.items()) + "}"
    return f"{type(value).__name__}:{value!r}"


def random_column(data_type: pa.DataType, rows: int, seed: int) -> tuple[pa.Array, list[str]]:
    rng = random.Random(seed)
    values = [scalar(data_type, rng) for _ in range(rows)]
    array = pa.array(values, type=data_type)
    return array, [canonical(v) for v in array.to_pylist()]


def assert_injective(hashes: np.ndarray, keys: list[str]) -> None:
    by_hash: dict[int, str] = {}
    for h, key in zip(hashes.tolist(), keys, strict=True):
        assert by_hash.setdefault(h, key) == key, f"{key!r} and {by_hash[h]!r} share the hash {h:#x}"
    assert len(set(by_hash.values())) == len(set(keys))


@pytest.mark.parametrize("data_type", TYPES, ids=str)
def test_distinct_values_get_distinct_hashes(data_type):
    array, keys = random_column(data_type, 400, SEED)
    assert len(set(keys)) >= 3  # the fuzz produced near-identical values to tell apart
    hashes = value_hashes(array)
    assert_injective(hashes, keys)
    # A slice (as a scan hands out) hashes each value the same as the whole array does.
    assert (value_hashes(array.slice(37, 100)) == hashes[37:137]).all()


def test_dictionary_encoded_column_hashes_its_values():
    array, keys = random_column(pa.string(), 300, SEED)
    encoded = array.dictionary_encode()
    assert_injective(value_hashes(encoded), keys)
    assert (value_hashes(encoded.slice(10)) == value_hashes(array.dictionary_encode().slice(10))).all()


def test_the_reported_collisions_are_gone():
    pairs = [
        (["Hello, world"], ["Hello", " world"]),
        (["p", None], ["p"]),
        ([1.0, None], [1.0]),
        ([[1, 2], [3]], [[1], [2, 3]]),
        ([None], []),
        ([""], []),
        ([0], [None]),
    ]
    for a, b in pairs:
        left, right = value_hashes(pa.array([a, b]))
        assert left != right, (a, b)
    zero, negative_zero, null = value_hashes(pa.array([0.0, -0.0, None]))
    assert len({zero, negative_zero, null}) == 3


@pytest.mark.parametrize("data_type", [pa.string(), pa.large_string(), pa.binary(), pa.list_(pa.string()),
                                       pa.struct([("a", pa.int64()), ("b", pa.string())]), pa.date32(),
                                       pa.decimal128(10, 2)], ids=str)
def test_signatures_through_a_lance_scan_are_injective(tmp_path: Path, data_type):
    """The engine's path: Lance scans the column (digesting top-level strings), numpy hashes the rest."""
    array, keys = random_column(data_type, 300, SEED + 1)
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"v": array}), uri)

    def f(v: str) -> str:
        return ""

    function = make_function(f, table="t", column="out", output_type=pa.string())
    dataset = lance.dataset(uri)
    columns = {"v": "`v`"} | scan_expressions(function, dataset.schema)
    scanned = pa.Table.from_batches(dataset.scanner(columns=columns).to_batches())
    signatures = row_signatures(function, scanned.combine_chunks().to_batches()[0]).to_numpy()
    assert_injective(signatures, keys)
    assert FAILED not in signatures  # 0 is reserved for failed rows


def test_types_lance_cannot_hold_are_named():
    assert unsupported_reason(pa.month_day_nano_interval()) == "month_day_nano_interval is not supported"
    with pytest.raises(UnsupportedInputType, match="month_day_nano_interval"):
        value_hashes(pa.array([(1, 2, 3)], pa.month_day_nano_interval()))
    assert unsupported_reason(pa.list_(pa.dictionary(pa.int32(), pa.string()))) is None
