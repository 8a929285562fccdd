"""Which partitions of a partitioned Function a table change touched: what its sensors request.

Rows count as changed when a commit that changed data (`triggers.changed_data`: not gpufn's own
refreshes, not maintenance) created or last updated them -- Lance records both per row on tables
with stable row ids, as LanceDB tables made here are. On a sensor's first look, and for appends to
a table without stable row ids, the rows not computed yet (or failed) are the changed ones; an
update of such a table cannot be traced to its rows, so every partition holding rows is requested. One scan reads only the partition column(s) of the changed
rows; a `partition_filter` Function counts each partition's changed rows instead.
"""

from __future__ import annotations

from collections.abc import Sequence

import dagster as dg
import lance

from ..function_spec.functions import Function
from ..function_spec.partitions import keys_of_values
from ..refresh.signature import FAILED


def unfilled_filter(function: Function, dataset: lance.LanceDataset) -> str | None:
    """Rows whose value was never computed or failed (None: all, the column does not exist yet)."""
    sig = function.sig_column
    return f"(`{sig}` IS NULL OR `{sig}` = {FAILED})" if sig in dataset.schema.names else None


def changed_filter(function: Function, dataset: lance.LanceDataset, data_versions: Sequence[int],
                   only_appends: bool) -> str | None:
    """Rows the commits at `data_versions` added or changed (none given: rows not computed yet, as
    on a sensor's first look); None: every row."""
    unfilled = unfilled_filter(function, dataset)
    if unfilled is None:
        return None
    if not data_versions:
        return unfilled
    if not dataset.has_stable_row_ids:
        return unfilled if only_appends else None  # appended rows are unfilled; updated ones cannot be traced
    versions = ", ".join(map(str, data_versions))
    return f"_row_created_at_version IN ({versions}) OR _row_last_updated_at_version IN ({versions})"


def changed_partitions(dataset: lance.LanceDataset, function: Function, selector: str | None,
                       instance: dg.DagsterInstance) -> list[str]:
    """The Function's partitions holding a row the filter `selector` selects (None: any row), in key order."""
    partitioning = function.partitioning
    assert partitioning is not None
    known = list(partitioning.partitions_def.get_partition_keys(dynamic_partitions_store=instance))
    if partitioning.template is not None:
        types = {f.name: f.type for f in dataset.schema}
        return [key for key in known
                if dataset.count_rows(filter=_both(partitioning.where([key], types), selector)) > 0]
    rows = dataset.scanner(filter=selector, columns=list(partitioning.columns)).to_table().to_pydict()
    return keys_of_values(partitioning, rows, known)


def _both(where: str, selector: str | None) -> str:
    return where if selector is None else f"({where}) AND ({selector})"
