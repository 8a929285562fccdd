"""Calling a Function on a batch of rows, with its error policy.

Returns values for every row asked (NULL where a row failed under `on_error="skip"`) plus the
failures, so the caller decides what to persist. A batch Function that raises under "skip" is
retried row by row (as one-row batches) to pin the failure on the rows that caused it.

A batch that runs out of device memory is not a failure: it is retried in halves, down to one
row, and later batches are cut to the size that fit (`BatchFit`); only a single row that still
does not fit fails, under the error policy. Out of memory is an exception of a class named
`OutOfMemoryError` (torch's `torch.cuda.OutOfMemoryError`, and others' of that name) or one the
Function's callable declares in its `oom_errors` attribute.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ..errors import FunctionFailed
from ..function_spec.functions import CallStyle, Function
from .reads import split_address


@dataclass(frozen=True)
class RowError:
    row_address: int
    error: str
    traceback: str
    retried: bool = False  # the row had failed in an earlier refresh too
    row_id: int | None = None  # its stable row id (None: recorded by an earlier release)


@dataclass(frozen=True)
class Rows:
    """The rows of one call, for naming a row that fails: physical addresses and stable row ids
    (what a user can look up: `table.search().where("_rowid = 42")`, or by its values).

    >>> import numpy as np
    >>> rows = Rows(np.array([4294969296], dtype=np.uint64), np.array([1234], dtype=np.uint64))
    >>> rows.name(0, pa.record_batch({"text": ["a very long document " * 5]}))
    "row id 1234 (fragment 1, offset 2000; text='a very long document a very long document a very long docu…)"
    """

    addresses: Any  # a numpy array (or a sequence) of row addresses
    ids: Any = None  # the same rows' stable row ids (None: unknown)

    def __getitem__(self, part: slice) -> Rows:
        return Rows(self.addresses[part], None if self.ids is None else self.ids[part])

    def address(self, i: int) -> int:
        return int(self.addresses[i])

    def row_id(self, i: int) -> int | None:
        return None if self.ids is None else int(self.ids[i])

    def name(self, i: int, inputs: pa.RecordBatch) -> str:
        """'row id 1234 (fragment 1, offset 2000; text='first 60 characters…')': the first input values shortened."""
        address = self.address(i)
        values = "; ".join(f"{name}={_short(inputs.column(name)[i].as_py())}" for name in inputs.schema.names[:2])
        fragment, offset = split_address(address)
        where = f"fragment {fragment}, offset {offset}" + (f"; {values}" if values else "")
        row_id = self.row_id(i)
        return f"row id {row_id} ({where})" if row_id is not None else f"row address {address} ({where})"

    def error(self, i: int, message: str, trace: str) -> RowError:
        return RowError(self.address(i), message, trace, row_id=self.row_id(i))


def _short(value: Any, most: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= most else text[:most - 1] + "…"


@dataclass
class BatchFit:
    """What out-of-memory splits taught one refresh: the most rows a call may take, and how often it split."""

    rows: int | None = None  # None: no batch ran out of memory yet
    splits: int = 0

    def split(self, rows: int) -> int:
        """Record that a call of `rows` rows ran out of memory; returns the rows of its first half."""
        half = (rows + 1) // 2
        self.splits += 1
        self.rows = half if self.rows is None else min(self.rows, half)
        return half


def is_out_of_memory(err: BaseException, call: Any) -> bool:
    """Whether `err` says the device ran out of memory (see the module's docstring).

    >>> class OutOfMemoryError(RuntimeError): pass
    >>> is_out_of_memory(OutOfMemoryError("CUDA out of memory"), None), is_out_of_memory(ValueError(), None)
    (True, False)
    """
    declared = tuple(getattr(call, "oom_errors", ()) or ())
    return (bool(declared) and isinstance(err, declared)) or any(
        cls.__name__ == "OutOfMemoryError" for cls in type(err).__mro__)


def _release_device_memory() -> None:
    # What torch cached for the failed batch would stay reserved for the halves; give it back.
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


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


def _in_parts(call: Callable[..., Any], function: Function, inputs: pa.RecordBatch, rows: Rows,
              fit: BatchFit | None, size: int) -> tuple[pa.Array, list[RowError]]:
    values: list[pa.Array] = []
    errors: list[RowError] = []
    for start in range(0, inputs.num_rows, size):
        value, part_errors = call_function(call, function, inputs.slice(start, size), rows[start:start + size], fit)
        values.append(value)
        errors.extend(part_errors)
    return pa.concat_arrays(values), errors


def call_function(
    call: Callable[..., Any], function: Function, inputs: pa.RecordBatch, rows: Rows | Sequence[int],
    fit: BatchFit | None = None,
) -> tuple[pa.Array, list[RowError]]:
    """Values for each input row, and the rows that failed (only under on_error='skip').

    `rows` (their addresses and stable ids; a plain sequence of addresses is fine) is only read
    when a row fails, to name it. `fit` carries what out-of-memory splits taught earlier calls of
    the same refresh (see the module's docstring).
    """
    rows = rows if isinstance(rows, Rows) else Rows(rows)
    if function.call_style is not CallStyle.ROW:
        if fit is not None and fit.rows is not None and inputs.num_rows > fit.rows:
            return _in_parts(call, function, inputs, rows, fit, fit.rows)
        try:
            return _call_batch(call, function, inputs), []
        except Exception as err:
            oom = is_out_of_memory(err, call)
            if oom:
                _release_device_memory()
                if inputs.num_rows > 1:
                    return _in_parts(call, function, inputs, rows, fit, (fit or BatchFit()).split(inputs.num_rows))
            what = (f"ran out of device memory on a single row, {rows.name(0, inputs)}" if oom
                    else f"failed on a batch of {inputs.num_rows} rows" if inputs.num_rows > 1
                    else f"failed on {rows.name(0, inputs)}")
            if function.on_error == "fail":
                raise FunctionFailed(f"Function {function.name!r} {what}: {err!r}") from err
            if inputs.num_rows == 1:
                message = f"{what}: {err!r}" if oom else repr(err)
                return pa.nulls(1, function.output_type), [rows.error(0, message, traceback.format_exc())]
        # Under "skip", pin a batch's failure on the rows that caused it: each row on its own.
        return _in_parts(call, function, inputs, rows, fit, 1)

    columns = [inputs.column(name).to_pylist() for name in function.inputs]
    out: list[Any] = []
    errors = []
    for i, args in enumerate(zip(*columns, strict=True)):
        try:
            out.append(call(**dict(zip(function.inputs, args, strict=True))))
        except Exception as err:
            if function.on_error == "fail":
                raise FunctionFailed(f"Function {function.name!r} failed on {rows.name(i, inputs)}: {err!r}") from err
            out.append(None)
            errors.append(rows.error(i, repr(err), traceback.format_exc()))
    try:
        return _to_array(out, function.output_type, inputs.num_rows), errors
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return _convert_rows(function, out, inputs, rows, errors)


def _convert_rows(function: Function, out: list[Any], inputs: pa.RecordBatch, rows: Rows,
                  errors: list[RowError]) -> tuple[pa.Array, list[RowError]]:
    """Convert each returned value on its own, so a value of the wrong type fails its row alone
    (under the error policy), naming the Function, the row and the types."""
    values: list[pa.Array] = []
    for i, value in enumerate(out):
        try:
            values.append(pa.array([value], type=function.output_type))
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as err:
            message = (f"Function {function.name!r} returned {value!r} ({type(value).__name__}) for "
                       f"{rows.name(i, inputs)}, which is not a {function.output_type}: {err}")
            if function.on_error == "fail":
                raise FunctionFailed(message) from err
            values.append(pa.nulls(1, function.output_type))
            errors.append(rows.error(i, message, traceback.format_exc()))
    return (pa.concat_arrays(values) if values else pa.array([], function.output_type)), errors
