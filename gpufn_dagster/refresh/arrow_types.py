"""Arrow types spelled the way DataFusion's `arrow_cast` reads them (Arrow's DataType display)."""

from __future__ import annotations

import pyarrow as pa

_SIMPLE = {
    pa.string(): "Utf8", pa.large_string(): "LargeUtf8", pa.binary(): "Binary", pa.large_binary(): "LargeBinary",
    pa.bool_(): "Boolean", pa.int8(): "Int8", pa.int16(): "Int16", pa.int32(): "Int32", pa.int64(): "Int64",
    pa.uint8(): "UInt8", pa.uint16(): "UInt16", pa.uint32(): "UInt32", pa.uint64(): "UInt64",
    pa.float16(): "Float16", pa.float32(): "Float32", pa.float64(): "Float64", pa.date32(): "Date32",
}
_UNITS = {"s": "Second", "ms": "Millisecond", "us": "Microsecond", "ns": "Nanosecond"}


def datafusion_type(data_type: pa.DataType) -> str:
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
