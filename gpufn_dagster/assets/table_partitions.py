"""The table's rows as observed assets: what makes a Function stale, and what Dagster's declarative
automation reacts to, when rows are added or changed outside Dagster.

Dagster derives staleness, and `AutomationCondition.eager()`/`any_deps_updated()` derive "updated",
from the data versions of a Function's upstream assets. The table a Function reads is produced by
an asset (`docs`) whose materializations say nothing about rows someone else appended later. So:

- A Function with an `automation_condition` also depends on `<source>_rows` (`docs_rows`), an
  observable source asset whose data version is the table's data version
  (`changed_partitions.data_version`: the last commit that changed rows, not gpufn's own
  refreshes or maintenance), observed on a cron by Dagster's automation (`observe_cron`). A new
  row makes a new data version, Dagster's automation sensor sees the dependency updated and
  requests the refresh; a refresh's own commit leaves the data version as it was, so it never
  requests the next.
- A partitioned Function depends on `<source>_by_<column>` (`docs_by_day`), partitioned as it is:
  the table's rows of each partition. It is observed per partition: a partition whose rows the
  commits since the last observation added or changed gets the version of the table that changed
  it as its data version (`changed_partitions`, as the sensors find them), so its Function
  partition is unsynced, and requested by automation, while the other partitions stay as they were.
  gpufn's sensors (`table_sensor`, `unfilled_rows_sensor`) report the same observations when they
  request partitions; with an automation condition on a Function, Dagster observes it on the cron too.

A partition refreshed before the table's rows were first observed has no observation to compare
with and shows synced until its next refresh.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable, Sequence

import dagster as dg
import lance

from ..private_ledger import DATA_VERSION_TAG
from ..errors import FunctionDefinitionError
from ..function_spec.functions import Function
from .changed_partitions import changed_data, changed_filter, changed_partitions, data_version, operations_since
from .resources import LanceDBResource

# When Dagster's automation observes a table's rows (a cron: an observation is a run of its own).
OBSERVE_CRON = "* * * * *"


def partitions_asset_key(function: Function) -> dg.AssetKey:
    """The asset of the Function's table rows per partition.

    >>> from gpufn_dagster.function_spec.functions import make_function
    >>> def n(text: str) -> int: return len(text)
    >>> days = dg.DailyPartitionsDefinition("2026-01-01")
    >>> partitions_asset_key(make_function(n, table="docs", column="n", partitions_def=days, partition_column="day"))
    AssetKey(['docs_by_day'])
    """
    assert function.partitioning is not None
    columns = function.partitioning.columns
    source = function.source_key.path[-1]
    return dg.AssetKey([*function.attributes.key_prefix,
                        f"{source}_by_{'_'.join(columns)}" if columns else f"{source}_partitions"])


def rows_asset_key(function: Function) -> dg.AssetKey:
    """The observed asset of the Function's table rows, `<source>_rows`, which automation reads.

    >>> from gpufn_dagster.function_spec.functions import make_function
    >>> def n(text: str) -> int: return len(text)
    >>> rows_asset_key(make_function(n, table="docs", column="n", key_prefix="lake"))
    AssetKey(['lake', 'docs_rows'])
    """
    return dg.AssetKey([*function.attributes.key_prefix, f"{function.source_key.path[-1]}_rows"])


def observes_rows(function: Function) -> bool:
    """Whether the Function depends on its table's observed rows (`rows_asset_key`): an
    unpartitioned Function with an automation condition (a partitioned one reads its partitions')."""
    return function.partitioning is None and function.attributes.automation_condition is not None


def table_rows_assets(functions: Iterable[Function], defined: Iterable[dg.AssetKey]
                      ) -> list[dg.AssetSpec | dg.SourceAsset]:
    """The table-rows assets the Functions depend on, and what observes them; `defined` are the keys
    of the definitions' own assets.

    - Rows per partition, one asset per table and partition column(s): external, observed by gpufn's
      sensors as they request partitions; observable when a Function on it has an automation
      condition (Dagster's automation reads only an observable asset's observations).
    - `<source>_rows` of each table a Function with an automation condition reads: observable,
      observed by Dagster's automation on `OBSERVE_CRON`, one run for the whole table -- which also
      observes the changed partitions of that table's rows-per-partition assets; when no asset of the
      definitions produces the table (it is written outside Dagster), its first observation records
      the table's own asset once, so automation does not count it missing (recorded again on each
      change, it would request every partition of a partitioned Function).

    Refused when two Functions would share a rows-per-partition asset but partition it differently
    (its keys would mean two things).
    """
    functions, defined = list(functions), set(defined)
    by_partitions: dict[dg.AssetKey, list[Function]] = {}
    by_table: dict[dg.AssetKey, list[Function]] = {}
    for function in functions:
        if function.partitioning is not None:
            by_partitions.setdefault(partitions_asset_key(function), []).append(function)
        if function.attributes.automation_condition is not None:
            by_table.setdefault(rows_asset_key(function), []).append(function)
    assets: list[dg.AssetSpec | dg.SourceAsset] = []
    for key, group in by_partitions.items():
        first = group[0]
        for other in group[1:]:
            if first.partitioning.partitions_def != other.partitioning.partitions_def:
                raise FunctionDefinitionError(
                    f"Functions {first.name!r} and {other.name!r}: field 'partitions_def': both partition table "
                    f"{other.table!r} by {', '.join(other.partitioning.columns) or 'a filter'} but with different "
                    f"partitions definitions, so {key.to_user_string()!r} cannot say which rows changed; "
                    "partition them alike or by another column")
        automated = any(f.attributes.automation_condition is not None for f in group)
        with warnings.catch_warnings():  # as below
            warnings.simplefilter("ignore", dg.BetaWarning)
            assets.append(_observable_partitions(key, group) if automated else _sensed_partitions(key, group))
    with warnings.catch_warnings():  # observable source assets are marked beta; the warning would repeat each load
        warnings.simplefilter("ignore", dg.BetaWarning)
        assets += [_observed_rows(key, group, group[0].source_key not in defined) for key, group in by_table.items()]
    return [asset for asset in assets if asset.key not in defined]


def _described(function: Function) -> tuple[str, dict[str, str]]:
    """What the rows asset of the Function's table holds, and its metadata."""
    partitioning = function.partitioning
    if partitioning is None:
        return f"The rows of table {function.table!r}", {"table": function.table}
    what = ", ".join(partitioning.columns) or "its partition_filter"
    return (f"The rows of table {function.table!r} in each partition (by {what})",
            {"table": function.table, "partitioned_by": what})


def _sensed_partitions(key: dg.AssetKey, functions: list[Function]) -> dg.AssetSpec:
    """Rows per partition observed by gpufn's sensors only: an external asset, whose observations'
    data versions Dagster's staleness of partitions reads."""
    what, metadata = _described(functions[0])
    return dg.AssetSpec(key, partitions_def=functions[0].partitioning.partitions_def, group_name=functions[0].options.group_name,
                        kinds={"lance"}, metadata=metadata,
                        description=f"{what}. gpufn's sensors observe a partition when its rows are added or changed; "
                                    "a Function partitioned alike shows that partition unsynced until its next refresh.")


def _observable_partitions(key: dg.AssetKey, functions: list[Function]) -> dg.SourceAsset:
    """Rows per partition that automation reads: observed with the table's rows (`_observed_rows`),
    and by Observe on its page."""
    first = functions[0]
    what, metadata = _described(first)

    @dg.observable_source_asset(
        key=key, partitions_def=first.partitioning.partitions_def, group_name=first.options.group_name,
        required_resource_keys={"lancedb"}, tags={"dagster/kind/lance": ""}, metadata=metadata,
        description=(f"{what}: a partition's data version is the table version that last added or changed its rows. "
                     f"Observed with {rows_asset_key(first).to_user_string()} on '{OBSERVE_CRON}', so the Functions "
                     "partitioned alike with an automation condition refresh the partitions that changed."))
    def _observe(context: dg.OpExecutionContext) -> dg.DataVersionsByPartition:
        dataset = _dataset(context.resources.lancedb, first.table)
        changed = _changed_partitions(context.instance, key, functions, dataset) if dataset is not None else {}
        return dg.DataVersionsByPartition({partition: f"v{version}" for partition, version in changed.items()})

    return _observe


def _observed_rows(key: dg.AssetKey, functions: list[Function], observe_source: bool) -> dg.SourceAsset:
    """`<source>_rows` of the Functions' table, which Dagster's automation observes on
    `OBSERVE_CRON`: its data version is the table's (`changed_partitions.data_version`). Each
    observation also observes the partitions that changed of the table's rows-per-partition assets
    that automation reads; with `observe_source` (the table is written outside Dagster) the first
    one records the table's own asset, so automation no longer counts it missing."""
    first = functions[0]
    what, metadata = _described(dataclasses.replace(first, partitioning=None))
    partitioned: dict[dg.AssetKey, list[Function]] = {}
    for function in functions:
        if function.partitioning is not None:
            partitioned.setdefault(partitions_asset_key(function), []).append(function)

    @dg.observable_source_asset(
        key=key, group_name=first.options.group_name, required_resource_keys={"lancedb"}, tags={"dagster/kind/lance": ""},
        metadata=metadata, automation_condition=dg.AutomationCondition.cron_tick_passed(OBSERVE_CRON),
        description=(f"{what}: its data version is the last table version that added or changed rows (not gpufn's "
                     f"refreshes or maintenance). Dagster's automation observes it on '{OBSERVE_CRON}', so the "
                     "Functions computed from it with an automation condition refresh after a change."))
    def _observe(context: dg.OpExecutionContext) -> dg.DataVersion:
        dataset = _dataset(context.resources.lancedb, first.table)
        if dataset is None:
            return dg.DataVersion("none")
        version = data_version(dataset)
        for partitions_key, group in partitioned.items():
            changed = _changed_partitions(context.instance, partitions_key, group, dataset)
            for observation in partition_observations(group, sorted(changed), version, [partitions_key]):
                context.log_event(observation)
        if observe_source and context.instance.get_latest_materialization_event(first.source_key) is None:
            # Recorded once, as gpufn's table sensor records rows changed outside Dagster: from then on the
            # table's asset is not "missing" to automation; later changes update the rows assets only.
            context.log_event(dg.AssetMaterialization(first.source_key, metadata={
                "dagster/row_count": dataset.count_rows(), "table_version": dataset.version},
                description=f"table {first.table!r}, written outside Dagster, first observed"))
        return dg.DataVersion(f"v{version}")

    return _observe


def _dataset(lancedb: LanceDBResource, table: str) -> lance.LanceDataset | None:
    db = lancedb.connect()
    return db.open_table(table).to_lance() if table in lancedb.table_names(db) else None


def _changed_partitions(instance: dg.DagsterInstance, key: dg.AssetKey, functions: list[Function],
                        dataset: lance.LanceDataset) -> dict[str, int]:
    """The partitions whose rows changed since the asset's last observation, with the table version
    that changed them (on a first observation: the partitions holding rows not computed yet)."""
    records = instance.fetch_observations(dg.AssetRecordsFilter(asset_key=key), limit=1).records
    last = records[0].asset_observation.data_version if records else None
    since = int(last[1:]) if last and last[1:].isdigit() else None
    operations = operations_since(dataset, since) if since is not None else []
    versions = [since + 1 + i for i, op in enumerate(operations) if changed_data([op])]
    if since is not None and not versions:
        return {}
    keys: list[str] = []
    for function in functions:
        selector = changed_filter(function, dataset, versions, only_appends=False)
        keys += [k for k in changed_partitions(dataset, function, selector, instance) if k not in keys]
    return dict.fromkeys(keys, data_version(dataset))


def partition_observations(functions: Sequence[Function], keys: Sequence[str], version: int,
                           known: Iterable[dg.AssetKey]) -> list[dg.AssetObservation]:
    """Observations of the partitions `keys` of the Functions' row assets (those defined in `known`)
    as changed by table version `version`: their data version is that table version.

    >>> from gpufn_dagster.function_spec.functions import make_function
    >>> def n(text: str) -> int: return len(text)
    >>> f = make_function(n, table="docs", column="n", partitions_def=dg.DailyPartitionsDefinition("2026-01-01"),
    ...                   partition_column="day")
    >>> [(o.asset_key.to_user_string(), o.partition, o.data_version)
    ...  for o in partition_observations([f], ["2026-01-02"], 7, [dg.AssetKey("docs_by_day")])]
    [('docs_by_day', '2026-01-02', 'v7')]
    """
    defined = set(known)
    asset_keys = sorted({k for f in functions if (k := partitions_asset_key(f)) in defined},
                        key=lambda k: k.to_user_string())
    return [dg.AssetObservation(asset_key, partition=key, tags={DATA_VERSION_TAG: f"v{version}"},
                                metadata={"table_version": version},
                                description=f"rows of this partition added or changed at table version {version}")
            for asset_key in asset_keys for key in keys]
