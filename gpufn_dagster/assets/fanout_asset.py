"""A Function whose refresh spreads over several GPU workers, as one Dagster asset.

The asset is a graph of three ops, one per verb of the engine (`refresh.engine.ColumnRefresh`):

    <name>_plan  -- CPU: the lease, the columns, the plan and its shards (a dynamic output)
    <name>_shard -- one step per shard, on the Function's GPU class: computes its rows
    <name>_commit -- CPU: joins the shards' files and commits once; the asset's metadata

so the UI shows every shard as a step, with its rows, its progress in its log and its placement.
The shard op carries the class's tags, pool and pod placement like a one-worker Function's op:
with `k8s_job_executor` (or gpufn's executor, which gives a fanned-out run step pods) each shard
is a pod on the class's node pool, embedded each holds a local slot of the class. A shard that
dies is retried (`RetryPolicy`, up to `SHARD_RETRIES`) and resumes from its checkpoints; one that
keeps failing fails the run, and nothing is committed.

`workers` is the op config of the plan step, so the Launchpad sets it per run:
`ops: {<name>: {ops: {<name>_plan: {config: {workers: 8}}}}}`.
"""


import time
import warnings
from typing import Any

import dagster as dg

from ..classes import ClassNow, GpuClass
from ..refresh.engine import ColumnRefresh, RefreshOptions
from ..refresh.progress import Progress
from ..refresh.results import RefreshPlan, ShardResult
from ..refresh.shards import Shard
from ..refresh.warm import warm_instances
from ..run.executor import steps_in_this_process
from ..run.slots import StepClass, step_slot
from ..function_spec.functions import Function
from ..tags import GPU_COUNT_TAG, SHARD_TAG
from .asset_spec import reads
from .reporting import WorkerFigures, device_used, record_errors, refresh_metadata
from .resources import LanceDBResource
from .run_slice import run_slice
from .step_outputs import STEP_OUTPUTS_KEY, StepOutputsIOManager, step_outputs_io_manager

SHARD_RETRIES = 3


def _token(context: dg.OpExecutionContext) -> str:
    """Who holds the refresh's lease across its steps: the run, or the run it re-executes."""
    return context.run.root_run_id or context.run.run_id


def _column(context: dg.OpExecutionContext, lancedb: LanceDBResource, function: Function,
            **options: Any) -> ColumnRefresh:
    """The engine for one step of the run: every step holds the refresh's lease under the run's token,
    and refreshes the run's partitions' slice (the same filter in every step: the keys are the run's)."""
    files = lancedb.table_files(function.table)
    return ColumnRefresh(files, function, RefreshOptions(
        lease_token=_token(context), holder=f"run {context.run.run_id}", on_wait=context.log.info,
        where=run_slice(context, function, files), **options))


def _plan_op(function: Function, class_now: ClassNow, upstream: int) -> dg.OpDefinition:
    @dg.op(
        name=f"{function.name}_plan",
        ins={"source": dg.In(dg.Nothing), **{f"upstream_{i}": dg.In(dg.Nothing) for i in range(upstream)}},
        out={"shards": dg.DynamicOut(Shard, io_manager_key=STEP_OUTPUTS_KEY),
             "plan": dg.Out(RefreshPlan, io_manager_key=STEP_OUTPUTS_KEY)},
        config_schema={"workers": dg.Field(int, default_value=function.workers,
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
        name=f"{function.name}_shard",
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
            instances = warm_instances(step.gpu_class, step.held, context.log.info, steps_in_this_process())
            result = _column(context, lancedb, function, report=report, instances=instances).compute_shard(
                shard, plan.read_version)
        context.add_output_metadata({"rows_computed": result.rows_computed, "rows_failed": result.rows_failed,
                                     "rows_per_second": dg.FloatMetadataValue(round(result.rows_per_second, 1))})
        return result

    return shard_op


def _commit_op(function: Function, class_now: ClassNow) -> dg.OpDefinition:
    @dg.op(
        name=f"{function.name}_commit",
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
        context.add_output_metadata(fanout_metadata(function, billed, result, plan, results))
        StepOutputsIOManager(lancedb).forget_run(context.run.run_id)

    return commit


def fanout_figures(function: Function, plan: RefreshPlan, shards: list[ShardResult]) -> WorkerFigures:
    """The shards' work as one refresh: wall time and rows/s from the plan's start to now (the
    commit's end: what the user waited), busy fraction and load summed over the shards, first
    values from the plan's start, GPU-seconds as each shard's wall time x its GPUs on the shards
    that saw a GPU."""
    wall = max(time.time() - plan.started_at, 0.0)
    rows = sum(s.rows_computed for s in shards)
    compute = sum(s.compute_seconds for s in shards)
    first = min((s for s in shards if s.first_values_at is not None), key=lambda s: s.first_values_at, default=None)
    on_gpu = [s for s in shards if s.devices]
    return WorkerFigures(
        wall_seconds=wall, rows_computed=rows, rows_per_second=rows / wall if wall > 0 else 0.0,
        busy_fraction=sum(s.busy_seconds for s in shards) / compute if compute > 0 else None,
        load_seconds=sum(s.load_seconds for s in shards),
        first_values_seconds=first.first_values_at - plan.started_at if first is not None else None,
        first_call_seconds=first.first_call_seconds if first is not None else None,
        devices=tuple(d for s in shards for d in s.devices),
        gpu_seconds=float(sum(s.wall_seconds for s in on_gpu)) * function.gpu_count if shards else None)


def fanout_metadata(function: Function, gpu_class: GpuClass | None, result: Any, plan: RefreshPlan,
                    shards: list[ShardResult]) -> dict[str, Any]:
    """The refresh as a whole (`fanout_figures`), the plan, and each shard's own rows/s, busy
    fraction, wall time and device."""
    metadata = refresh_metadata(function, gpu_class, result, fanout_figures(function, plan, shards))
    metadata.update(plan.summary())
    metadata["fragments_left_for_next_refresh"] = result.fragments_left
    metadata["shards"] = dg.MarkdownMetadataValue("\n".join(
        ["| shard | rows planned | rows computed | failed | rows/s | busy | wall s | device |",
         "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        + [f"| {s.index} | {s.rows_planned:,} | {s.rows_computed:,} | {s.rows_failed:,} | {s.rows_per_second:,.0f} | "
           f"{s.busy_seconds / s.compute_seconds if s.compute_seconds else 0:.2f} | {s.wall_seconds:.1f} | "
           f"{device_used(s.devices)} |" for s in sorted(shards, key=lambda s: s.index)]))
    return metadata


def fanout_asset(function: Function, class_now: ClassNow, *, tags: dict[str, str], asset_tags: dict[str, str],
                 pool: str | None, metadata: dict[str, Any], upstream: list[dg.AssetKey]) -> dg.AssetsDefinition:
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
        return _graph_asset(function, plan_op, shard_op, commit_op, asset_tags, metadata, upstream)


def _graph_asset(function: Function, plan_op: dg.OpDefinition, shard_op: dg.OpDefinition, commit_op: dg.OpDefinition,
                 tags: dict[str, str], metadata: dict[str, Any], upstream: list[dg.AssetKey]) -> dg.AssetsDefinition:
    ins = {"source": dg.AssetIn(key=dg.AssetKey(function.source_asset), dagster_type=dg.Nothing),
           **{f"upstream_{i}": dg.AssetIn(key=key, dagster_type=dg.Nothing) for i, key in enumerate(upstream)}}

    @dg.graph_asset(
        name=function.name,
        ins=ins,
        tags=tags,
        kinds={"lance", "gpu" if function.gpu else "cpu"},
        code_version=function.version,
        description=function.description,
        group_name=function.group_name,
        metadata=metadata,
        resource_defs={STEP_OUTPUTS_KEY: step_outputs_io_manager},
        partitions_def=function.partitions_def,
        backfill_policy=function.backfill_policy,
    )
    def _refresh(**after):
        planned = plan_op(**after)
        results = planned.shards.map(lambda shard: shard_op(shard, planned.plan)).collect()
        return commit_op(planned.plan, results)

    return _refresh
