"""The slice of the table a run of a partitioned Function refreshes: its partition keys as a
Lance filter, checked against the table as it is when the run starts."""

from __future__ import annotations

import dagster as dg

from ..errors import FunctionDefinitionError
from ..function_spec.functions import Function
from ..refresh.files import TableFiles


def run_slice(context: dg.OpExecutionContext | dg.AssetExecutionContext, function: Function,
              files: TableFiles) -> str | None:
    """The filter of the run's partitions (None for an unpartitioned Function): one partition, or a
    range (a single-run backfill), as one time window when the partitions are time windows.

    Raises FunctionDefinitionError naming the Function when the table has no partition column of
    a fitting type, or a key cannot be written as a filter on it.
    """
    partitioning = function.partitioning
    if partitioning is None:
        return None
    schema = files.dataset().schema
    problems = partitioning.problems(f"Function {function.name!r}", schema)
    if problems:
        raise FunctionDefinitionError("\n".join(problems))
    keys = list(context.partition_keys)
    window = (context.partition_time_window
              if isinstance(partitioning.partitions_def, dg.TimeWindowPartitionsDefinition) else None)
    try:
        return partitioning.where(keys, {f.name: f.type for f in schema}, window)
    except FunctionDefinitionError as err:  # its own subclass (a PartitionKeyError) kept
        raise type(err)(f"Function {function.name!r}: {err}") from None


def spans_partitions(context: dg.OpExecutionContext | dg.AssetExecutionContext) -> bool:
    """Whether the run refreshes several partitions at once (a single-run backfill): its
    materialization then reports each partition's own rows (`partition_figures`)."""
    return context.has_partition_key_range and len(context.partition_keys) > 1
