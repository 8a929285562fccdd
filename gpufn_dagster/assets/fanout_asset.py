"""A Function whose refresh spreads over several GPU workers, as one Dagster asset.

The asset is a graph of three ops, one per verb of the engine (`refresh.engine.ColumnRefresh`):

    <name>_plan  -- CPU: the lease, the columns, the plan and its shards (a dynamic output)
    <name>_shard -- one step per shard, on the Function's GPU class: computes its rows
    <name>_commit -- CPU: joins the shards' files and commits once; the asset's metadata

so the UI shows every shard as a step, with its rows, its progress in its log and its placement.
The shard op carries the class's tags, pool and pod placement like a one-worker Function's op:
with gpufn's executor (`build_definitions`' default, which gives a fanned-out run step pods placed
at launch; dagster-k8s's own `k8s_job_executor` is refused for GPU runs) each shard is a pod on the
class's node pool, embedded each holds a local slot of the class. A shard that
dies is retried (`RetryPolicy`, up to `SHARD_RETRIES`) and resumes from its checkpoints; one that
keeps failing fails the run, and nothing is committed.

`workers` is the op config of the plan step, so the Launchpad sets it per run:
`ops: {<name>: {ops: {<name>_plan: {config: {workers: 8}}}}}`.
"""


import dataclasses
import time
import warnings
from typing import Any

import dagster as dg
import numpy as np

from ..class_requests import ClassNow
from ..classes import GpuClass
from ..refresh.engine import ColumnRefresh, RefreshOptions
from ..refresh.progress import Progress
from ..refresh.results import RefreshPlan, ShardResult
from ..refresh.shards import Shard
from ..embedded.warm import warm_instances
from .executor import steps_in_this_process
from .gpu_time import held_since
from ..embedded.slots import StepClass, step_slot
from ..function_spec.functions import Function
from ..tags import GPU_COUNT_TAG, SHARD_TAG
from .asset_spec import reads
from .reporting import (INTERRUPTS, WorkerFigures, device_used, partition_figures, record_errors, refresh_metadata,
                        report_terminated)
from .resources import LanceDBResource
from .run_family import family_ended
from .run_slice import run_slice, spans_partitions
from .step_outputs import STEP_OUTPUTS_KEY, StepOutputsIOManager, step_outputs_io_manager

SHARD_RETRIES = 3


def _token(context: dg.OpExecutionContext) -> str:
    """Who holds the refresh's lease across its steps: the run, or the run it re-executes."""
    return context.run.root_run_id or context.run.run_id


def _column(context: dg.OpExecutionContext, lancedb: LanceDBResource, function: Function,
            **options: Any) -> ColumnRefresh:
    """The engine for one step of the run: every step holds the refresh's lease under the run's token
    (taking over one whose run family has ended, `run_family`), and refreshes the run's partitions'
    slice (the same filter in every step: the keys are the run's)."""
    files = lancedb.table_files(function.table)
    return ColumnRefresh(files, function, RefreshOptions(
        lease_token=_token(context), holder=f"run {context.run.run_id}", on_wait=context.log.info,
        where=run_slice(context, function, files), lease_holder_ended=family_ended(context.instance), **options))


def _plan_op(function: Function, class_now: ClassNow, upstream: int) -> dg.OpDefinition:
    @dg.op(
        name=f"{function.op_name}_plan",
        ins={"source": dg.In(dg.Nothing), **{f"upstream_{i}": dg.In(dg.Nothing) for i in range(upstream)}},
        out={"shards": dg.DynamicOut(Shard, io_manager_key=STEP_OUTPUTS_KEY),
             "plan": dg.Out(RefreshPlan, io_manager_key=STEP_OUTPUTS_KEY)},
        config_schema={"workers": dg.Field(int, default_value=function.options.workers,
                                           description="GPU workers this refresh spreads over (at least 1).")},
        tags={GPU_COUNT_TAG: "0"},
        description=f"Plan the refresh of {function.name} and split it into shards.",
    )
    def plan(context: dg.OpExecutionContext, lancedb: LanceDBResource):
        workers = int(context.op_config["workers"])
        if workers < 1:
            raise dg.Failure(f"Function {function.name!r}: run config 'workers': must be at least 1, got {workers}")
        accepted = class_now()  # the first choice's budget: shards may land on any of the classes
        planned = _column(context, lancedb, function, upstream=reads(context.assets_def)).plan(
            workers, gpu_budget=accepted[0].max_gpus_per_refresh if accepted else None)
        context.log.info(
            f"{function.name}: {planned.rows:,} rows to check in {planned.fragments} fragments at table version "
            f"{planned.read_version}, split into {len(planned.shards)} shard(s) of "
            f"{', '.join(f'{s.rows:,}' for s in planned.shards) or 'no'} rows (workers asked {workers}, used "
            f"{len(planned.shards)}" + (f": fewer because {planned.fewer_because}" if planned.fewer_because else "")
            + f"; planned in {planned.plan_seconds:.2f}s)")
        yield dg.Output(planned, "plan", metadata={k: v for k, v in planned.summary().items() if v is not None})
        for shard in planned.shards:
            yield dg.DynamicOutput(shard, output_name="shards", mapping_key=shard.mapping_key)

    return plan


def _shard_op(function: Function, class_now: ClassNow, tags: dict[str, str],
              pool: str | None) -> dg.OpDefinition:
    @dg.op(
        name=f"{function.op_name}_shard",
        ins={"shard": dg.In(Shard), "plan": dg.In(RefreshPlan)},
        out=dg.Out(ShardResult, io_manager_key=STEP_OUTPUTS_KEY),
        tags={**tags, SHARD_TAG: function.name},  # the GPU request: each shard's pod is placed at launch
        config_schema={},  # nothing per run: the plan step takes `workers`; any key here is refused
        pool=pool,
        retry_policy=dg.RetryPolicy(max_retries=SHARD_RETRIES, delay=1),
        description=f"Compute one shard of {function.name} on its own GPU worker.",
    )
    def shard_op(context: dg.OpExecutionContext, lancedb: LanceDBResource, shard: Shard,
                 plan: RefreshPlan) -> ShardResult:
        name = f"{function.name} {shard.mapping_key}"
        context.log.info(f"{name}: {shard.rows:,} rows in {len(shard.pieces)} piece(s): " + ", ".join(
            f"fragment {p.fragment_id} rows {p.start}-{p.end}" for p in shard.pieces)
            + (f" (attempt {context.retry_number + 1}, resuming from its checkpoints)" if context.retry_number else ""))

        def report(progress: Progress) -> None:
            context.log.info(f"{name}: {progress.line()}")

        with step_slot(context, class_now(), function.gpu_count) as step:
            held_from = held_since(context.run.tags, on_local_slot=step.held is not None)
            instances = warm_instances(step.gpu_class, step.held, context.log.info, steps_in_this_process())
            column = _column(context, lancedb, function, report=report, instances=instances,
                             keep_rows=spans_partitions(context))
            try:
                result = column.compute_shard(shard, plan.read_version)
            except INTERRUPTS:
                report_terminated(context, function, column.rows_checkpointed())
                raise
        result = dataclasses.replace(result, run_id=context.run.run_id,
                                     gpu_held_seconds=(time.monotonic() - held_from) * function.gpu_count)
        context.add_output_metadata({"rows_computed": result.rows_computed, "rows_failed": result.rows_failed,
                                     "rows_per_second": dg.FloatMetadataValue(round(result.rows_per_second, 1)),
                                     "gpu_held_seconds": dg.FloatMetadataValue(round(result.gpu_held_seconds, 3))})
        return result

    return shard_op


def _commit_op(function: Function, class_now: ClassNow) -> dg.OpDefinition:
    @dg.op(
        name=f"{function.op_name}_commit",
        ins={"plan": dg.In(RefreshPlan), "results": dg.In(list[ShardResult])},
        out=dg.Out(dg.Nothing),
        tags={GPU_COUNT_TAG: "0"},
        config_schema={},
        description=f"Join the shards of {function.name} and commit them as one table version.",
    )
    def commit(context: dg.OpExecutionContext, lancedb: LanceDBResource, plan: RefreshPlan,
               results: list[ShardResult]) -> None:
        result = _column(context, lancedb, function).commit_shards()
        record_errors(lancedb, function, result, context.run.run_id)
        if result.fragments_left:
            context.log.warning(f"{function.name}: {result.fragments_left} fragment(s) changed since the plan (or were "
                                "appended) and are left for the next refresh")
        billed = StepClass(class_now()).billed(context.instance, context.run.run_id)
        record = context.instance.get_run_record_by_id(context.run.run_id)
        started = record.start_time if record is not None and record.start_time else plan.started_at
        figures = fanout_figures(function, plan, results, context.run.run_id, started)
        metadata = fanout_metadata(function, billed, result, plan, results, figures)
        if (adopted := figures.adopted()) is not None:
            context.log.info(f"{function.name}: {adopted}")
        context.add_output_metadata(metadata)
        if spans_partitions(context):  # each partition of a single-run backfill: its own rows and filter
            computed = np.concatenate([s.computed_rows for s in results if s.computed_rows is not None]
                                      or [np.array([], dtype=np.uint64)])
            dataset = lancedb.table_files(function.table).dataset(plan.read_version)
            for key, figures in partition_figures(function, dataset, context.partition_keys, metadata, computed,
                                                  result.errors).items():
                # an op's context has no add_asset_metadata; its step's does, for the graph asset it is part of
                context.get_step_execution_context().add_asset_metadata(figures, asset_key=function.asset_key,
                                                                       partition_key=key)
        StepOutputsIOManager(lancedb).forget_run(context.run.run_id)

    return commit


def fanout_figures(function: Function, plan: RefreshPlan, shards: list[ShardResult], run_id: str,
                   run_started: float) -> WorkerFigures:
    """The shards' work in this run as one refresh: wall time and rows/s from the plan's start (or
    this run's, when it re-executes an earlier run whose plan it reuses) to now (the commit's end:
    what the user waited), busy fraction and load summed over the shards this run computed, first
    values from the plan's start, GPU-seconds as each of those shards' wall time x its GPUs on the
    shards that saw a GPU; GPUs held (each shard's slots or pod, x its GPUs) and of that the time
    idle, no Function call running (loading, reads, checkpoints: plan and commit hold none). A
    shard an earlier run computed (a re-execution reuses its output) and rows a shard restored from a killed attempt's checkpoints are adopted, not computed by this run."""
    started = max(plan.started_at, run_started)
    ours = [s for s in shards if s.run_id in (None, run_id)]
    theirs = [s for s in shards if s.run_id not in (None, run_id)]
    wall = max(time.time() - started, 0.0)
    rows = sum(s.rows_computed for s in ours)
    compute = sum(s.compute_seconds for s in ours)
    first = min((s for s in ours if s.first_values_at is not None), key=lambda s: s.first_values_at, default=None)
    on_gpu = [s for s in ours if s.devices]
    held = [s for s in ours if s.gpu_held_seconds is not None]
    held_seconds = sum(s.gpu_held_seconds for s in held) if held and function.gpu_count else None
    return WorkerFigures(
        wall_seconds=wall, rows_computed=rows, rows_per_second=rows / wall if wall > 0 else 0.0,
        busy_fraction=sum(s.busy_seconds for s in ours) / compute if compute > 0 else None,
        load_seconds=sum(s.load_seconds for s in ours),
        first_values_seconds=first.first_values_at - started if first is not None else None,
        first_call_seconds=first.first_call_seconds if first is not None else None,
        devices=tuple(d for s in ours for d in s.devices),
        gpu_seconds=float(sum(s.wall_seconds for s in on_gpu)) * function.gpu_count if ours else None,
        rows_adopted=sum(s.rows_adopted for s in ours) + sum(s.rows_computed + s.rows_adopted for s in theirs),
        parts_adopted=sum(s.parts_adopted for s in ours), parts_damaged=sum(s.parts_damaged for s in ours),
        gpu_held_seconds=held_seconds,
        gpu_idle_seconds=None if held_seconds is None
        else max(held_seconds - sum(s.busy_seconds for s in held) * function.gpu_count, 0.0))


def fanout_metadata(function: Function, gpu_class: GpuClass | None, result: Any, plan: RefreshPlan,
                    shards: list[ShardResult], figures: WorkerFigures) -> dict[str, Any]:
    """The refresh as a whole (`fanout_figures`), the plan, and each shard's own rows/s, busy
    fraction, wall time and device."""
    metadata = refresh_metadata(function, gpu_class, result, figures)
    metadata.update(plan.summary())
    metadata["fragments_left_for_next_refresh"] = result.fragments_left
    columns = [("shard", "int"), ("rows_planned", "int"), ("rows_computed", "int"), ("rows_adopted", "int"),
               ("rows_failed", "int"), ("rows_per_second", "float"), ("busy_fraction", "float"),
               ("wall_seconds", "float"), ("gpu_held_seconds", "float"), ("device", "string")]
    metadata["shards"] = dg.TableMetadataValue([dg.TableRecord({
        "shard": s.index, "rows_planned": s.rows_planned, "rows_computed": s.rows_computed,
        "rows_adopted": s.rows_adopted, "rows_failed": s.rows_failed, "rows_per_second": round(s.rows_per_second, 1),
        "busy_fraction": round(s.busy_seconds / s.compute_seconds if s.compute_seconds else 0.0, 3),
        "wall_seconds": round(s.wall_seconds, 2),
        "gpu_held_seconds": round(s.gpu_held_seconds, 2) if s.gpu_held_seconds is not None else 0.0,
        "device": device_used(s.devices)})
        for s in sorted(shards, key=lambda s: s.index)], dg.TableSchema([dg.TableColumn(n, t) for n, t in columns]))
    return metadata


def fanout_asset(function: Function, class_now: ClassNow, *, tags: dict[str, str], attributes: dict[str, Any],
                 pool: str | None, upstream: list[dg.AssetKey]) -> dg.AssetsDefinition:
    """The Function's asset as plan -> shards -> commit (see the module docstring); `upstream` are
    the assets it runs after besides its table: the Function assets whose columns it reads, and a
    partitioned Function's table rows per partition (a graph asset's dependencies are fixed when it is made).
    `class_now` reads the Function's GPU class as its files are when a step runs."""
    plan_op, shard_op, commit_op = (_plan_op(function, class_now, len(upstream)),
                                    _shard_op(function, class_now, tags, pool), _commit_op(function, class_now))

    with warnings.catch_warnings():
        # `resource_defs` of a graph asset is marked beta; the asset brings its own IO manager so
        # that no user has to configure one for it, and the warning would repeat on every load.
        warnings.simplefilter("ignore", dg.BetaWarning)
        warnings.simplefilter("ignore", DeprecationWarning)  # legacy_freshness_policy, when declared
        return _graph_asset(function, plan_op, shard_op, commit_op, attributes, upstream)


def _graph_asset(function: Function, plan_op: dg.OpDefinition, shard_op: dg.OpDefinition, commit_op: dg.OpDefinition,
                 attributes: dict[str, Any], upstream: list[dg.AssetKey]) -> dg.AssetsDefinition:
    ins = {"source": dg.AssetIn(key=function.source_key, dagster_type=dg.Nothing),
           **{f"upstream_{i}": dg.AssetIn(key=key, dagster_type=dg.Nothing) for i, key in enumerate(upstream)}}

    @dg.graph_asset(
        key=function.asset_key,
        ins=ins,
        code_version=function.version,
        description=function.description,
        group_name=function.options.group_name,
        resource_defs={STEP_OUTPUTS_KEY: step_outputs_io_manager},
        partitions_def=function.partitions_def,
        backfill_policy=function.options.backfill_policy,
        **attributes,  # tags, metadata, kinds, owners, automation condition: gpufn's and the declaration's
    )
    def _refresh(**after):
        planned = plan_op(**after)
        results = planned.shards.map(lambda shard: shard_op(shard, planned.plan)).collect()
        return commit_op(planned.plan, results)

    return _refresh
