"""Chained Functions: a Function may read another Function's output column, but only once it is current.

Refreshing the downstream Function over an upstream column that is missing, failed or stale for
some rows would compute values from inputs about to change (and pay for them twice), so the
refresh refuses before computing anything, naming the upstream Function to materialize first.
"""

from __future__ import annotations

from collections.abc import Sequence

import lance
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import UpstreamNotCurrent
from ..function_spec.functions import Function
from ..tags import FUNCTION_KEY, SIG_COLUMN_KEY
from .files import TableFiles
from .plan import plan_fragments
from .signature import FAILED, row_signatures, scan_expressions
from .state import load_state


def _stale_rows(files: TableFiles, dataset: lance.LanceDataset, function: Function, where: str | None) -> int:
    """Rows (of the slice `where`) whose stored value of the Function is missing, failed or not for
    their inputs now."""
    if function.sig_column not in dataset.schema.names:
        return dataset.count_rows(filter=where)
    stale = 0
    columns = {n: f"`{n}`" for n in [*function.inputs, function.sig_column]} | scan_expressions(
        function, dataset.schema)
    for item in plan_fragments(dataset, function, load_state(files, function.sig_column), where=where):
        for batch in dataset.get_fragment(item.fragment_id).scanner(columns=columns, filter=where).to_batches():
            now = row_signatures(function, batch)
            stale += int(pc.sum(pc.fill_null(pc.not_equal(batch.column(function.sig_column), now), True)
                                .cast(pa.int64())).as_py() or 0)
    return stale


def check_upstream(files: TableFiles, dataset: lance.LanceDataset, function: Function,
                   upstream: Sequence[Function] = (), where: str | None = None) -> None:
    """Refuse to start when an input column is another Function's output that is not current (for
    the rows of the slice `where`, when one is refreshed).

    `upstream` are the Functions known to produce some of the inputs; an input whose column was
    declared by a Function not given here is checked by its stored signatures alone.
    """
    schema = dataset.schema
    for name in function.inputs:
        producer = next((u for u in upstream if name in u.columns and u.table == function.table), None)
        if producer is not None:
            stale = (_stale_rows(files, dataset, producer, where) if name in schema.names
                     else dataset.count_rows(filter=where))
            producer_name = producer.name
        elif name in schema.names and SIG_COLUMN_KEY.encode() in (schema.field(name).metadata or {}):
            metadata = schema.field(name).metadata
            sig_column = metadata[SIG_COLUMN_KEY.encode()].decode()
            producer_name = metadata.get(FUNCTION_KEY.encode(), b"?").decode()
            missing = f"(`{sig_column}` IS NULL OR `{sig_column}` = {FAILED})"
            stale = dataset.count_rows(filter=missing if where is None else f"{missing} AND ({where})")
        else:
            continue
        if stale:
            raise UpstreamNotCurrent(
                f"Function {function.name!r} reads column {name!r}, computed by Function {producer_name!r}, which is "
                f"not current for {stale:,} of {dataset.count_rows(filter=where):,} rows of table {function.table!r}"
                + ("" if where is None else f" where {where}") + "; materialize "
                f"{producer_name!r} first (Materialize all runs it before {function.name!r}). Nothing was computed.")
