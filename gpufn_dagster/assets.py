"""Functions as Dagster assets: materializing one refreshes its column.

The asset carries its GPU class as tags (`gpufn/gpu-class`, `gpufn/gpu-count`) on the asset and
on its op, so the run launcher can resolve placement from the asset graph and step launchers
from op tags; the UI shows them and the kinds (`lance`, `gpu`/`cpu`).
"""


import json
import os
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

import dagster as dg
import pyarrow as pa

from .classes import GpuClass, cached_gpu_classes, classes_dir
from .functions import ErrorPolicy, Function, FunctionDefinitionError, make_function
from .local import visible_devices
from .placement import Placement, placement_k8s_config
from .refresh.engine import Progress, RefreshResult, refresh_column
from .resources import LanceDBResource
from .tags import GPU_CLASS_TAG, GPU_COUNT_TAG, K8S_CONFIG_TAG, gpu_tags

# The Function spec behind each Function asset, by key; a later definition of a key replaces it.
_FUNCTIONS: dict[dg.AssetKey, Function] = {}
# Where a Function was declared when that was a YAML file (for error messages), by key.
DECLARED_IN: dict[dg.AssetKey, str] = {}

ERRORS_TABLE = "gpufn_errors"
# One row per failed row, and per retried row that then succeeded (outcome "succeeded"):
# `retried` says the row had failed in an earlier refresh.
ERRORS_SCHEMA = pa.schema([
    ("function", pa.string()), ("table", pa.string()), ("columns", pa.string()),
    ("function_version", pa.string()), ("run_id", pa.string()), ("row_address", pa.uint64()),
    ("error", pa.string()), ("traceback", pa.string()), ("recorded_at", pa.timestamp("us", tz="UTC")),
    ("retried", pa.bool_()), ("outcome", pa.string()),
])


def resolve_class(function: Function, directory: str | os.PathLike[str] | None = None) -> GpuClass:
    """The Function's GPU class, checked against the operator's classes (unknown class, too many GPUs)."""
    path = classes_dir(directory)
    classes = cached_gpu_classes(path)
    label = f"Function {function.name!r}"
    if function.gpu_class not in classes:
        raise FunctionDefinitionError(
            f"{label}: field 'gpu_class': unknown GPU class {function.gpu_class!r}; "
            f"classes in {path}: {', '.join(sorted(classes))}")
    gpu_class = classes[function.gpu_class]
    if function.gpu_count > gpu_class.max_gpu_count_per_worker:
        raise FunctionDefinitionError(
            f"{label}: field 'gpu_count': {function.gpu_count} GPUs exceeds class {gpu_class.name!r}'s "
            f"max_gpu_count_per_worker of {gpu_class.max_gpu_count_per_worker}")
    return gpu_class


def _record_errors(lancedb: LanceDBResource, function: Function, result: RefreshResult, run_id: str) -> None:
    if not result.errors and not result.recovered:
        return
    now = datetime.now(timezone.utc)
    common = {"function": function.name, "table": function.table, "columns": ",".join(function.columns),
              "function_version": function.version, "run_id": run_id, "recorded_at": now}
    rows = pa.Table.from_pylist(
        [{**common, "row_address": e.row_address, "error": e.error, "traceback": e.traceback, "retried": e.retried,
          "outcome": "failed"} for e in result.errors]
        + [{**common, "row_address": address, "retried": True, "outcome": "succeeded"} for address in result.recovered],
        schema=ERRORS_SCHEMA)
    db = lancedb.connect()
    table = db.create_table(ERRORS_TABLE, schema=ERRORS_SCHEMA, exist_ok=True)
    missing = [f for f in ERRORS_SCHEMA if f.name not in table.schema.names]
    if missing:  # a table written by an earlier release: add the new columns (NULL for old rows)
        table.add_columns(missing)
    table.add(rows)


def refresh_metadata(function: Function, gpu_class: GpuClass | None, result: RefreshResult) -> dict[str, Any]:
    """What each materialization reports, as Dagster metadata."""
    gpu_seconds = result.wall_seconds * function.gpu_count
    metadata: dict[str, Any] = {
        "rows_computed": result.rows_computed,
        "rows_failed": result.rows_failed,
        "rows_retried_ok": len(result.recovered),
        "rows_checked": result.rows_checked,
        "fragments_visited": f"{result.fragments_visited}/{result.fragments_total}",
        "fragments_rewritten": result.fragments_rewritten,
        "table_version_before": result.version_before,
        "table_version_after": result.version_after,
        "function_version": result.function_version,
        "wall_seconds": dg.FloatMetadataValue(round(result.wall_seconds, 3)),
        "rows_per_second": dg.FloatMetadataValue(round(result.rows_per_second, 1)),
        "dagster/row_count": result.rows_total,
    }
    if result.lease_wait_seconds >= 0.5:
        metadata["waited_for_other_refresh_seconds"] = dg.FloatMetadataValue(round(result.lease_wait_seconds, 1))
    if function.gpu_count and gpu_class is not None:
        metadata["gpu_class"] = gpu_class.name
        metadata["gpu_seconds"] = dg.FloatMetadataValue(round(gpu_seconds, 3))
        if gpu_class.price_per_gpu_hour is not None:
            metadata["cost_usd"] = dg.FloatMetadataValue(round(gpu_seconds / 3600 * gpu_class.price_per_gpu_hour, 6))
    return metadata


def function_asset(function: Function, *, classes: str | os.PathLike[str] | None = None) -> dg.AssetsDefinition:
    """A Dagster asset whose materialization refreshes the Function's column."""
    gpu_class = resolve_class(function, classes) if function.gpu else None
    tags = gpu_tags(function.gpu_class, function.gpu_count) if function.gpu else {GPU_COUNT_TAG: "0"}
    op_tags = dict(tags)
    if gpu_class is not None:
        # For k8s_job_executor: each step pod of this Function gets its class's placement.
        op_tags[K8S_CONFIG_TAG] = json.dumps(placement_k8s_config(Placement(gpu_class, function.gpu_count)))

    @dg.asset(
        name=function.name,
        deps=[dg.AssetKey(function.source_asset)],
        tags=tags,
        op_tags=op_tags,
        kinds={"lance", "gpu" if function.gpu else "cpu"},
        code_version=function.version,
        description=function.description,
        group_name=function.group_name,
        metadata={
            "table": function.table,
            "columns": ", ".join(function.columns),
            "inputs": ", ".join(function.inputs),
            "output_type": str(function.output_type),
            "function_version": function.version,
            "batch_size": function.batch_size,
            "on_error": function.on_error,
            **({"gpu_class": function.gpu_class, "gpu_count": function.gpu_count} if function.gpu else {}),
        },
    )
    def _refresh(context: dg.AssetExecutionContext, lancedb: LanceDBResource) -> dg.MaterializeResult:
        def report(progress: Progress) -> None:
            context.log.info(f"{function.name}: {progress.line()}")

        devices = visible_devices(context.run.tags, gpu_class.local.devices) if gpu_class else None
        if devices is not None and "CUDA_VISIBLE_DEVICES" not in os.environ:
            os.environ["CUDA_VISIBLE_DEVICES"] = devices  # embedded mode: the device of this run's local slot
        context.log.info(f"refreshing {function.table}.{','.join(function.columns)} "
                         f"(Function version {function.version}"
                         + (f", GPU class {function.gpu_class} x{function.gpu_count})" if function.gpu else ", CPU)"))
        upstream = [f for spec in context.assets_def.specs for dep in spec.deps
                    if (f := function_of(dep.asset_key)) is not None]
        result = refresh_column(lancedb.table_uri(function.table), function, report=report, upstream=upstream,
                                holder=f"run {context.run.run_id}", on_wait=context.log.info)
        _record_errors(lancedb, function, result, context.run.run_id)
        return dg.MaterializeResult(metadata=refresh_metadata(function, gpu_class, result))

    _FUNCTIONS[_refresh.key] = function
    DECLARED_IN.pop(_refresh.key, None)  # set again by the YAML component that declared it, if any
    return _refresh


def gpu_function(
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
    init: dict[str, Any] | None = None,
    name: str | None = None,
    source_asset: str | None = None,
    group_name: str | None = None,
    checkpoint_seconds: float = 10.0,
    version: str | None = None,
    description: str | None = None,
    classes: str | os.PathLike[str] | None = None,
) -> Callable[[Any], dg.AssetsDefinition]:
    """Decorate a function, class or `lancedb.udf` definition to make it a Function asset.

    A Function is a GPU Function when `gpu=True`, when it names a `gpu_class`, or when its
    `lancedb.udf` definition says `gpu=True`; one without a class runs on the `default` class.

    Args:
        table: the LanceDB table whose column(s) the Function computes.
        column: the output column, or several filled from a struct output.
        output_type: the Arrow type of one value (inferred from a row Function's return annotation).
        inputs: the input columns (default: the callable's parameter names).
        gpu, gpu_class, gpu_count: where it runs (see the GPU classes); `gpu_count` per worker.
        batch_size: rows per call of a batch Function, and per checkpointed batch.
        on_error: "fail" stops the refresh on the first failing row; "skip" leaves that row NULL,
            records it in the `gpufn_errors` table, and retries it on the next refresh.
        init: keyword arguments for a class's constructor.
        name, source_asset, group_name, description: the asset's key, upstream asset, group and text.
        checkpoint_seconds: how much work a killed refresh may repeat (0: checkpoint every batch).
        version: pin the Function version (e.g. a release name); by default it is a digest of the
            code and of the project code and constants it references, so editing them recomputes.
        classes: the directory of GPU class files (default `$GPUFN_CLASSES_DIR` or `./classes`).

    Example:
        >>> import pyarrow as pa
        >>> @gpu_function(table="docs", column="embedding", output_type=pa.list_(pa.float32(), 2),
        ...               gpu_class="l4", batch_size=256)
        ... def embed(text: pa.Array) -> pa.Array:
        ...     return pa.array([[float(len(t)), 0.0] for t in text.to_pylist()], pa.list_(pa.float32(), 2))
        >>> embed.key.to_user_string(), embed.op.tags["gpufn/gpu-class"]
        ('docs__embedding', 'l4')
    """

    def decorate(target: Any) -> dg.AssetsDefinition:
        function = make_function(
            target, table=table, column=column, output_type=output_type, inputs=inputs, gpu=gpu,
            gpu_class=gpu_class, gpu_count=gpu_count, batch_size=batch_size, on_error=on_error, init=init,
            name=name, source_asset=source_asset, group_name=group_name, checkpoint_seconds=checkpoint_seconds,
            version=version, description=description,
        )
        return function_asset(function, classes=classes)

    return decorate


def function_of(asset: dg.AssetsDefinition | dg.AssetKey) -> Function | None:
    """The Function behind an asset made by `gpu_function` (by key: Dagster copies asset objects)."""
    if isinstance(asset, dg.AssetsDefinition):
        if len(asset.keys) != 1:
            return None
        asset = asset.key
    return _FUNCTIONS.get(asset)


__all__ = ["gpu_function", "function_asset", "function_of", "GPU_CLASS_TAG", "GPU_COUNT_TAG"]
