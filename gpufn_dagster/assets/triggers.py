"""Day-to-day triggers: scheduled refreshes, and sensors that refresh when a table's data changes.

The sensor's cursor is the table version it last acted on (stored by Dagster, so it survives
restarts). A new version starts one run, keyed `<table>@v<version>`, so the same version never
starts two runs; several versions between ticks collapse into one refresh, which covers them all.
Versions written by gpufn itself (refresh commits, column declarations) and by maintenance
(compaction, indexes) are not data changes and start nothing -- otherwise every refresh would
trigger the next one. Nor do versions a refresh already covered: while a run that will refresh a
target is in progress (a Materialize all, say) the sensor waits for it, and afterwards starts a run
only for rows that changed after the version those refreshes read (recorded in their
materializations), so a table created by Materialize all does not start a second, empty refresh.
"""

from __future__ import annotations

from collections.abc import Sequence

import dagster as dg
import lance

from ..errors import FunctionDefinitionError
from ..embedded.warm import unsendable
from .executor import gpu_classes_executor
from ..tags import (SOURCE_VERSION_KEY, TABLE_TAG, TABLE_VERSION_BEFORE_KEY, TABLE_VERSION_TAG,
                    UNFILLED_ROWS_TAG, run_gpu_tags)
from ..function_spec.functions import Function
from .asset_spec import function_of
from .changed_partitions import (appended_rows, changed_data, changed_filter, changed_partitions, operations_since,
                                 unfilled_filter)
from .resources import LanceDBResource
from .table_partitions import partition_observations

def default_status(running: bool, kind: type[dg.DefaultSensorStatus | dg.DefaultScheduleStatus] = dg.DefaultSensorStatus,
                   ) -> dg.DefaultSensorStatus | dg.DefaultScheduleStatus:
    """A trigger's `running=` as Dagster's default status: stopped unless asked, so a new sensor or
    schedule starts nothing until a user turns it on in the UI.

    >>> default_status(True), default_status(False, dg.DefaultScheduleStatus)
    (<DefaultSensorStatus.RUNNING: 'RUNNING'>, <DefaultScheduleStatus.STOPPED: 'STOPPED'>)
    """
    return kind.RUNNING if running else kind.STOPPED


_IN_PROGRESS = {dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.STARTING,
                dg.DagsterRunStatus.STARTED}


def _refreshing(instance: dg.DagsterInstance, keys: Sequence[dg.AssetKey]) -> dg.DagsterRun | None:
    """A run in progress that will materialize one of these assets, if any."""
    for key in keys:
        planned = instance.get_latest_planned_materialization_info(key)
        run = instance.get_run_by_id(planned.run_id) if planned else None
        if run is not None and run.status in _IN_PROGRESS:
            return run
    return None


def _resolved(context: dg.SensorEvaluationContext,
              targets: Sequence[dg.AssetsDefinition | str]) -> list[dg.AssetsDefinition | str]:
    """Targets named by key (as YAML names them) as the code location's assets, where it has them."""
    assets = context.repository_def.assets_defs_by_key if context.repository_def is not None else {}
    return [assets.get(dg.AssetKey(t), t) if isinstance(t, str) else t for t in targets]


def _read_key(target: dg.AssetsDefinition | str, table: str) -> str | None:
    """The materialization metadata key that holds the version of `table` a target's refresh read:
    a Function on it reads `table_version_before`, a view of it `source_version`; None otherwise."""
    if not isinstance(target, dg.AssetsDefinition) or len(target.keys) != 1:
        return None
    function = function_of(target)
    if function is not None:
        return TABLE_VERSION_BEFORE_KEY if function.table == table else None
    source = target.specs_by_key[target.key].metadata.get("source_table")
    return SOURCE_VERSION_KEY if getattr(source, "value", source) == table else None


def covered_version(instance: dg.DagsterInstance, targets: Sequence[dg.AssetsDefinition | str],
                    table: str) -> int | None:
    """The version of `table` up to which every target reading it is refreshed (None: one never was)."""
    read = []
    for target in targets:
        key = _read_key(target, table)
        if key is None:
            continue
        event = instance.get_latest_materialization_event(target.key)
        value = event.asset_materialization.metadata.get(key) if event and event.asset_materialization else None
        if value is None:
            return None
        read.append(int(value.value))
    return min(read) if read else None


def _keys(targets: Sequence[dg.AssetsDefinition | str]) -> list[dg.AssetKey]:
    return [t.key if isinstance(t, dg.AssetsDefinition) else dg.AssetKey(t) for t in targets]


def _run_tags(targets: Sequence[dg.AssetsDefinition | str]) -> dict[str, str]:
    """GPU class tags for runs of a selection with exactly one GPU class (what the launcher would write)."""
    functions = [function_of(t) for t in targets if isinstance(t, dg.AssetsDefinition)]
    classes = {(f.gpu_class, f.gpu_count) for f in functions if f is not None and f.gpu}
    names = {name for name, _ in classes}
    if len(names) != 1:
        return {}
    name = names.pop()
    return run_gpu_tags(name, max(count for n, count in classes if n == name))


def refresh_job(name: str, targets: Sequence[dg.AssetsDefinition | str], description: str | None = None):
    return dg.define_asset_job(name, selection=dg.AssetSelection.assets(*_keys(targets)), tags=_run_tags(targets),
                               description=description or f"Refresh {', '.join(_names(targets))}")


def _names(targets: Sequence[dg.AssetsDefinition | str]) -> list[str]:
    return [t.key.to_user_string() if isinstance(t, dg.AssetsDefinition) else t for t in targets]


# Changes of at most this many rows refresh with the run's steps in its run worker (`in_process_rows`).
IN_PROCESS_ROWS = 10_000


def in_process_config(context: dg.SensorEvaluationContext, job_name: str, targets: Sequence[dg.AssetsDefinition | str],
                      rows: int | None, limit: int) -> dict:
    """The run config of a refresh of `rows` changed rows: its steps in the run worker's own process
    (gpufn's executor option `in_process`) when they are at most `limit` -- a small refresh then pays
    no step start -- and every GPU Function among the targets can compute in its slot's process;
    else none (each step a process of its own, in parallel).

    >>> in_process_config(None, "docs_changed_job", [], rows=None, limit=10_000)
    {}
    """
    if rows is None or rows > limit or context is None or context.repository_def is None:
        return {}
    if context.repository_def.get_job(job_name).executor_def.name != gpu_classes_executor.name:
        return {}  # another executor: it has no in_process option
    for target in _resolved(context, targets):
        function = function_of(target) if isinstance(target, dg.AssetsDefinition) else None
        if function is not None and function.gpu and unsendable(function) is not None:
            return {}  # a closure: it computes in its step's process (`embedded.warm.warm_instances`)
    return {"execution": {"config": {"in_process": True}}}


def refresh_schedule(
    name: str,
    cron: str,
    targets: Sequence[dg.AssetsDefinition | str],
    *,
    timezone: str = "UTC",
    running: bool = False,
) -> dg.ScheduleDefinition:
    """Refresh these Functions and views on a cron schedule (through the same launcher path as the UI).

    Its job carries the GPU class tags when the selection has one class.

    Args:
        name: the schedule's name (its job is `<name>_job`).
        cron: when, as a cron expression ("0 3 * * *": 03:00 every day).
        targets: the Function and view assets (or asset names) to refresh.
        timezone: the cron expression's time zone.
        running: whether the schedule starts running (default: stopped until turned on in the UI).

    Example:
        >>> nightly = refresh_schedule("nightly_docs_refresh", "0 3 * * *", ["docs__embedding", "docs_en"])
        >>> nightly.name, nightly.cron_schedule, nightly.job.name
        ('nightly_docs_refresh', '0 3 * * *', 'nightly_docs_refresh_job')
    """
    return dg.ScheduleDefinition(
        name=name, cron_schedule=cron, execution_timezone=timezone, job=refresh_job(f"{name}_job", targets),
        default_status=default_status(running, dg.DefaultScheduleStatus),
        description=f"Refresh {', '.join(_names(targets))} on '{cron}' ({timezone})",
    )


def table_sensor(
    table: str,
    targets: Sequence[dg.AssetsDefinition | str],
    *,
    name: str | None = None,
    minimum_interval_seconds: int = 30,
    running: bool = False,
    in_process_rows: int = IN_PROCESS_ROWS,
) -> dg.SensorDefinition:
    """Refresh `targets` when rows of `table` are added, updated or deleted.

    Each new table version starts one run keyed `<table>@v<version>`; versions that change no rows
    (gpufn's own refreshes, column declarations, compaction, indexes) start nothing. Partitioned
    Function targets (all partitioned alike) get one run per partition whose rows the new versions
    added or changed, keyed `<table>@v<version>:<partition>` (`changed_partitions`).

    Args:
        table: the LanceDB table to watch (its Lance version is the sensor's cursor).
        targets: the Function and view assets (or asset names) to refresh.
        name: the sensor's name (default `<table>_changed`).
        minimum_interval_seconds: how often it looks at the table's version (the daemon looks every 5 s at most).
        running: whether the sensor starts running (default: stopped until turned on in the UI).
        in_process_rows: appends of at most this many rows refresh with the run's steps in its run
            worker's own process (`in_process`), which spares a small refresh every step's process
            start; larger changes, updates and deletes run each step in its own process. 0: never.

    Example:
        >>> sensor = table_sensor("docs", ["docs__embedding"], minimum_interval_seconds=15)
        >>> sensor.name, sensor.minimum_interval_seconds
        ('docs_changed', 15)
    """
    job = refresh_job(f"{name or table + '_changed'}_job", targets)
    keys = _keys(targets)

    @dg.sensor(name=name or f"{table}_changed", job=job, minimum_interval_seconds=minimum_interval_seconds,
               default_status=default_status(running),
               description=f"Refreshes {', '.join(_names(targets))} when table {table!r} changes")
    def _sensor(context: dg.SensorEvaluationContext, lancedb: LanceDBResource):
        db = lancedb.connect()
        if table not in lancedb.table_names(db):
            return dg.SkipReason(f"table {table!r} does not exist yet in {lancedb.uri}")
        dataset = db.open_table(table).to_lance()
        version = dataset.version
        last = int(context.cursor) if context.cursor else None
        if last is not None and version <= last:
            return dg.SkipReason(f"table {table!r} unchanged since version {last}")
        resolved = _resolved(context, targets)
        partitioned = _partitioned(resolved)
        if partitioned:
            return _partition_requests(context, partitioned, table, dataset, last, job.name, targets, in_process_rows)
        running = _refreshing(context.instance, keys)
        if running is not None:
            return dg.SkipReason(f"run {running.run_id[:8]} is refreshing these assets; table {table!r} version "
                                 f"{version} is looked at again once it ends")
        covered = covered_version(context.instance, resolved, table)
        base = max(v for v in (last, covered, -1) if v is not None)
        if base >= 0 and version <= base:
            return dg.SensorResult(skip_reason=dg.SkipReason(
                f"table {table!r} version {version} is already refreshed (its Functions and views read version "
                f"{covered})"), cursor=str(version))
        if base >= 0 and not changed_data(operations_since(dataset, base)):
            return dg.SensorResult(skip_reason=dg.SkipReason(
                f"table {table!r} versions {base + 1}..{version} changed no rows (gpufn refreshes, maintenance)"),
                cursor=str(version))
        rows = appended_rows(dataset, base, operations_since(dataset, base)) if base >= 0 else None
        return dg.SensorResult(
            run_requests=[dg.RunRequest(run_key=f"{table}@v{version}",
                                        tags={TABLE_TAG: table, TABLE_VERSION_TAG: str(version)},
                                        run_config=in_process_config(context, job.name, targets, rows, in_process_rows))],
            asset_events=_table_changed(context, resolved, table, dataset) if base >= 0 else [],
            cursor=str(version),
        )

    return _sensor


def _partitioned(targets: Sequence[dg.AssetsDefinition | str]) -> list[Function]:
    """The targets' partitioned Functions; refused when they are not all partitioned alike (one run
    per partition needs one partitions definition across the job)."""
    functions = [function_of(t) if isinstance(t, dg.AssetsDefinition) else None for t in targets]
    partitioned = [f for f in functions if f is not None and f.partitioning is not None]
    if partitioned and (len(partitioned) < len(targets) or any(
            f.partitioning.partitions_def != partitioned[0].partitioning.partitions_def for f in partitioned)):
        raise FunctionDefinitionError(
            f"targets {', '.join(_names(targets))}: a sensor refreshing partitioned Functions needs every target "
            "partitioned by one partitions definition (one run per changed partition)")
    return partitioned


def _partition_requests(context: dg.SensorEvaluationContext, functions: Sequence[Function], table: str,
                        dataset: lance.LanceDataset, last: int | None, job_name: str,
                        targets: Sequence[dg.AssetsDefinition | str], in_process_rows: int) -> dg.SensorResult:
    """One run per partition whose rows changed since the cursor's version (`changed_partitions`),
    keyed by version and partition, so each changed partition refreshes once per version."""
    version = dataset.version
    operations = operations_since(dataset, last) if last is not None else []
    data_versions = [last + 1 + i for i, op in enumerate(operations) if changed_data([op])]
    if last is not None and not data_versions:
        return dg.SensorResult(skip_reason=dg.SkipReason(
            f"table {table!r} versions {last + 1}..{version} changed no rows (gpufn refreshes, maintenance)"),
            cursor=str(version))
    rows = appended_rows(dataset, last, operations) if last is not None else None
    keys: list[str] = []
    for function in functions:
        selector = (changed_filter(function, dataset, data_versions, only_appends=rows is not None)
                    if last is not None else unfilled_filter(function, dataset))
        keys += [k for k in changed_partitions(dataset, function, selector, context.instance) if k not in keys]
    if not keys:
        return dg.SensorResult(skip_reason=dg.SkipReason(
            f"table {table!r} version {version}: no partition of {', '.join(f.name for f in functions)} has "
            "changed rows"), cursor=str(version))
    config = in_process_config(context, job_name, targets, rows, in_process_rows)
    return dg.SensorResult(
        run_requests=[dg.RunRequest(run_key=f"{table}@v{version}:{key}", partition_key=key, run_config=config,
                                    tags={TABLE_TAG: table, TABLE_VERSION_TAG: str(version)}) for key in keys],
        asset_events=partition_observations(functions, keys, version, _partitioned_assets(context)),
        cursor=str(version))


def _partitioned_assets(context: dg.SensorEvaluationContext) -> list[dg.AssetKey]:
    """The partitioned assets of the sensor's definitions (where a partition can be observed)."""
    repository = context.repository_def
    return [key for key, asset in (repository.assets_defs_by_key.items() if repository is not None else ())
            if asset.partitions_def is not None]


def _table_changed(context: dg.SensorEvaluationContext, targets: Sequence[dg.AssetsDefinition | str], table: str,
                   dataset: lance.LanceDataset) -> list[dg.AssetMaterialization]:
    """The table's new rows, reported on the asset that produces it: someone outside Dagster (an append,
    an update) changed it, so its page shows the table's row count and version now, and the
    Functions computed from it show as stale until their refresh."""
    sources = {f.source_key for t in targets if isinstance(t, dg.AssetsDefinition)
               and (f := function_of(t)) is not None and f.table == table}
    known = context.repository_def.assets_defs_by_key if context.repository_def is not None else {}
    rows = dataset.count_rows()
    return [dg.AssetMaterialization(asset_key=key, description=f"table {table!r} changed outside Dagster: "
                                    f"{rows:,} rows at version {dataset.version}",
                                    metadata={"dagster/row_count": rows, "table_version": dataset.version})
            for key in sorted(sources, key=lambda k: k.to_user_string()) if not known or key in known]


def unfilled_rows_sensor(
    function_asset: dg.AssetsDefinition,
    threshold: int,
    *,
    name: str | None = None,
    minimum_interval_seconds: int = 60,
    running: bool = False,
    in_process_rows: int = IN_PROCESS_ROWS,
) -> dg.SensorDefinition:
    """Refresh a Function once at least `threshold` rows of its table are not computed yet.

    For tables that grow in many small appends: rather than a run per version, one run per batch of
    new rows. One run per table version at most (run key), none while below the threshold. A
    partitioned Function gets one run per partition holding unfilled rows.

    Args:
        function_asset: the Function asset (made by `gpu_function`).
        threshold: how many unfilled rows start a refresh.
        name: the sensor's name (default `<function>_unfilled`).
        minimum_interval_seconds: how often it counts unfilled rows.
        running: whether the sensor starts running (default: stopped until turned on in the UI).
        in_process_rows: refreshes of at most this many unfilled rows run their steps in the run
            worker's own process (see `table_sensor`). 0: never.

    Example:
        >>> from gpufn_dagster import gpu_function
        >>> @gpu_function(table="docs", column="n_chars")
        ... def n_chars(text: str) -> int:
        ...     return len(text)
        >>> unfilled_rows_sensor(n_chars, 1_000).name
        'docs__n_chars_unfilled'
    """
    function = function_of(function_asset)
    if function is None:
        raise FunctionDefinitionError(f"{function_asset.key.to_user_string()}: not a gpu_function asset, so it has no "
                                      "column to watch")
    sensor_name = name or f"{function.name}_unfilled"
    job = refresh_job(f"{sensor_name}_job", [function_asset])

    @dg.sensor(name=sensor_name, job=job, minimum_interval_seconds=minimum_interval_seconds,
               default_status=default_status(running),
               description=f"Refreshes {function.name} when {threshold:,}+ rows of {function.table!r} are unfilled")
    def _sensor(context: dg.SensorEvaluationContext, lancedb: LanceDBResource):
        db = lancedb.connect()
        if function.table not in lancedb.table_names(db):
            return dg.SkipReason(f"table {function.table!r} does not exist yet")
        table = db.open_table(function.table)
        unfilled = (table.count_rows(f"{function.sig_column} IS NULL") if function.sig_column in table.schema.names
                    else table.count_rows())
        if unfilled < threshold:
            return dg.SkipReason(f"{unfilled:,} unfilled rows in {function.table!r}, below the threshold of {threshold:,}")
        if function.partitioning is not None:  # a run per partition holding unfilled rows
            dataset = table.to_lance()
            keys = changed_partitions(dataset, function, unfilled_filter(function, dataset), context.instance)
            # each partition observed once per table version (the cursor), as changed at it
            seen = context.cursor == str(table.version)
            return dg.SensorResult(
                run_requests=[dg.RunRequest(run_key=f"{function.table}@v{table.version}:unfilled:{key}",
                                            partition_key=key,
                                            tags={TABLE_TAG: function.table, UNFILLED_ROWS_TAG: str(unfilled)})
                              for key in keys],
                asset_events=[] if seen else partition_observations([function], keys, table.version,
                                                                    _partitioned_assets(context)),
                cursor=str(table.version))
        return dg.RunRequest(run_key=f"{function.table}@v{table.version}:unfilled",
                             tags={TABLE_TAG: function.table, UNFILLED_ROWS_TAG: str(unfilled)},
                             run_config=in_process_config(context, job.name, [function_asset], unfilled, in_process_rows))

    return _sensor
