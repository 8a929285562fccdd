"""The table's rows per partition, as an asset: how a partition of a Function shows unsynced.

Dagster derives a partition's staleness from its upstream *partitions*; the table a Function reads
is one unpartitioned asset (`docs`), so a new row in one day could only mark every day stale or
none. Each partitioned Function therefore also depends on an external asset partitioned as it is,
`<source>_by_<column>` (`docs_by_day`): the table's rows of each partition. The sensors that find
the partitions whose rows changed (`table_sensor`, `unfilled_rows_sensor`) report an observation
of each such partition whose data version is the table version that changed it; a Function
partition refreshed before that observation is then "Unsynced" on its page (and by
`staleStatusByPartition` in GraphQL) until it is refreshed, and other partitions stay synced.

A partition refreshed before the table's rows were first observed (the sensor's first tick) has no
observation to compare with and shows synced until its next refresh.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import dagster as dg

from ..dagster_private import DATA_VERSION_TAG
from ..errors import FunctionDefinitionError
from ..function_spec.functions import Function


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
    return dg.AssetKey(f"{function.source_asset}_by_{'_'.join(columns)}" if columns
                       else f"{function.source_asset}_partitions")


def partitions_assets(functions: Iterable[Function]) -> list[dg.AssetSpec]:
    """One external asset per table and partition column(s) of the partitioned Functions; refused
    when two Functions would share one but partition it differently (its keys would mean two things)."""
    specs: dict[dg.AssetKey, tuple[Function, dg.AssetSpec]] = {}
    for function in functions:
        if function.partitioning is None:
            continue
        key = partitions_asset_key(function)
        if key in specs:
            first, _ = specs[key]
            if first.partitioning.partitions_def != function.partitioning.partitions_def:
                raise FunctionDefinitionError(
                    f"Functions {first.name!r} and {function.name!r}: field 'partitions_def': both partition "
                    f"table {function.table!r} by {', '.join(function.partitioning.columns) or 'a filter'} but with "
                    f"different partitions definitions, so {key.to_user_string()!r} cannot say which rows changed; "
                    "partition them alike or by another column")
            continue
        what = ", ".join(function.partitioning.columns) or "its partition_filter"
        specs[key] = (function, dg.AssetSpec(
            key, partitions_def=function.partitioning.partitions_def, group_name=function.group_name,
            kinds={"lance"}, metadata={"table": function.table, "partitioned_by": what},
            description=(f"The rows of table {function.table!r} in each partition (by {what}). gpufn's sensors "
                         "observe a partition when its rows are added or changed; a Function partitioned alike "
                         "shows that partition unsynced until its next refresh.")))
    return [spec for _, spec in specs.values()]


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
