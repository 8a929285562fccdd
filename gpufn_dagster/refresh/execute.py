"""Calling a Function on a batch of rows, with its error policy.

Returns values for every row asked (NULL where the policy skipped a row) plus the failures, so the
caller decides what to persist. Each error goes to the Function's `on_error` policy
(`function_spec.error_policy`): a retry calls again after its backoff; a batch whose error is
skipped is called again row by row (one-row batches, no more retries) to pin the failure on the
rows that caused it; a fail raises `FunctionFailed` naming the row, the attempt and the rule.

A call runs under a deadline of `row_timeout_seconds` x its rows (`deadline`): a batch past it is
split in halves, as below, and a single row past it fails with `RowTimeout` under the policy.

A batch that runs out of device memory is not a failure: it is retried in halves, down to one
row, and later batches are cut to the size that fit (`BatchFit`); only a single row that still
does not fit fails, under the error policy. Out of memory is an exception of a class named
`OutOfMemoryError` (torch's `torch.cuda.OutOfMemoryError`, and others' of that name) or one the
Function's callable declares in its `oom_errors` attribute.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ..errors import FunctionFailed, RefreshStopped, RowTimeout
from ..function_spec.code_version import format_exc
from ..function_spec.error_policy import Decision
from ..function_spec.functions import CallStyle, Function
from .deadline import deadline
from .reads import split_address


@dataclass(frozen=True)
class RowError:
    row_address: int
    error: str
    traceback: str
    retried: bool = False  # the row had failed in an earlier refresh too
    row_id: int | None = None  # its stable row id (None: recorded by an earlier release)
    attempt: int = 1  # the calls that included the row in this refresh
    rule: str | None = None  # the on_error rule that decided (None: recorded by an earlier release)
    error_class: str | None = None  # the exception's class (None: recorded by an earlier release)
    inputs: str | None = None  # its first input values, shortened ("text='a long docu…'")


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
        values = self.values(i, inputs)
        fragment, offset = split_address(address)
        where = f"fragment {fragment}, offset {offset}" + (f"; {values}" if values else "")
        row_id = self.row_id(i)
        return f"row id {row_id} ({where})" if row_id is not None else f"row address {address} ({where})"

    @staticmethod
    def values(i: int, inputs: pa.RecordBatch) -> str:
        """The row's first two input values, shortened: what a person recognizes it by."""
        return "; ".join(f"{name}={_short(inputs.column(name)[i].as_py())}" for name in inputs.schema.names[:2])

    def error(self, i: int, message: str, trace: str, attempt: int, rule: str, err: BaseException,
              inputs: pa.RecordBatch) -> RowError:
        return RowError(self.address(i), message, trace, row_id=self.row_id(i), attempt=attempt, rule=rule,
                        error_class=type(err).__name__, inputs=self.values(i, inputs))


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
              fit: BatchFit | None, size: int, may_retry: bool) -> tuple[pa.Array, list[RowError]]:
    values: list[pa.Array] = []
    errors: list[RowError] = []
    for start in range(0, inputs.num_rows, size):
        value, part_errors = call_function(call, function, inputs.slice(start, size), rows[start:start + size], fit,
                                            may_retry=may_retry)
        values.append(value)
        errors.extend(part_errors)
    return pa.concat_arrays(values), errors


def call_function(
    call: Callable[..., Any], function: Function, inputs: pa.RecordBatch, rows: Rows | Sequence[int],
    fit: BatchFit | None = None, *, may_retry: bool = True,
) -> tuple[pa.Array, list[RowError]]:
    """Values for each input row, and the rows its error policy skipped.

    `rows` (their addresses and stable ids; a plain sequence of addresses is fine) is only read
    when a row fails, to name it. `fit` carries what out-of-memory splits taught earlier calls of
    the same refresh (see the module's docstring). `may_retry` is False while a batch's error is
    pinned on its rows one by one (the batch already used its retries).
    """
    rows = rows if isinstance(rows, Rows) else Rows(rows)
    if function.call_style is CallStyle.ROW:
        return _call_rows(call, function, inputs, rows, may_retry)
    if fit is not None and fit.rows is not None and inputs.num_rows > fit.rows:
        return _in_parts(call, function, inputs, rows, fit, fit.rows, may_retry)
    timeout = function.options.row_timeout_seconds
    result = _under_policy(function, timeout and timeout * inputs.num_rows, may_retry,
                           lambda: _call_batch(call, function, inputs),
                           # not the rows' fault while the call has several rows: smaller calls, undecided
                           undecided=lambda err: inputs.num_rows > 1 and (
                               is_out_of_memory(err, call) or isinstance(err, RowTimeout)))
    if not isinstance(result, _Failure):
        return result, []
    err, decision, attempt = result.error, result.decision, result.attempt
    oom, late = is_out_of_memory(err, call), isinstance(err, RowTimeout)
    if oom:
        _release_device_memory()
    if decision is None:
        half = (fit or BatchFit()).split(inputs.num_rows) if oom else (inputs.num_rows + 1) // 2
        return _in_parts(call, function, inputs, rows, fit, half, may_retry)
    what = (f"ran out of device memory on a single row, {rows.name(0, inputs)}" if oom
            else f"ran past row_timeout_seconds={timeout} on {rows.name(0, inputs)}" if late
            else f"failed on a batch of {inputs.num_rows} rows" if inputs.num_rows > 1
            else f"failed on {rows.name(0, inputs)}")
    if decision.action == "fail":
        raise FunctionFailed(f"Function {function.name!r} {what}: {err!r} ({_decided(decision, attempt)})") from err
    if inputs.num_rows == 1:
        message = f"{what}: {err!r}" if oom or late else repr(err)
        return pa.nulls(1, function.output_type), [rows.error(0, message, result.traceback, attempt, decision.rule, err,
                                                              inputs)]
    # Skipped on a batch: pin the failure on the rows that caused it, each row on its own.
    return _in_parts(call, function, inputs, rows, fit, 1, may_retry=False)


@dataclass(frozen=True)
class _Failure:
    """A call that raised, with the policy's last decision on it (None: left to the caller)."""

    error: Exception
    traceback: str
    attempt: int
    decision: Decision | None


def _under_policy(function: Function, seconds: float | None, may_retry: bool, body: Callable[[], Any],
                  undecided: Callable[[Exception], bool] = lambda err: False) -> Any:
    """`body()` under a deadline of `seconds`, called again while the policy says retry (after its
    backoff); its value, or the `_Failure` once the policy decided otherwise (or `undecided(err)`).
    A terminated refresh's `RefreshStopped` passes through: it is no row's error."""
    attempt = 1
    while True:
        try:
            with deadline(seconds):
                return body()
        except RefreshStopped:
            raise
        except Exception as err:
            if undecided(err):
                return _Failure(err, format_exc(), attempt, None)
            decision = function.on_error.decide(err, attempt, may_retry)
            if decision.action != "retry":
                return _Failure(err, format_exc(), attempt, decision)
            time.sleep(decision.delay)
            attempt += 1


def _decided(decision: Decision, attempt: int) -> str:
    return f"attempt {attempt}, on_error rule {decision.rule}"


def _call_rows(call: Callable[..., Any], function: Function, inputs: pa.RecordBatch, rows: Rows,
               may_retry: bool) -> tuple[pa.Array, list[RowError]]:
    """A row Function: called once per row (each call under the row timeout and the policy)."""
    columns = [inputs.column(name).to_pylist() for name in function.inputs]
    out: list[Any] = []
    errors = []
    for i, args in enumerate(zip(*columns, strict=True)):
        kwargs = dict(zip(function.inputs, args, strict=True))
        value = _under_policy(function, function.options.row_timeout_seconds, may_retry, lambda: call(**kwargs))
        if not isinstance(value, _Failure):
            out.append(value)
            continue
        late = (f" (ran past row_timeout_seconds={function.options.row_timeout_seconds})"
                if isinstance(value.error, RowTimeout) else "")
        assert value.decision is not None
        if value.decision.action == "fail":
            raise FunctionFailed(f"Function {function.name!r} failed on {rows.name(i, inputs)}{late}: "
                                 f"{value.error!r} ({_decided(value.decision, value.attempt)})") from value.error
        out.append(None)
        errors.append(rows.error(i, repr(value.error) + late, value.traceback, value.attempt, value.decision.rule,
                                 value.error, inputs))
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
            decision = function.on_error.decide(err, 1, may_retry=False)  # the same value would come back
            if decision.action == "fail":
                raise FunctionFailed(f"{message} ({_decided(decision, 1)})") from err
            values.append(pa.nulls(1, function.output_type))
            errors.append(rows.error(i, message, format_exc(), 1, decision.rule, err, inputs))
    return (pa.concat_arrays(values) if values else pa.array([], function.output_type)), errors
