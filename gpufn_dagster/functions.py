"""The Function spec: a Python callable that computes one column (or several) of a LanceDB table.

This module is pure: it inspects the callable once (calling convention, inputs, output type,
version) so the refresh engine can call it without guessing. It follows lancedb's `udf`
conventions: a scalar function is called per row; parameters annotated `pyarrow.Array`, or a
single `pyarrow.RecordBatch` parameter, make it a batch function; a class is constructed once per
worker with its init values, called per row or batch, and `close()`d at the end.
"""

from __future__ import annotations

import enum
import hashlib
import inspect
import json
import re
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa

from .classes import DEFAULT_CLASS
from .code_version import code_digest

ErrorPolicy = Literal["fail", "skip"]
# Part of every Function version: bumped when what the engine stores per row changes (the
# signature scheme), so each column is recomputed once after such an upgrade, never compared
# across schemes.
STORAGE_FORMAT = 2
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PY_TO_ARROW: dict[Any, pa.DataType] = {
    int: pa.int64(), float: pa.float64(), str: pa.string(), bool: pa.bool_(), bytes: pa.binary(),
}


class FunctionDefinitionError(ValueError):
    """A Function's declaration does not fit its table, class or callable."""


class CallStyle(enum.Enum):
    ROW = "row"
    ARRAYS = "arrays"
    RECORD_BATCH = "record_batch"


def parse_arrow_type(spec: str) -> pa.DataType:
    """Arrow types by name, as YAML and `output_type="..."` spell them; raises ValueError for others.

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
    return pa.type_for_alias(text)


def _annotation_to_arrow(annotation: Any) -> pa.DataType | None:
    if annotation in _PY_TO_ARROW:
        return _PY_TO_ARROW[annotation]
    origin = typing.get_origin(annotation)
    if origin in (list, Sequence):
        (item,) = typing.get_args(annotation) or (None,)
        inner = _annotation_to_arrow(item)
        return pa.list_(inner) if inner is not None else None
    if origin is typing.Annotated:
        for extra in typing.get_args(annotation)[1:]:
            if isinstance(extra, pa.DataType):
                return extra
    return None


def _unwrap(target: Any) -> Any:
    """The original callable behind a `lancedb.udf` definition (or the target itself)."""
    original = getattr(target, "_function", None)
    return original if getattr(target, "registration_request", None) is not None and original is not None else target


@dataclass(frozen=True)
class Function:
    """Everything the refresh engine and the launcher need to know about one Function column."""

    name: str
    table: str
    columns: tuple[str, ...]
    output_type: pa.DataType
    inputs: tuple[str, ...]
    call_style: CallStyle
    target: Any
    is_class: bool
    init: Mapping[str, Any]
    gpu: bool
    gpu_class: str
    gpu_count: int
    batch_size: int
    on_error: ErrorPolicy
    version: str
    source_asset: str
    description: str | None = None
    group_name: str | None = None
    checkpoint_seconds: float = 10.0

    @property
    def sig_column(self) -> str:
        """Hidden column holding, per row, the digest of the Function version and the inputs used."""
        return f"_gpufn_sig_{self.columns[0]}"

    @property
    def output_fields(self) -> list[pa.Field]:
        if len(self.columns) == 1:
            return [pa.field(self.columns[0], self.output_type)]
        return [pa.field(name, f.type) for name, f in zip(self.columns, self.output_type, strict=True)]

    def open(self) -> Callable[..., Any]:
        """Construct the callable a worker uses (a class is instantiated once, with its init values)."""
        return self.target(**self.init) if self.is_class else self.target


def _arrow_class(annotation: Any) -> Any:
    """pa.Array / pa.RecordBatch even when the annotation is an unresolved string ('pa.Array')."""
    if isinstance(annotation, str):
        return {"Array": pa.Array, "RecordBatch": pa.RecordBatch}.get(annotation.rsplit(".", 1)[-1], annotation)
    return annotation


def _call_signature(target: Any, is_class: bool) -> inspect.Signature:
    fn = target.__call__ if is_class else target
    sig = inspect.signature(fn)
    if is_class:
        params = list(sig.parameters.values())[1:]  # drop self
        sig = sig.replace(parameters=params)
    return sig


def _hints(target: Any, is_class: bool) -> dict[str, Any]:
    try:
        return typing.get_type_hints(target.__call__ if is_class else target, include_extras=True)
    except Exception:  # unresolved forward references: fall back to raw annotations
        return {}


def _init_signature(cls: type) -> inspect.Signature:
    sig = inspect.signature(cls.__init__)
    return sig.replace(parameters=list(sig.parameters.values())[1:])


def _check_parameters(label: str, sig: inspect.Signature, names: list[str], field_name: str = "inputs") -> None:
    """The callable is called with exactly these keyword arguments: each must be a parameter it
    takes, and each parameter it requires must be among them."""
    params = sig.parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    named = {n: p for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    for name in names:
        if name not in named and not takes_any:
            raise FunctionDefinitionError(
                f"{label}: field '{field_name}': {name!r} is not a parameter of the callable, which takes "
                f"{', '.join(named) or 'no keyword parameters'}; rename the parameter or set {field_name}=[...] "
                "to match")
    for name, param in params.items():
        if param.kind is param.POSITIONAL_ONLY or (
                name not in names and param.default is param.empty
                and param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY)):
            raise FunctionDefinitionError(
                f"{label}: parameter {name!r}: the callable requires it, but {field_name} "
                f"{names} does not supply it (every parameter is passed by name)")


def _inferred_output_type(label: str, target: Any, style: CallStyle, annotation: Any) -> pa.DataType:
    """The column type from a lancedb.udf signature or a row Function's return annotation.

    A batch Function's return annotation describes the whole batch, not one value, so its
    column type must be given (output_type=, or Annotated[..., pa.<type>]).
    """
    output_type = None
    request = getattr(target, "registration_request", None)
    if request is not None and request.signature.output.arrow_type:
        try:  # lancedb spells types the way YAML does ('int64', 'utf8', 'list<float64>')
            output_type = parse_arrow_type(request.signature.output.arrow_type)
        except (ValueError, KeyError):
            output_type = None
    if output_type is None:
        if style is CallStyle.ROW or typing.get_origin(annotation) is typing.Annotated:
            output_type = _annotation_to_arrow(annotation)
        else:
            raise FunctionDefinitionError(
                f"{label}: field 'output_type': a batch Function (pyarrow parameters) must declare the Arrow type "
                "of one value it returns, e.g. output_type=pa.float32(); its return annotation describes the batch")
    if output_type is None:
        raise FunctionDefinitionError(
            f"{label}: field 'output_type': cannot infer the Arrow type from the return annotation; pass output_type=")
    return output_type


def make_function(
    target: Any,
    *,
    table: str,
    column: str | Sequence[str],
    output_type: pa.DataType | None = None,
    inputs: Sequence[str] | None = None,
    gpu: bool | None = None,
    gpu_class: str | None = None,
    gpu_count: int = 1,
    batch_size: int = 1024,
    on_error: ErrorPolicy = "fail",
    init: Mapping[str, Any] | None = None,
    name: str | None = None,
    source_asset: str | None = None,
    version: str | None = None,
    description: str | None = None,
    group_name: str | None = None,
    checkpoint_seconds: float = 10.0,
) -> Function:
    """Inspect a plain callable, class, or `lancedb.udf` definition and build its Function spec."""
    original = _unwrap(target)
    is_class = inspect.isclass(original)
    label = f"Function {name or getattr(original, '__name__', '?')!r}"
    columns = (column,) if isinstance(column, str) else tuple(column)
    for col in (*columns, table):
        if not _IDENTIFIER.match(col):
            raise FunctionDefinitionError(f"{label}: field 'column'/'table': {col!r} is not a plain identifier")
    if on_error not in ("fail", "skip"):
        raise FunctionDefinitionError(f"{label}: field 'on_error': must be 'fail' or 'skip', got {on_error!r}")
    if batch_size < 1:
        raise FunctionDefinitionError(f"{label}: field 'batch_size': must be at least 1")
    if gpu_count < 0:
        raise FunctionDefinitionError(f"{label}: field 'gpu_count': must not be negative")
    if isinstance(output_type, str):
        try:
            output_type = parse_arrow_type(output_type)
        except (ValueError, KeyError) as err:
            raise FunctionDefinitionError(
                f"{label}: field 'output_type': {output_type!r} is not an Arrow type ({err}); use e.g. 'int64', "
                "'string', 'list<float32>', 'fixed_size_list<float32>[384]' or a pyarrow type") from None
    elif output_type is not None and not isinstance(output_type, pa.DataType):
        raise FunctionDefinitionError(f"{label}: field 'output_type': expected a pyarrow type or its name, got "
                                      f"{type(output_type).__name__}")

    sig = _call_signature(original, is_class)
    hints = _hints(original, is_class)
    params = [p for p in sig.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    annotations = [_arrow_class(hints.get(p.name, p.annotation)) for p in params]
    if len(params) == 1 and annotations[0] is pa.RecordBatch:
        style = CallStyle.RECORD_BATCH
        if not inputs:
            raise FunctionDefinitionError(f"{label}: field 'inputs': a RecordBatch Function must name its input columns")
    elif params and all(a is pa.Array for a in annotations):
        style = CallStyle.ARRAYS
    else:
        style = CallStyle.ROW
    if inputs is None:
        inputs = [p.name for p in params]
    if not inputs:
        raise FunctionDefinitionError(f"{label}: field 'inputs': the Function reads no column")
    if style is not CallStyle.RECORD_BATCH:
        _check_parameters(label, sig, list(inputs))

    if output_type is None:
        output_type = _inferred_output_type(label, target, style, hints.get("return", sig.return_annotation))
    if len(columns) > 1 and (not pa.types.is_struct(output_type) or output_type.num_fields != len(columns)):
        raise FunctionDefinitionError(
            f"{label}: field 'column': {len(columns)} columns need a struct output with {len(columns)} fields, "
            f"got {output_type}"
        )
    if gpu is None:
        request = getattr(target, "registration_request", None)
        gpu = bool(request.runtime.gpu) if request is not None else gpu_class is not None
    if gpu and gpu_count < 1:
        raise FunctionDefinitionError(
            f"{label}: field 'gpu_count': a GPU Function needs at least 1 GPU, got {gpu_count}; leave out gpu_class "
            "(and gpu) for a CPU Function")
    if own := sorted(set(columns) & set(inputs)):
        raise FunctionDefinitionError(
            f"{label}: field 'column': {', '.join(map(repr, own))} is also an input of the Function; a Function "
            "cannot write the column it reads")
    init = dict(init or {})
    if is_class:
        _check_parameters(label, _init_signature(original), list(init), field_name="init")
    # Version: the code (or the version the user pins) plus every option that changes values;
    # changing any of them makes every row stale. The error policy does not change a computed
    # value, so switching it recomputes nothing.
    payload = json.dumps(
        {"code": f"pinned:{version}" if version is not None else code_digest(original), "inputs": list(inputs),
         "columns": list(columns), "type": str(output_type), "init": init, "format": STORAGE_FORMAT},
        sort_keys=True, default=repr,
    )
    return Function(
        name=name or f"{table}__{columns[0]}",
        table=table,
        columns=columns,
        output_type=output_type,
        inputs=tuple(inputs),
        call_style=style,
        target=original,
        is_class=is_class,
        init=init,
        gpu=gpu,
        gpu_class=gpu_class or DEFAULT_CLASS,
        gpu_count=gpu_count if gpu else 0,
        batch_size=batch_size,
        on_error=on_error,
        version=hashlib.sha256(payload.encode()).hexdigest()[:16],
        source_asset=source_asset or table,
        description=description or inspect.getdoc(original),
        group_name=group_name,
        checkpoint_seconds=checkpoint_seconds,
    )
