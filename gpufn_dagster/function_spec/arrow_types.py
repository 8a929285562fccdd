"""Arrow types by name: read as YAML and `output_type="..."` spell them, written as DataFusion's
`arrow_cast` reads them (Arrow's DataType display). Pure; the one Arrow-type parser of the project."""

from __future__ import annotations

import re

import pyarrow as pa

_SIMPLE = {
    pa.string(): "Utf8", pa.large_string(): "LargeUtf8", pa.binary(): "Binary", pa.large_binary(): "LargeBinary",
    pa.bool_(): "Boolean", pa.int8(): "Int8", pa.int16(): "Int16", pa.int32(): "Int32", pa.int64(): "Int64",
    pa.uint8(): "UInt8", pa.uint16(): "UInt16", pa.uint32(): "UInt32", pa.uint64(): "UInt64",
    pa.float16(): "Float16", pa.float32(): "Float32", pa.float64(): "Float64", pa.date32(): "Date32",
}
_UNITS = {"s": "Second", "ms": "Millisecond", "us": "Microsecond", "ns": "Nanosecond"}


def parse_arrow_type(spec: str) -> pa.DataType:
    """An Arrow type by name, as YAML and `output_type="..."` spell it; ValueError saying what names work.

    >>> parse_arrow_type("fixed_size_list<float32>[384]"), parse_arrow_type("struct<name: string, n: int64>")
    (FixedSizeListType(fixed_size_list<item: float>[384]), StructType(struct<name: string, n: int64>))
    """
    text = spec.strip()
    if match := re.fullmatch(r"fixed_size_list<(.+)>\[(\d+)\]", text):
        return pa.list_(parse_arrow_type(match.group(1)), int(match.group(2)))
    if match := re.fullmatch(r"list<(.+)>", text):
        return pa.list_(parse_arrow_type(match.group(1)))
    if match := re.fullmatch(r"large_list<(.+)>", text):
        return pa.large_list(parse_arrow_type(match.group(1)))
    if match := re.fullmatch(r"struct<(.+)>", text):
        fields, depth, start = [], 0, 0
        body = match.group(1)
        for i, char in enumerate(body + ","):
            depth += char == "<"
            depth -= char == ">"
            if char == "," and depth == 0:
                name, _, type_spec = body[start:i].partition(":")
                fields.append(pa.field(name.strip(), parse_arrow_type(type_spec)))
                start = i + 1
        return pa.struct(fields)
    try:
        return pa.type_for_alias(text)
    except (ValueError, KeyError):
        raise ValueError(f"{spec!r} is not an Arrow type; use e.g. 'int64', 'string', 'list<float32>', "
                         "'fixed_size_list<float32>[384]', 'struct<a: int64, b: string>'") from None


def datafusion_type(data_type: pa.DataType) -> str:
    """The type as DataFusion's `arrow_cast` spells it (to declare a column with SQL)."""
    if data_type in _SIMPLE:
        return _SIMPLE[data_type]
    if pa.types.is_fixed_size_list(data_type):
        return f"FixedSizeList({data_type.list_size}, {datafusion_type(data_type.value_type)})"
    if pa.types.is_large_list(data_type):
        return f"LargeList({datafusion_type(data_type.value_type)})"
    if pa.types.is_list(data_type):
        return f"List({datafusion_type(data_type.value_type)})"
    if pa.types.is_struct(data_type):
        fields = ", ".join(f'"{f.name}": {datafusion_type(f.type)}' for f in data_type)
        return f"Struct({fields})"
    if pa.types.is_timestamp(data_type):
        tz = f'Some("{data_type.tz}")' if data_type.tz else "None"
        return f"Timestamp({_UNITS[data_type.unit]}, {tz})"
    raise ValueError(f"no DataFusion spelling for Arrow type {data_type}")
