"""Functions as Dagster assets: materializing one refreshes its column.

The asset carries its GPU class as tags (`gpufn/gpu-class`, `gpufn/gpu-count`) on the asset and
on its op: the GPU request, which the run launcher reads from the run's steps and places when the
run launches (never when the code loads); the UI shows them and the kinds (`lance`, `gpu`/`cpu`). The Function spec itself
rides on the asset under one metadata key (`FUNCTION_METADATA_KEY`, as dagster-dbt and
dagster-sling carry their manifest and translator), so `function_of(asset)` reads it back from
the asset and no registry outside the definitions can go stale or be silently replaced.
"""

import inspect
import logging
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import dagster as dg

from ..class_files import cached_gpu_classes, ClassesDir, resolve_classes_dir
from ..class_requests import accept, ClassNow
from ..classes import GpuClass
from ..errors import ClassRequestError, FunctionDefinitionError, GpuClassError
from ..refresh.engine import ColumnRefresh, RefreshOptions
from ..refresh.files import TableFiles
from ..refresh.progress import Progress
from ..refresh.results import RefreshResult
from ..embedded.warm import warm_instances
from .executor import steps_in_this_process
from ..embedded.slots import StepClass, step_slot
from ..function_spec.code_version import getsourcelines
from ..function_spec.error_policy import ErrorPolicy
from ..function_spec.functions import Function, check_options, make_function
from ..function_spec.options import document_options
from ..tags import (CLASS_CHOICE_SEPARATOR, DECLARED_IN_METADATA_KEY, FUNCTION_METADATA_KEY, GPU_COUNT_TAG, READS_METADATA_KEY,
                    gpu_pool, gpu_tags)
from .asset_spec import function_metadata, reads, reads_metadata, with_freshness
from .fanout_asset import fanout_asset
from .changed_partitions import unfilled_filter
from .reporting import (INTERRUPTS, WorkerFigures, partition_figures, projection, record_errors, refresh_metadata,
                        report_terminated)
from .resources import LanceDBResource
from .run_slice import run_slice, spans_partitions
from .table_partitions import partitions_asset_key

logger = logging.getLogger(__name__)


def resolve_class(function: Function, classes_dir: ClassesDir = None) -> tuple[GpuClass, ...]:
    """The GPU classes the Function accepts, first choice first, by the one rule of class requests
    (`class_requests.accept`), refused naming the Function, the field and the class directory."""
    directory = resolve_classes_dir(classes_dir)
    try:
        return accept(function.gpu_classes, function.gpu_count, cached_gpu_classes(directory))
    except ClassRequestError as err:
        raise FunctionDefinitionError(f"Function {function.name!r}: {err} (class files in {directory})") from None


def _code_references(function: Function) -> dict[str, Any]:
    """`dagster/code_references`: the Function's source file and line, as the asset page links them."""
    try:
        file = inspect.getsourcefile(function.target)
        _, line = getsourcelines(function.target)
    except (OSError, TypeError):  # a builtin, or code without a file
        return {}
    if file is None:
        return {}
    with warnings.catch_warnings():  # code references are marked beta; the warning would repeat on every load
        warnings.simplefilter("ignore", dg.BetaWarning)
        return {"dagster/code_references": dg.CodeReferencesMetadataValue(code_references=[
            dg.LocalFileCodeReference(file_path=os.path.abspath(file), line_number=line,
                                      label=function.target.__qualname__)])}


def _column_schema(function: Function) -> dg.TableSchema:
    """`dagster/column_schema` of what the Function writes: its output column(s), typed as in the table."""
    source = f"computed by {function.name} from {', '.join(function.inputs)}"
    return dg.TableSchema(columns=[dg.TableColumn(f.name, str(f.type), description=source)
                                   for f in function.output_fields])


def _class_metadata(accepted: tuple[GpuClass, ...]) -> dict[str, Any]:
    """The class's hardware, as the asset page shows it beside the class name (of several classes
    accepted in order: each figure of each, in that order, and no single price)."""
    if len(accepted) > 1:
        return {"gpu_model": " or ".join(c.gpu_model for c in accepted),
                "gpu_memory_gib": " or ".join(f"{c.gpu_memory_bytes / 2**30:.1f}" for c in accepted),
                "local_slots": sum(c.local.slots for c in accepted)}
    if not accepted:
        return {}
    gpu_class = accepted[0]
    return {"gpu_model": gpu_class.gpu_model, "gpu_memory_gib": round(gpu_class.gpu_memory_bytes / 2**30, 1),
            "local_slots": gpu_class.local.slots,
            **({"price_per_gpu_hour": dg.FloatMetadataValue(gpu_class.price_per_gpu_hour)}
               if gpu_class.price_per_gpu_hour is not None else {})}


def _asset_metadata(function: Function, declared_in: str | None, accepted: tuple[GpuClass, ...] = ()) -> dict[str, Any]:
    """What the asset page shows about the Function, plus the spec itself under its key."""
    return {
        "table": function.table,
        "columns": ", ".join(function.columns),
        "inputs": ", ".join(function.inputs),
        "output_type": str(function.output_type),
        "function_version": function.version,
        "batch_size": (f"{function.batch_size}, adapting up to {function.max_batch_size}"
                       if function.options.adapt_batch_size else f"{function.batch_size} (pinned)"),
        "on_error": str(function.on_error),
        **({"row_timeout_seconds": function.options.row_timeout_seconds} if function.options.row_timeout_seconds else {}),
        **({"workers": function.options.workers} if function.options.workers > 1 else {}),
        **({"partitioned_by": _partitioned_by(function)} if function.partitioning else {}),
        **({"gpu_class": function.gpu_class, "gpu_count": function.gpu_count} if function.gpu else {}),
        **_class_metadata(accepted),
        "dagster/column_schema": _column_schema(function),
        **({} if declared_in else _code_references(function)),  # a YAML Function's page links its defs.yaml
        **({DECLARED_IN_METADATA_KEY: declared_in} if declared_in else {}),
        FUNCTION_METADATA_KEY: function_metadata(function),
    }



def _partitioned_by(function: Function) -> str:
    """The asset page's line on what a partition is."""
    partitioning = function.partitioning
    if partitioning.template is not None:
        return f"filter {partitioning.template}"
    return "column " + (partitioning.column if isinstance(partitioning.column, str) else
                        ", ".join(f"{c} ({d})" for d, c in partitioning.column.items()))


def run_config_schema(function: Function) -> dict[str, dg.Field]:
    """What a run may change of a one-worker Function (the Launchpad's `ops: <name>: config:`): only
    what changes no computed value and no placement, so a run can never make rows current under a
    version they were not computed with, or a pod the launcher did not place. GPU class and count,
    inputs, output and version are the definition's (they decide placement or values); `workers` is
    the asset's shape (a Function declared with workers > 1 takes it on its plan step). Any other
    key is refused before the run starts, naming the Function's op and the key. An unpartitioned
    Function also takes `where`: a pilot of the rows a Lance filter selects."""
    pilot = {} if function.partitioning is not None else {
        "where": dg.Field(dg.Noneable(str), default_value=None, description=(
            "A pilot: refresh only the rows this Lance filter selects (\"source = 'news'\"); they stay current, so "
            "the full refresh skips them, and the run reports a projection for the rest of the table."))}
    return {
        **pilot,
        "on_error": dg.Field(dg.Enum("OnError", [dg.EnumValue(v) for v in ("declared", "fail", "skip")]),
                             default_value=function.on_error.shorthand or "declared", description=(
                                 "'declared': the Function's own rules; 'fail' stops at the first failing row; "
                                 "'skip' leaves it NULL and records it in gpufn_errors (computed values do not "
                                 "depend on it).")),
        "batch_size": dg.Field(int, default_value=function.max_batch_size, description=(
            "The most rows one call takes this run (the model's, device's or API's limit).")),
        "checkpoint_seconds": dg.Field(float, default_value=function.options.checkpoint_seconds, description=(
            "How much work a killed refresh may repeat, in seconds (0: checkpoint every call).")),
        "publish_every_rows": dg.Field(dg.Noneable(int), default_value=function.options.publish_every_rows, description=(
            "Publish finished fragments in an intermediate table version whenever this many rows are done.")),
    }


def for_this_run(function: Function, config: Mapping[str, Any]) -> Function:
    """The Function with the run's config applied (its version, which no such field changes, kept),
    checked by the declaration's own bounds (`functions.check_options`), so a run cannot set what a
    declaration could not."""
    label = f"Function {function.name!r}: run config"
    ceiling = int(config.get("batch_size", function.max_batch_size))
    options = replace(function.options, max_batch_size=ceiling, batch_size=min(function.batch_size, ceiling),
                      **{name: config[name] for name in ("checkpoint_seconds", "publish_every_rows") if name in config})
    check_options(label, options, function.columns)
    on_error = config.get("on_error", "declared")
    return replace(function, options=options, max_batch_size=ceiling, batch_size=options.batch_size,
                   on_error=function.on_error if on_error == "declared" else ErrorPolicy.of(on_error, label))


def _materialize(context: dg.AssetExecutionContext, lancedb: LanceDBResource, function: Function,
                 class_now: ClassNow) -> dg.MaterializeResult:
    """One materialization: refresh the column, record failed rows, report what happened."""
    function = for_this_run(function, context.op_execution_context.op_config or {})
    with step_slot(context, class_now(), function.gpu_count) as step:
        return _refresh_once(context, lancedb, function, step)


def _refresh_once(context: dg.AssetExecutionContext, lancedb: LanceDBResource, function: Function,
                  step: StepClass) -> dg.MaterializeResult:
    context.log.info(f"refreshing {function.table}.{','.join(function.columns)} "
                     f"(Function version {function.version}"
                     + (f", GPU class {step.describe()} x{function.gpu_count})" if function.gpu else ", CPU)"))
    def report(progress: Progress) -> None:
        context.log.info(f"{function.name}: {progress.line()}")

    files = lancedb.table_files(function.table)
    where = run_slice(context, function, files) or (context.op_execution_context.op_config or {}).get("where")
    if where is not None:
        label = f"partition {', '.join(context.partition_keys)}" if function.partitioning else "pilot"
        context.log.info(f"{label}: the rows where {where}")
    ranged = spans_partitions(context)
    column = ColumnRefresh(files, function, RefreshOptions(
        report=report, upstream=reads(context.assets_def), holder=f"run {context.run.run_id}", where=where,
        on_wait=context.log.info, keep_rows=ranged,
        instances=warm_instances(step.gpu_class, step.held, context.log.info, steps_in_this_process())))
    try:
        result = column.refresh()
    except INTERRUPTS:
        report_terminated(context, function, column.rows_checkpointed())
        raise
    record_errors(lancedb, function, result, context.run.run_id)
    gpu_class = step.billed(context.instance, context.run.run_id)
    metadata = refresh_metadata(function, gpu_class, result)
    if (adopted := WorkerFigures.of(function, result).adopted()) is not None:
        context.log.info(f"{function.name}: {adopted}")
    if where is not None:
        metadata["partition_filter" if function.partitioning else "pilot_filter"] = where
        metadata.update(_projected(context, function, gpu_class, result, files))
    if ranged:  # each partition of a single-run backfill: its own rows and filter
        for key, figures in partition_figures(function, files.dataset(result.version_before), context.partition_keys,
                                              metadata, result.computed_rows, result.errors).items():
            context.add_asset_metadata(figures, partition_key=key)
    return dg.MaterializeResult(metadata=metadata)


def _projected(context: dg.AssetExecutionContext, function: Function, gpu_class: GpuClass | None,
               result: RefreshResult, files: TableFiles) -> dict[str, Any]:
    """After a slice (a partition, a pilot): what the rest of the table would take at this run's rate."""
    dataset = files.dataset()
    unfilled = unfilled_filter(function, dataset)
    figures = projection(function, gpu_class, result.rows_computed, result.compute_seconds,
                         dataset.count_rows(filter=unfilled))
    if figures:
        extras = [f"{figures['projected_gpu_hours'].value:.2f} GPU-hours"] if "projected_gpu_hours" in figures else []
        extras += [f"${figures['projected_cost_usd'].value:.2f}"] if "projected_cost_usd" in figures else []
        context.log.info(f"{function.name}: the rest of table {function.table!r}, {figures['projected_rows_left']:,} "
                         f"rows not computed yet, would take {figures['projected_hours'].value:.2f} h"
                         + (f" ({', '.join(extras)})" if extras else "") + " at this run's rate")
    return figures


def _class_at_load(function: Function, classes_dir: ClassesDir) -> tuple[GpuClass, ...]:
    """The Function's classes checked while definitions load (an unknown class or too many GPUs fails
    the load, naming the Function). A class directory that does not load at all does not fail the
    code location: its CPU assets and other Functions' runs go on, and only runs that need a GPU
    class are held or refused, each saying why, until the files are fixed."""
    if not function.gpu:
        return ()
    try:
        return resolve_class(function, classes_dir)
    except GpuClassError as err:
        logger.warning(f"Function {function.name!r}: the GPU class files do not load, so its runs wait (embedded) "
                       f"or are refused (Kubernetes) until they do: {err}")
        return ()


def function_asset(function: Function, *, declared_in: str | None = None,
                   upstream: Mapping[dg.AssetKey, Function] | None = None,
                   observed: Sequence[dg.AssetKey] = ()) -> dg.AssetsDefinition:
    """A Dagster asset whose materialization refreshes the Function's column.

    Args:
        function: the spec (see `make_function`); its class is checked against the class files of its
            `classes_dir` option (default `$GPUFN_CLASSES_DIR` or `./classes`).
        declared_in: the file that declared it (YAML), named in load errors.
        upstream: the Function assets whose columns it reads (`build_definitions` finds them):
            it depends on them and its refresh refuses to start while one is not current.
        observed: the observed rows of its table it also depends on (`table_partitions.rows_asset_key`;
            `build_definitions` adds it for a Function with an automation condition).
    """
    directory = function.options.classes_dir
    at_load = _class_at_load(function, directory)

    def class_now() -> tuple[GpuClass, ...]:
        if not function.gpu:
            return ()
        try:
            return resolve_class(function, directory)
        except GpuClassError:
            if not at_load:
                raise
            return at_load  # the files broke after the code loaded: a started step keeps the classes it had

    metadata = _asset_metadata(function, declared_in, at_load)
    if upstream:
        metadata[READS_METADATA_KEY] = reads_metadata(tuple(upstream.values()))
    tags = gpu_tags(function.gpu_class, function.gpu_count) if function.gpu else {GPU_COUNT_TAG: "0"}
    # An asset tag's value is label-like and cannot hold a choice of classes: the op tags (what the
    # launcher and coordinator read) and the asset's metadata name them all.
    asset_tags = {k: v for k, v in tags.items() if CLASS_CHOICE_SEPARATOR not in v}

    pool = gpu_pool(function.gpu_class) if function.gpu else None
    # after the Functions it reads, and a partitioned one after its table's rows per partition
    # (`table_partitions`), so a partition whose rows changed shows unsynced
    after = [*(upstream or ()), *([partitions_asset_key(function)] if function.partitioning else []), *observed]
    attributes = function.attributes.merged(f"Function {function.name!r}", asset_tags, metadata,
                                            {"lance", "gpu" if function.gpu else "cpu"})
    if function.options.workers > 1:
        return with_freshness(fanout_asset(function, class_now, tags=tags, attributes=attributes, pool=pool,
                                           upstream=after), function.attributes)

    with warnings.catch_warnings():  # `backfill_policy` is marked beta; the warning would repeat on every load
        warnings.simplefilter("ignore", dg.BetaWarning)
        warnings.simplefilter("ignore", DeprecationWarning)  # legacy_freshness_policy, when declared
        return with_freshness(_one_worker_asset(function, class_now, tags, pool, attributes, after), function.attributes)


def _one_worker_asset(function: Function, class_now: ClassNow, tags: dict[str, str], pool: str | None,
                      attributes: dict[str, Any], after: Sequence[dg.AssetKey]) -> dg.AssetsDefinition:
    @dg.asset(
        key=function.asset_key,
        deps=[function.source_key, *after],
        op_tags=tags,  # the GPU request: the launcher places the pod when a run launches
        # Embedded mode: a GPU step claims a slot of its class's pool, limited to `local.slots`.
        pool=pool,
        code_version=function.version,
        description=function.description,
        group_name=function.options.group_name,
        config_schema=run_config_schema(function),
        partitions_def=function.partitions_def,
        backfill_policy=function.options.backfill_policy,
        **attributes,  # tags, metadata, kinds, owners, automation condition: gpufn's and the declaration's
    )
    def _refresh(context: dg.AssetExecutionContext, lancedb: LanceDBResource) -> dg.MaterializeResult:
        return _materialize(context, lancedb, function, class_now)

    return _refresh


@document_options
def gpu_function(**options: Any) -> Callable[[Any], dg.AssetsDefinition]:
    """Decorate a function, class or `lancedb.udf` definition to make it a Function asset.

    A Function is a GPU Function when `gpu=True`, when it names a `gpu_class`, or when its
    `lancedb.udf` definition says `gpu=True`; one without a class runs on the `default` class.
    The same options declare a Function in YAML (`gpufn_dagster.components.FunctionColumn`).

    Args:
        {options}

    Example:
        >>> import pyarrow as pa
        >>> @gpu_function(table="docs", column="embedding", output_type=pa.list_(pa.float32(), 2),
        ...               gpu_class="l4", batch_size=256)
        ... def embed(text: pa.Array) -> pa.Array:
        ...     return pa.array([[float(len(t)), 0.0] for t in text.to_pylist()], pa.list_(pa.float32(), 2))
        >>> from gpufn_dagster import function_of
        >>> embed.key.to_user_string(), embed.op.tags["gpufn/gpu-class"], function_of(embed).max_batch_size
        ('docs__embedding', 'l4', 256)
    """

    def decorate(target: Any) -> dg.AssetsDefinition:
        return function_asset(make_function(target, **options))

    return decorate
