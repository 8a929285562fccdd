"""What a table's commits changed: whether any changed rows at all (`changed_data`), the last version
that did (`data_version`), and which partitions of a partitioned Function they touched -- what the
sensors request and what the table's observations report.

Rows count as changed when a commit that changed data (`changed_data`: not gpufn's own
refreshes, not maintenance) created or last updated them -- Lance records both per row on tables
with stable row ids, as LanceDB tables made here are. On a sensor's first look, and for appends to
a table without stable row ids, the rows not computed yet (or failed) are the changed ones; an
update of such a table cannot be traced to its rows, so every partition holding rows is requested. One scan reads only the partition column(s) of the changed
rows; a `partition_filter` Function counts each partition's changed rows instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import dagster as dg
import lance

from ..function_spec.functions import Function
from ..function_spec.partitions import keys_of_values
from ..refresh.signature import FAILED
from ..tags import COMMIT_PREFIX


_NO_DATA_CHANGE = {"Rewrite", "CreateIndex", "UpdateConfig", "Project", "ReserveFragments", "UpdateMemWalState"}


def changed_data(operations: Iterable[tuple[str, str]]) -> bool:
    """Whether any (operation, commit message) since the cursor added or changed rows.

    >>> changed_data([("DataReplacement", "gpufn refresh docs.embedding"), ("Rewrite", ""), ("Merge", "")])
    False
    >>> changed_data([("DataReplacement", "gpufn: carry Function values over a view rebuild")])
    False
    >>> changed_data([("Append", ""), ("CreateIndex", "")])
    True
    """
    for operation, message in operations:
        if operation in _NO_DATA_CHANGE:
            continue
        if operation == "Merge":
            continue  # columns added (e.g. a Function's declaration): no row added or changed
        if operation == "DataReplacement" and message.startswith(COMMIT_PREFIX):
            continue  # gpufn wrote computed values (a refresh, or carrying them over a view rebuild)
        return True
    return False


def operations_since(dataset: lance.LanceDataset, version: int) -> list[tuple[str, str]]:
    """(operation, commit message) of every commit after `version`, oldest first."""
    count = dataset.version - version
    transactions = dataset.get_transactions(count) if count > 0 else []
    out = []
    for transaction in reversed(transactions):
        if transaction is None:  # transaction file cleaned up: assume it changed data
            out.append(("Unknown", ""))
            continue
        properties = transaction.transaction_properties or {}
        out.append((type(transaction.operation).__name__, properties.get("__lance_commit_message", "")))
    return out


def data_version(dataset: lance.LanceDataset) -> int:
    """The last version of the table whose commit changed rows (`changed_data`): a table's data
    version, which gpufn's own refreshes, column declarations and maintenance leave as it was.

    >>> import lance, pyarrow as pa, tempfile
    >>> uri = tempfile.mkdtemp() + "/t.lance"
    >>> ds = lance.write_dataset(pa.table({"x": [1]}), uri)
    >>> ds = lance.write_dataset(pa.table({"x": [2]}), uri, mode="append")
    >>> ds.create_scalar_index("x", "BTREE"); ds = lance.dataset(uri)
    >>> ds.version, data_version(ds)
    (3, 2)
    """
    looked = 0
    while looked < dataset.version - 1:
        count = min(max(2 * looked, 16), dataset.version - 1)  # the newest `count` commits, newest first
        for offset, transaction in enumerate(dataset.get_transactions(count)):
            if offset < looked:
                continue
            operation = ("Unknown", "") if transaction is None else (  # cleaned up: assume it changed data
                type(transaction.operation).__name__,
                (transaction.transaction_properties or {}).get("__lance_commit_message", ""))
            if changed_data([operation]):
                return dataset.version - offset
        looked = count
    return 1  # the table's creation


def appended_rows(dataset: lance.LanceDataset, base: int, operations: Sequence[tuple[str, str]]) -> int | None:
    """How many rows the commits after version `base` added, when every data change among them is
    an append; None when one updated or deleted rows (how many it touched is not in the metadata)."""
    if any(op not in ("Append", *_NO_DATA_CHANGE, "Merge", "DataReplacement") for op, _ in operations):
        return None
    return dataset.count_rows() - dataset.checkout_version(base).count_rows()


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
