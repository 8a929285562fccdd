"""Calling a Function on a batch of rows, with its error policy.

Returns values for every row asked (NULL where a row failed under `on_error="skip"`) plus the
failures, so the caller decides what to persist. A batch Function that raises under "skip" is
retried row by row (as one-row batches) to pin the failure on the rows that caused it.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ..errors import FunctionFailed
from ..functions import CallStyle, Function


@dataclass(frozen=True)
class RowError:
    row_address: int
    error: str
    traceback: str
    retried: bool = False  # the row had failed in an earlier refresh too


def _to_array(result: Any, data_type: pa.DataType, rows: int) -> pa.Array:
    if isinstance(result, pa.ChunkedArray):
        result = result.combine_chunks()
    array = result if isinstance(result, pa.Array) else pa.array(result, type=data_type)
    if array.type != data_type:
        array = array.cast(data_type)
    if len(array) != rows:
        raise ValueError(f"returned {len(array)} values for {rows} rows")
    return array


def _call_batch(call: Callable[..., Any], function: Function, inputs: pa.RecordBatch) -> pa.Array:
    if function.call_style is CallStyle.RECORD_BATCH:
        result = call(inputs)
    else:
        result = call(**{name: inputs.column(name) for name in function.inputs})
    return _to_array(result, function.output_type, inputs.num_rows)


def call_function(
    call: Callable[..., Any], function: Function, inputs: pa.RecordBatch, row_addresses: Sequence[int]
) -> tuple[pa.Array, list[RowError]]:
    """Values for each input row, and the rows that failed (only under on_error='skip').

    `row_addresses` (a numpy array is fine) is only read when a row fails.
    """
    if function.call_style is not CallStyle.ROW:
        try:
            return _call_batch(call, function, inputs), []
        except Exception as err:
            if function.on_error == "fail":
                raise FunctionFailed(f"Function {function.name!r} failed on a batch of {inputs.num_rows} rows: {err!r}") from err
            if inputs.num_rows == 1:
                return pa.nulls(1, function.output_type), [
                    RowError(int(row_addresses[0]), repr(err), traceback.format_exc())]
        values: list[pa.Array] = []
        errors: list[RowError] = []
        for i in range(inputs.num_rows):
            value, row_errors = call_function(call, function, inputs.slice(i, 1), row_addresses[i:i + 1])
            values.append(value)
            errors.extend(row_errors)
        return pa.concat_arrays(values), errors

    columns = [inputs.column(name).to_pylist() for name in function.inputs]
    out: list[Any] = []
    errors = []
    for i, args in enumerate(zip(*columns, strict=True)):
        try:
            out.append(call(**dict(zip(function.inputs, args, strict=True))))
        except Exception as err:
            if function.on_error == "fail":
                raise FunctionFailed(
                    f"Function {function.name!r} failed on row address {int(row_addresses[i])}: {err!r}") from err
            out.append(None)
            errors.append(RowError(int(row_addresses[i]), repr(err), traceback.format_exc()))
    try:
        return _to_array(out, function.output_type, inputs.num_rows), errors
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return _convert_rows(function, out, row_addresses, errors)


def _convert_rows(function: Function, out: list[Any], row_addresses: Sequence[int],
                  errors: list[RowError]) -> tuple[pa.Array, list[RowError]]:
    """Convert each returned value on its own, so a value of the wrong type fails its row alone
    (under the error policy), naming the Function, the row and the types."""
    values: list[pa.Array] = []
    for i, value in enumerate(out):
        try:
            values.append(pa.array([value], type=function.output_type))
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as err:
            message = (f"Function {function.name!r} returned {value!r} ({type(value).__name__}) for row address "
                       f"{int(row_addresses[i])}, which is not a {function.output_type}: {err}")
            if function.on_error == "fail":
                raise FunctionFailed(message) from err
            values.append(pa.nulls(1, function.output_type))
            errors.append(RowError(int(row_addresses[i]), message, traceback.format_exc()))
    return (pa.concat_arrays(values) if values else pa.array([], function.output_type)), errors
