"""Refreshing a slice of a table: the rows a Lance filter selects (a Dagster partition).

A slice refresh computes stale rows *of the slice* and nothing else. Its rows are found by one
Lance scan of the filter with no columns but the row address (`slice_rows`): Lance reads only the
filter's columns, or answers from a scalar index on them when the table has one (a BTREE or
BITMAP index on the partition column turns planning into an index lookup). Fragments without a
row of the slice are never opened; a fragment with rows of several slices is rewritten with the
other slices' rows carried as stored (values and signatures), never passed to the Function.

Slices of one column refresh side by side: each holds a lease of its own (named by its filter),
so two runs of the same partition still never compute the same rows twice. Two slices sharing a
fragment both rewrite its column file, and Lance refuses the second DataReplacement of the same
fragment and field. The loser then rebases (`rebase_groups`): for each such fragment it writes
the latest committed values with its own slice's rows put back from the file it computed, and
commits again at the latest version -- nothing recomputed, nothing of the other slice lost. Commits
of slices of one column take a short commit lock, so a rebase is never itself overtaken.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import lance
import numpy as np
import pyarrow as pa
from lance.file import LanceFileReader

from .files import TableFiles
from .reads import ADDRESS, row_offsets
from .write import FragmentFileWriter, align_to_physical, data_file_name

SLICE_FILE_PREFIX = "gpufn-slice"  # a file holding one slice's rows computed: never taken as a clean fragment
COMMIT_LOCK = "commit"  # the scope of the short lock slices of one column take to commit


def scope(sig_column: str, where: str | None, part: str | None = None) -> str:
    """The name a refresh keeps its lease, checkpoints and written files under: the column's own
    for a whole-column refresh, one per slice, so slices never wait for or clear each other's.

    >>> scope("_gpufn_sig_y", None), scope("_gpufn_sig_y", "day = 1"), scope("_gpufn_sig_y", None, COMMIT_LOCK)
    ('_gpufn_sig_y', '_gpufn_sig_y@352a82b0a3dcce48', '_gpufn_sig_y@commit')
    """
    tail = part or (slice_key(where) if where else None)
    return f"{sig_column}@{tail}" if tail else sig_column


def slice_key(where: str) -> str:
    """A short stable name of a slice's filter: its lease and its per-fragment checkpoints.

    >>> slice_key("day >= date '2026-01-01' AND day < date '2026-01-02'")
    '0783f3c6990978cd'
    """
    return hashlib.sha256(where.encode()).hexdigest()[:16]


def slice_rows(dataset: lance.LanceDataset, where: str) -> dict[int, np.ndarray]:
    """The slice's live rows per fragment: fragment id -> sorted physical offsets.

    One scan that reads only the filter's columns (or a scalar index on them) and the row addresses.

    >>> import pyarrow as pa, tempfile
    >>> ds = lance.write_dataset(pa.table({"day": [1, 2, 1, 3]}), tempfile.mkdtemp() + "/t.lance")
    >>> {k: v.tolist() for k, v in slice_rows(ds, "day = 1").items()}
    {0: [0, 2]}
    """
    addresses = dataset.scanner(filter=where, columns=[], with_row_address=True).to_table().column(ADDRESS)
    values = np.sort(addresses.to_numpy())
    fragments = (values >> np.uint64(32)).astype(np.int64)
    offsets = row_offsets(values)
    cuts = np.flatnonzero(np.diff(fragments)) + 1
    return {int(f[0]): o for f, o in zip(np.split(fragments, cuts), np.split(offsets, cuts), strict=True) if len(f)}


def _stored(dataset: lance.LanceDataset, fragment_id: int, names: list[str], schema: pa.Schema) -> pa.RecordBatch:
    """The fragment's stored values of `names`, aligned to its physical rows (deleted rows NULL)."""
    fragment = dataset.get_fragment(fragment_id)
    table = fragment.to_table(columns=names, with_row_address=True)
    batch = pa.RecordBatch.from_arrays([table.column(n).combine_chunks() for n in names], schema=schema)
    if table.num_rows:
        batch = align_to_physical(batch, row_offsets(table.column(ADDRESS).to_numpy()), 0, schema)
    missing = fragment.metadata.physical_rows - batch.num_rows
    if missing > 0:
        batch = pa.concat_batches([batch, pa.RecordBatch.from_arrays(
            [pa.nulls(missing, f.type) for f in schema], schema=schema)])
    return batch


def rebase_groups(files: TableFiles, latest: lance.LanceDataset, names: list[str],
                  ours: list[tuple[lance.LanceOperation.DataReplacementGroup, np.ndarray | None]],
                  note: Callable[[str], None]) -> list[lance.LanceOperation.DataReplacementGroup] | None:
    """Our rewritten fragments moved onto the latest version: each fragment's new file holds the
    latest committed values, with our slice's rows (`np.ndarray` of physical offsets; None: every
    row) taken from the file we computed, which is then deleted. `note` records each new file
    before it is written (`leftovers`). None when a fragment we rewrote is gone (compacted): the
    caller plans again."""
    present = {f.fragment_id for f in latest.get_fragments()}
    schema = pa.schema([latest.schema.field(n) for n in names])
    rebased = []
    for group, offsets in ours:
        if group.fragment_id not in present:
            return None
        if offsets is None:  # the whole fragment is ours: our file stands as it is
            rebased.append(group)
            continue
        mine = LanceFileReader(files.path(f"data/{group.new_file.path}"),
                               storage_options=files.storage_options or None).read_all().to_table()
        theirs = _stored(latest, group.fragment_id, names, schema)
        index = np.arange(theirs.num_rows)
        index[offsets] = theirs.num_rows + offsets
        take = pa.array(index)
        merged = pa.RecordBatch.from_arrays(
            [pa.concat_arrays([theirs.column(n), mine.column(n).combine_chunks().cast(schema.field(n).type)]).take(take)
             for n in names], schema=schema)
        name = data_file_name(SLICE_FILE_PREFIX)
        note(name)
        writer = FragmentFileWriter(files, latest, name, schema)
        writer.write(merged)
        writer.close()
        files.delete(f"data/{group.new_file.path}")
        rebased.append(lance.LanceOperation.DataReplacementGroup(group.fragment_id, writer.data_file()))
    return rebased
