"""Functions as Dagster assets: materializing one refreshes its column.

The asset carries its GPU class as tags (`gpufn/gpu-class`, `gpufn/gpu-count`) on the asset and
on its op, so the run launcher can resolve placement from the asset graph and step launchers
from op tags; the UI shows them and the kinds (`lance`, `gpu`/`cpu`). The Function spec itself
rides on the asset under one metadata key (`FUNCTION_METADATA_KEY`, as dagster-dbt and
dagster-sling carry their manifest and translator), so `function_of(asset)` reads it back from
the asset and no registry outside the definitions can go stale or be silently replaced.
"""

import json
import os
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow as pa
from dagster._core.definitions.metadata.metadata_value import ObjectMetadataValue

from .classes import ClassesDir, GpuClass, cached_gpu_classes, resolve_classes_dir
from .errors import FunctionDefinitionError
from .functions import Function, make_function
from .options import document_options
from .refresh.engine import Progress, RefreshResult, refresh_column
from .resources import LanceDBResource
from .run.placement import Placement, placement_k8s_config
from .run.shared import RunKind
from .run.slots import local_slot
from .tags import (DECLARED_IN_METADATA_KEY, FUNCTION_METADATA_KEY, GPU_COUNT_TAG, K8S_CONFIG_TAG, PLACEMENT_TAG,
                   READS_METADATA_KEY, gpu_pool, gpu_tags)

ERRORS_TABLE = "gpufn_errors"
# One row per failed row, and per retried row that then succeeded (outcome "succeeded"):
# `retried` says the row had failed in an earlier refresh.
ERRORS_SCHEMA = pa.schema([
    ("function", pa.string()), ("table", pa.string()), ("columns", pa.string()),
    ("function_version", pa.string()), ("run_id", pa.string()), ("row_address", pa.uint64()),
    ("error", pa.string()), ("traceback", pa.string()), ("recorded_at", pa.timestamp("us", tz="UTC")),
    ("retried", pa.bool_()), ("outcome", pa.string()),
])


def resolve_class(function: Function, classes_dir: ClassesDir = None) -> GpuClass:
    """The Function's GPU class, checked against the operator's classes (unknown class, too many GPUs)."""
    directory = resolve_classes_dir(classes_dir)
    classes = cached_gpu_classes(directory)
    label = f"Function {function.name!r}"
    if function.gpu_class not in classes:
        raise FunctionDefinitionError(
            f"{label}: field 'gpu_class': unknown GPU class {function.gpu_class!r}; "
            f"classes in {directory}: {', '.join(sorted(classes))}")
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
    if result.load_seconds >= 0.05:
        metadata["load_seconds"] = dg.FloatMetadataValue(round(result.load_seconds, 2))
    if result.first_values_seconds is not None:
        metadata["first_values_seconds"] = dg.FloatMetadataValue(round(result.first_values_seconds, 2))
        metadata["busy_fraction"] = dg.FloatMetadataValue(round(result.busy_fraction, 3))
        metadata["batch_rows_largest"] = result.batch_rows_largest
    if result.oom_splits:
        metadata["oom_splits"] = result.oom_splits
        metadata["batch_rows_that_fit"] = result.batch_rows_that_fit
    metadata.update({name: dg.FloatMetadataValue(value) for name, value in result.gpu.items()})
    if result.lease_wait_seconds >= 0.5:
        metadata["waited_for_other_refresh_seconds"] = dg.FloatMetadataValue(round(result.lease_wait_seconds, 1))
    if function.gpu_count and gpu_class is not None:
        metadata["gpu_class"] = gpu_class.name
        metadata["gpu_seconds"] = dg.FloatMetadataValue(round(gpu_seconds, 3))
        if gpu_class.price_per_gpu_hour is not None:
            metadata["cost_usd"] = dg.FloatMetadataValue(round(gpu_seconds / 3600 * gpu_class.price_per_gpu_hour, 6))
    return metadata


def _asset_metadata(function: Function, declared_in: str | None) -> dict[str, Any]:
    """What the asset page shows about the Function, plus the spec itself under its key."""
    return {
        "table": function.table,
        "columns": ", ".join(function.columns),
        "inputs": ", ".join(function.inputs),
        "output_type": str(function.output_type),
        "function_version": function.version,
        "batch_size": (f"{function.batch_size}, adapting up to {function.max_batch_size}"
                       if function.adapt_batch_size else f"{function.batch_size} (pinned)"),
        "on_error": function.on_error,
        **({"gpu_class": function.gpu_class, "gpu_count": function.gpu_count} if function.gpu else {}),
        **({DECLARED_IN_METADATA_KEY: declared_in} if declared_in else {}),
        FUNCTION_METADATA_KEY: ObjectMetadataValue(function),
    }


def _materialize(context: dg.AssetExecutionContext, lancedb: LanceDBResource, function: Function,
                 gpu_class: GpuClass | None) -> dg.MaterializeResult:
    """One materialization: refresh the column, record failed rows, report what happened."""
    if gpu_class is not None and context.run.tags.get(PLACEMENT_TAG) == RunKind.LOCAL.value:
        # Embedded mode: the pool let this step start; hold one of the class's slots, and its device.
        lock_dir = Path(context.instance.root_directory) / "gpufn-slots"
        with local_slot(gpu_class, lock_dir, on_wait=context.log.warning) as (slot, device):
            if device is not None:
                os.environ["CUDA_VISIBLE_DEVICES"] = device
            context.log.info(f"local GPU slot {slot} of class {gpu_class.name!r}"
                             + (f", CUDA_VISIBLE_DEVICES={device}" if device is not None else ""))
            return _refresh_once(context, lancedb, function, gpu_class)
    return _refresh_once(context, lancedb, function, gpu_class)


def _refresh_once(context: dg.AssetExecutionContext, lancedb: LanceDBResource, function: Function,
                  gpu_class: GpuClass | None) -> dg.MaterializeResult:
    context.log.info(f"refreshing {function.table}.{','.join(function.columns)} "
                     f"(Function version {function.version}"
                     + (f", GPU class {function.gpu_class} x{function.gpu_count})" if function.gpu else ", CPU)"))
    def report(progress: Progress) -> None:
        context.log.info(f"{function.name}: {progress.line()}")

    result = refresh_column(lancedb.table_files(function.table).uri, function, report=report,
                            upstream=reads(context.assets_def), holder=f"run {context.run.run_id}",
                            on_wait=context.log.info, storage_options=lancedb.storage_options)
    _record_errors(lancedb, function, result, context.run.run_id)
    return dg.MaterializeResult(metadata=refresh_metadata(function, gpu_class, result))


def function_asset(function: Function, *, classes_dir: ClassesDir = None,
                   declared_in: str | None = None) -> dg.AssetsDefinition:
    """A Dagster asset whose materialization refreshes the Function's column.

    Args:
        function: the spec (see `make_function`).
        classes_dir: the GPU class files its class is checked against (default `$GPUFN_CLASSES_DIR`
            or `./classes`).
        declared_in: the file that declared it (YAML), named in load errors.
    """
    gpu_class = resolve_class(function, classes_dir) if function.gpu else None
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
        # Embedded mode: a GPU step claims a slot of its class's pool, limited to `local.slots`.
        pool=gpu_pool(function.gpu_class) if function.gpu else None,
        code_version=function.version,
        description=function.description,
        group_name=function.group_name,
        metadata=_asset_metadata(function, declared_in),
    )
    def _refresh(context: dg.AssetExecutionContext, lancedb: LanceDBResource) -> dg.MaterializeResult:
        return _materialize(context, lancedb, function, gpu_class)

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
        >>> embed.key.to_user_string(), embed.op.tags["gpufn/gpu-class"], function_of(embed).batch_size
        ('docs__embedding', 'l4', 256)
    """

    def decorate(target: Any) -> dg.AssetsDefinition:
        return function_asset(make_function(target, **options), classes_dir=options.get("classes_dir"))

    return decorate


def _spec_metadata(asset: dg.AssetsDefinition | dg.AssetSpec) -> Any:
    if isinstance(asset, dg.AssetSpec):
        return asset.metadata
    if len(asset.keys) != 1:
        return {}
    return asset.specs_by_key[asset.key].metadata


def function_of(asset: dg.AssetsDefinition | dg.AssetSpec) -> Function | None:
    """The Function behind an asset made by `gpu_function` (None for any other asset).

    It is read from the asset's metadata, so it survives Dagster's copies of the asset
    (`map_asset_specs`, `Definitions.merge`) and cannot be replaced behind the asset's back.
    """
    value = _spec_metadata(asset).get(FUNCTION_METADATA_KEY)
    return value.instance if isinstance(value, ObjectMetadataValue) else None


def reads(asset: dg.AssetsDefinition) -> tuple[Function, ...]:
    """The Functions whose output columns this Function asset reads (recorded by `build_definitions`)."""
    value = _spec_metadata(asset).get(READS_METADATA_KEY)
    return value.instance if isinstance(value, ObjectMetadataValue) else ()


def declared_in(asset: dg.AssetsDefinition) -> str | None:
    """The YAML file that declared a Function asset, None when it was declared in Python."""
    value = _spec_metadata(asset).get(DECLARED_IN_METADATA_KEY)
    return getattr(value, "value", value)
