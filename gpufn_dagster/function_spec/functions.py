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
from typing import Any

import dagster as dg
import pyarrow as pa

from ..classes import DEFAULT_CLASS
from ..errors import FunctionDefinitionError
from ..tags import choice_request, class_choice
from .arrow_types import parse_arrow_type
from .asset_attributes import AssetAttributes
from .code_version import code_digest, signature
from .error_policy import ErrorPolicy
from .options import FunctionOptions, document_options
from .partitions import Partitioning, partitioning_of
from .target import TargetRef, unwrap
# Part of every Function version: bumped when what the engine stores per row changes (the
# signature scheme), so each column is recomputed once after such an upgrade, never compared
# across schemes.
STORAGE_FORMAT = 2
MAX_BATCH_SIZE = 4096  # the default ceiling of adapting calls: a GPU is full long before, memory stays small
PROBE_ROWS = 64  # the first call's rows when nothing says less: first values and errors within seconds
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PY_TO_ARROW: dict[Any, pa.DataType] = {
    int: pa.int64(), float: pa.float64(), str: pa.string(), bool: pa.bool_(), bytes: pa.binary(),
}


class CallStyle(enum.Enum):
    ROW = "row"
    ARRAYS = "arrays"
    RECORD_BATCH = "record_batch"


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


def _class_request(label: str, gpu_class: str | list[str] | None) -> str:
    """The GPU request's class text: one class, or several accepted in order (`tags.choice_request`).

    >>> _class_request("f", ["h100-80gb", "a100-80gb"]), _class_request("f", None)
    ('h100-80gb|a100-80gb', 'default')
    """
    if gpu_class is None or isinstance(gpu_class, str):
        return gpu_class or DEFAULT_CLASS
    names = list(gpu_class)
    if not names or not all(isinstance(name, str) and name for name in names):
        raise FunctionDefinitionError(f"{label}: field 'gpu_class': a list of GPU class names in order of "
                                      f"preference, got {gpu_class!r}")
    if len(set(names)) < len(names):
        raise FunctionDefinitionError(f"{label}: field 'gpu_class': {names} names a class twice")
    return choice_request(names)


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
    gpu_class: str  # the class, or the classes accepted in order ("h100-80gb|a100-80gb", `gpu_classes`)
    gpu_count: int
    batch_size: int
    on_error: ErrorPolicy
    version: str
    source_asset: str
    max_batch_size: int  # the most rows one call takes (batch_size is the first call's)
    # The declaration as given (checked; a run's config may set some, `function_asset.for_this_run`):
    # what the Function does not derive, it reads here --
    # checkpoint_seconds, workers, max_gpus, publish_every_rows, row_timeout_seconds, the failure
    # budget, classes_dir, backfill_policy, group_name.
    options: FunctionOptions
    description: str | None = None  # the declared one, else the callable's docstring
    partitioning: Partitioning | None = None  # its Dagster partitions and the slice of the table each one is
    attributes: AssetAttributes = AssetAttributes()  # the rest of its asset's attributes, as declared

    @property
    def asset_key(self) -> dg.AssetKey:
        """Its asset's key: `[*key_prefix, name]`."""
        return dg.AssetKey([*self.attributes.key_prefix, self.name])

    @property
    def source_key(self) -> dg.AssetKey:
        """The key of the asset producing its table (`source_asset`, a key as the UI writes it: 'lake/docs')."""
        return dg.AssetKey.from_user_string(self.source_asset)

    @property
    def op_name(self) -> str:
        """The name of its asset's op (the step key of a one-worker Function), unique per asset key
        as Dagster derives it ('docs__embedding'; 'lake__docs__embedding' under key_prefix 'lake')."""
        return self.asset_key.to_python_identifier()

    @property
    def partitions_def(self) -> Any:
        """Dagster's partitions definition of the Function's asset and its checks (None: unpartitioned)."""
        return self.partitioning.partitions_def if self.partitioning is not None else None

    @property
    def gpu_classes(self) -> tuple[str, ...]:
        """The GPU classes the Function accepts, first choice first (one for most Functions)."""
        return class_choice(self.gpu_class)

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

    # A Function is sent to another process (its local slot's warm instance) with its callable by
    # reference to where it is defined (`target.TargetRef`): the name a decorator rebound to the
    # asset resolves back to the callable there. Copies within a process share the spec (it is frozen).
    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "target": TargetRef.of(self.target)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        target = state["target"]
        for name, value in {**state, "target": target.resolve() if isinstance(target, TargetRef) else target}.items():
            object.__setattr__(self, name, value)

    def __copy__(self) -> Function:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Function:
        return self


def _arrow_class(annotation: Any) -> Any:
    """pa.Array / pa.RecordBatch even when the annotation is an unresolved string ('pa.Array')."""
    if isinstance(annotation, str):
        return {"Array": pa.Array, "RecordBatch": pa.RecordBatch}.get(annotation.rsplit(".", 1)[-1], annotation)
    return annotation


def _call_signature(target: Any, is_class: bool) -> inspect.Signature:
    fn = target.__call__ if is_class else target
    sig = signature(fn)
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
    sig = signature(cls.__init__)
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
        except ValueError:
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


def _checked_output_type(label: str, output_type: Any) -> pa.DataType | None:
    """The declared output type as a pyarrow type (None when it is to be inferred)."""
    if isinstance(output_type, str):
        try:
            return parse_arrow_type(output_type)
        except ValueError as err:
            raise FunctionDefinitionError(f"{label}: field 'output_type': {err}") from None
    if output_type is not None and not isinstance(output_type, pa.DataType):
        raise FunctionDefinitionError(f"{label}: field 'output_type': expected a pyarrow type or its name, got "
                                      f"{type(output_type).__name__}")
    return output_type


def check_options(label: str, options: FunctionOptions, columns: tuple[str, ...]) -> None:
    """What can be said about the options alone, before looking at the callable: the one place of
    their bounds, which a declaration (`make_function`) and a run's config (`function_asset.for_this_run`)
    both pass. (`on_error` is checked where it is built, `ErrorPolicy.of`.)"""
    for name in (*columns, options.table):
        if not _IDENTIFIER.match(name):
            raise FunctionDefinitionError(f"{label}: field 'column'/'table': {name!r} is not a plain identifier")
    if options.checkpoint_seconds < 0:
        raise FunctionDefinitionError(f"{label}: field 'checkpoint_seconds': must not be negative, "
                                      f"got {options.checkpoint_seconds}")
    if options.row_timeout_seconds is not None and not options.row_timeout_seconds > 0:
        raise FunctionDefinitionError(f"{label}: field 'row_timeout_seconds': must be above 0, "
                                      f"got {options.row_timeout_seconds}")
    if options.max_failed_rows is not None and options.max_failed_rows < 0:
        raise FunctionDefinitionError(f"{label}: field 'max_failed_rows': must not be negative, "
                                      f"got {options.max_failed_rows}")
    if options.max_failed_fraction is not None and not 0 <= options.max_failed_fraction <= 1:
        raise FunctionDefinitionError(f"{label}: field 'max_failed_fraction': must be between 0 and 1, "
                                      f"got {options.max_failed_fraction}")
    if options.batch_size is not None and options.batch_size < 1:
        raise FunctionDefinitionError(f"{label}: field 'batch_size': must be at least 1")
    if options.max_batch_size is not None and options.max_batch_size < (options.batch_size or 1):
        raise FunctionDefinitionError(
            f"{label}: field 'max_batch_size': must be at least batch_size ({options.batch_size or 1}), "
            f"got {options.max_batch_size}")
    if options.gpu_count < 0:
        raise FunctionDefinitionError(f"{label}: field 'gpu_count': must not be negative")
    if options.publish_every_rows is not None and options.publish_every_rows < 1:
        raise FunctionDefinitionError(f"{label}: field 'publish_every_rows': must be at least 1, "
                                      f"got {options.publish_every_rows}")
    if options.workers < 1:
        raise FunctionDefinitionError(f"{label}: field 'workers': must be at least 1, got {options.workers}")
    if options.max_gpus is not None and options.max_gpus < max(options.gpu_count, 1):
        raise FunctionDefinitionError(f"{label}: field 'max_gpus': must be at least gpu_count "
                                      f"({max(options.gpu_count, 1)}), got {options.max_gpus}")


def _call_sizes(options: FunctionOptions) -> tuple[int, int]:
    """(rows of the first call, most rows of any call) from batch_size and max_batch_size.

    An explicit `batch_size` alone is a ceiling, as in lancedb and Geneva (the most the model, device
    or API takes): the probe starts at or below it and calls never exceed it. With `max_batch_size`
    too, `batch_size` is only the probe.

    >>> opts = lambda **o: FunctionOptions(table="t", column="c", **o)
    >>> _call_sizes(opts()), _call_sizes(opts(batch_size=16)), _call_sizes(opts(batch_size=256))
    ((64, 4096), (16, 16), (64, 256))
    >>> _call_sizes(opts(batch_size=16, max_batch_size=512)), _call_sizes(opts(batch_size=256, adapt_batch_size=False))
    ((16, 512), (256, 256))
    """
    if options.batch_size is None:
        return min(PROBE_ROWS, options.max_batch_size or PROBE_ROWS), options.max_batch_size or MAX_BATCH_SIZE
    if options.max_batch_size is not None:
        return options.batch_size, options.max_batch_size
    first = options.batch_size if not options.adapt_batch_size else min(PROBE_ROWS, options.batch_size)
    return first, options.batch_size


def _call_style(label: str, params: list[inspect.Parameter], annotations: list[Any],
                inputs: Sequence[str] | None) -> CallStyle:
    """Per row, per batch of arrays, or per RecordBatch -- lancedb's `udf` conventions."""
    if len(params) == 1 and annotations[0] is pa.RecordBatch:
        if not inputs:
            raise FunctionDefinitionError(f"{label}: field 'inputs': a RecordBatch Function must name its input columns")
        return CallStyle.RECORD_BATCH
    if params and all(a is pa.Array for a in annotations):
        return CallStyle.ARRAYS
    return CallStyle.ROW


def _version(original: Any, options: FunctionOptions, inputs: Sequence[str], columns: Sequence[str],
             output_type: pa.DataType, init: Mapping[str, Any]) -> str:
    """The code (or the version the user pins) plus every option that changes values.

    Changing any of them makes every row stale. The error policy does not change a computed value,
    so switching it recomputes nothing.
    """
    payload = json.dumps(
        {"code": f"pinned:{options.version}" if options.version is not None else code_digest(original),
         "inputs": list(inputs), "columns": list(columns), "type": str(output_type), "init": dict(init),
         "format": STORAGE_FORMAT},
        sort_keys=True, default=repr,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


@document_options
def make_function(target: Any, declared: FunctionOptions | None = None, /, **options: Any) -> Function:
    """Inspect a plain callable, class, or `lancedb.udf` definition and build its Function spec.

    Pure: it reads the callable's signature and code, never a table or the GPU classes.

    Args:
        target: the function, class or `lancedb.udf` definition.
        declared: the options as one `FunctionOptions` (what a YAML declaration is), instead of keywords.
        {options}

    Example:
        >>> def n_words(text: str) -> int:
        ...     return len(text.split())
        >>> spec = make_function(n_words, table="docs", column="n_words")
        >>> spec.name, spec.inputs, spec.output_type, spec.call_style.value, spec.gpu
        ('docs__n_words', ('text',), DataType(int64), 'row', False)
    """
    original = unwrap(target)
    name = declared.name if declared is not None else options.get("name")
    label = f"Function {name or getattr(original, '__name__', '?')!r}"
    if declared is not None and options:
        raise FunctionDefinitionError(f"{label}: options given both as FunctionOptions and as keywords "
                                      f"({', '.join(sorted(options))}); give them one way")
    opts = declared if declared is not None else FunctionOptions.of(options, label)
    is_class = inspect.isclass(original)
    columns = (opts.column,) if isinstance(opts.column, str) else tuple(opts.column)
    check_options(label, opts, columns)
    on_error = ErrorPolicy.of(opts.on_error, label)
    output_type = _checked_output_type(label, opts.output_type)

    sig = _call_signature(original, is_class)
    hints = _hints(original, is_class)
    params = [p for p in sig.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    style = _call_style(label, params, [_arrow_class(hints.get(p.name, p.annotation)) for p in params], opts.inputs)
    inputs = list(opts.inputs) if opts.inputs is not None else [p.name for p in params]
    if not inputs:
        raise FunctionDefinitionError(f"{label}: field 'inputs': the Function reads no column")
    if style is not CallStyle.RECORD_BATCH:
        _check_parameters(label, sig, inputs)

    if output_type is None:
        output_type = _inferred_output_type(label, target, style, hints.get("return", sig.return_annotation))
    if len(columns) > 1 and (not pa.types.is_struct(output_type) or output_type.num_fields != len(columns)):
        raise FunctionDefinitionError(
            f"{label}: field 'column': {len(columns)} columns need a struct output with {len(columns)} fields, "
            f"got {output_type}"
        )
    gpu = opts.gpu
    if gpu is None:
        request = getattr(target, "registration_request", None)
        gpu = bool(request.runtime.gpu) if request is not None else opts.gpu_class is not None
    if gpu and opts.gpu_count < 1:
        raise FunctionDefinitionError(
            f"{label}: field 'gpu_count': a GPU Function needs at least 1 GPU, got {opts.gpu_count}; leave out "
            "gpu_class (and gpu) for a CPU Function")
    if own := sorted(set(columns) & set(inputs)):
        raise FunctionDefinitionError(
            f"{label}: field 'column': {', '.join(map(repr, own))} is also an input of the Function; a Function "
            "cannot write the column it reads")
    first_call, most_rows = _call_sizes(opts)
    init = dict(opts.init or {})
    if is_class:
        _check_parameters(label, _init_signature(original), list(init), field_name="init")
    return Function(
        name=opts.name or f"{opts.table}__{columns[0]}",
        table=opts.table,
        columns=columns,
        output_type=output_type,
        inputs=tuple(inputs),
        call_style=style,
        target=original,
        is_class=is_class,
        init=init,
        gpu=gpu,
        gpu_class=_class_request(label, opts.gpu_class),
        gpu_count=opts.gpu_count if gpu else 0,
        batch_size=first_call,
        on_error=on_error,
        version=_version(original, opts, inputs, columns, output_type, init),
        source_asset=opts.source_asset or opts.table,
        options=opts,
        description=opts.description or inspect.getdoc(original),
        max_batch_size=most_rows,
        partitioning=partitioning_of(opts, label),
        attributes=AssetAttributes.of(opts, label),
    )
