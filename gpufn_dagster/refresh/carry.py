"""Keeping Function values on a lancedb materialized view across a rebuild.

lancedb rebuilds a local view whenever the view table was written by someone else since its
last refresh -- which a Function refresh on the view always is -- and a rebuild rewrites every
row with this engine's columns NULL. Each view row keeps its `__source_row_id`, so the values
(and signatures) of rows that survived are put back by that id, in one DataReplacement. The next
Function refresh then recomputes only rows whose signature no longer matches: rows the view
gained, or rows whose inputs changed in the source.

Memory: the previous version's Function columns for the whole view are held while joining.
"""

from __future__ import annotations

import lance
import numpy as np
import pyarrow as pa

from ..tags import CARRY_COMMIT_MESSAGE, SIG_COLUMN_KEY
from .files import TableFiles
from .reads import ADDRESS, row_offsets
from .write import FragmentFileWriter, align_to_physical, data_file_name

SOURCE_ROW_ID = "__source_row_id"


def function_columns(schema: pa.Schema) -> list[str]:
    return [f.name for f in schema if f.metadata and SIG_COLUMN_KEY.encode() in f.metadata]


def carry_over(view: TableFiles, previous_version: int) -> int:
    """Put back Function values lost in a rebuild; returns how many rows got their values back."""
    current = view.dataset()
    previous = view.dataset(previous_version)
    names = [n for n in function_columns(current.schema) if n in previous.schema.names]
    if not names or SOURCE_ROW_ID not in current.schema.names:
        return 0
    sig_columns = sorted({current.schema.field(n).metadata[SIG_COLUMN_KEY.encode()].decode() for n in names})
    old = previous.to_table(columns=[SOURCE_ROW_ID, *names])
    schema = pa.schema([current.schema.field(n) for n in names])
    groups, carried = [], 0
    for fragment in current.get_fragments():
        rows = fragment.to_table(columns=[SOURCE_ROW_ID], with_row_address=True)
        if rows.num_rows == 0:
            continue
        rows = rows.append_column("__pos", pa.array(np.arange(rows.num_rows)))
        joined = rows.join(old, keys=SOURCE_ROW_ID, join_type="left outer").sort_by("__pos")
        carried += sum(joined.num_rows - joined.column(s).null_count for s in sig_columns) // len(sig_columns)
        batch = pa.RecordBatch.from_arrays([joined.column(n).combine_chunks() for n in names], schema=schema)
        offsets = row_offsets(joined.column(ADDRESS).to_numpy())
        writer = FragmentFileWriter(view, current, data_file_name("gpufn-carry"), schema)
        writer.write(align_to_physical(batch, offsets, 0, schema))
        writer.pad_to(fragment.metadata.physical_rows)
        writer.close()
        groups.append(lance.LanceOperation.DataReplacementGroup(fragment.fragment_id, writer.data_file()))
    if carried:
        view.commit(lance.LanceOperation.DataReplacement(groups), current.version,
                    CARRY_COMMIT_MESSAGE)
    return carried
