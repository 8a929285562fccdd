"""Putting a fragment's Function files back into one file when they pile up (opt-in: a refresh
compacts only with `RefreshOptions.max_function_files`; call `compact_function_files` yourself).

Each Function writes its column and its signature into a data file of its own per fragment (a
`DataReplacement` swaps exactly one file's fields), so a fragment of a table with 50 Functions
holds 51 files, and a reader of every value opens each (BENCHMARKS.md: 1.75x the CPU of the same
values in one file). Lance's `compact_files` merges them only where it rewrites a whole fragment,
which it does for fragments below its row target. Here the Function files of each fragment that
holds more than `max_files` of them become one file -- their values as they are, every physical
row in order, deleted ones included -- and the fragments' new file lists are committed with Lance's
`Merge`, which keeps fragment ids, row ids and row addresses, at the version read. A column with an
index (an embedding's vector index) keeps its own file: Lance drops an index's coverage of a
fragment whose file of the indexed column changed, and this would change it for nothing.

It never races a refresh: it runs only when it can take every Function's lease (and every slice
lease in use) at once without waiting -- a refresh in flight makes it leave the table as it is for
a later try -- and holds them until it has committed. A refresh that starts meanwhile waits for the
lease as for another refresh of its column. Lance refuses the commit if another writer changed the
table meanwhile (an append, a delete); then nothing changed, its file is removed, and a later try
compacts. Values and signatures are copied, not recomputed: the next refresh of each Function
finds its rows current.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import lance
import pyarrow as pa
from lance.file import LanceFileReader

from ..tags import FUNCTION_KEY, SIG_COLUMN_KEY
from .files import TableFiles
from .leftovers import WrittenFiles
from .lease import ColumnLease
from .write import FragmentFileWriter, data_file_name, file_field_ids

# More Function files than this in one fragment get compacted, by default.
MAX_FUNCTION_FILES = 16
# Rows copied at a time: bounds the memory to one chunk of every Function column of one fragment.
CHUNK_ROWS = 65_536
HOLDER = "gpufn compaction of Function files"


@dataclass(frozen=True)
class Compaction:
    """What one try did: fragments whose Function files became one, and the files before and after;
    `skipped` says why it did nothing (nothing piled up, a refresh in flight, a concurrent writer)."""

    fragments: int = 0
    files_before: int = 0
    files_after: int = 0
    skipped: str | None = None


def function_columns(schema: pa.Schema) -> list[str]:
    """The table's Function columns (values and signatures), in the table's order.

    >>> meta = {FUNCTION_KEY: "t__y", SIG_COLUMN_KEY: "_gpufn_sig_y"}
    >>> function_columns(pa.schema([("x", pa.int64()), pa.field("y", pa.int64(), metadata=meta),
    ...                             pa.field("_gpufn_sig_y", pa.uint64(), metadata=meta)]))
    ['y', '_gpufn_sig_y']
    """
    return [f.name for f in schema if FUNCTION_KEY.encode() in (f.metadata or {})]


def lease_scopes(schema: pa.Schema) -> list[str]:
    """The lease of each Function on the table (its signature column names it), sorted."""
    return sorted({(f.metadata or {})[SIG_COLUMN_KEY.encode()].decode() for f in schema
                   if SIG_COLUMN_KEY.encode() in (f.metadata or {})})


# The field id Lance gives a file's column once a later file replaced it (`DataReplacement`).
TOMBSTONE = -2


def indexed_columns(dataset: lance.LanceDataset) -> set[str]:
    """The columns an index covers."""
    return {name for index in dataset.describe_indices() for name in index.field_names}


def piled_up(fragment: lance.fragment.FragmentMetadata, function_ids: set[int], max_files: int) -> list[int]:
    """The positions, in the fragment's file list, of its Function files (files holding nothing but
    Function columns, some perhaps replaced since) when there are more than `max_files` of them; else none.

    >>> from lance.fragment import DataFile, FragmentMetadata
    >>> fragment = FragmentMetadata(0, [DataFile("a", [0, 1]), DataFile("b", [2, 3]), DataFile("c", [TOMBSTONE, 5])], 10)
    >>> piled_up(fragment, {2, 3, 4, 5}, 1), piled_up(fragment, {2, 3, 4, 5}, 2)
    ([1, 2], [])
    """
    positions = [i for i, f in enumerate(fragment.files)
                 if any(i != TOMBSTONE for i in f.fields) and set(f.fields) - {TOMBSTONE} <= function_ids]
    return positions if len(positions) > max_files else []


def _merged_file(files: TableFiles, dataset: lance.LanceDataset, fragment: lance.fragment.FragmentMetadata,
                 positions: list[int], name_of: dict[int, str], written: WrittenFiles) -> lance.fragment.DataFile:
    """Write the fragment's Function files as one file, chunk by chunk, aligned to its physical rows."""
    readers, columns = [], []
    for position in positions:
        data_file = fragment.files[position]
        names = list(dict.fromkeys(name_of[i] for i in data_file.fields if i != TOMBSTONE))  # its live columns
        readers.append((LanceFileReader(files.path(f"data/{data_file.path}"),
                                        storage_options=files.storage_options or None), names))
        columns.extend(names)
    ordered = [f.name for f in dataset.schema if f.name in set(columns)]
    schema = pa.schema([dataset.schema.field(name) for name in ordered])
    name = data_file_name("gpufn-compacted")
    written.note(name)  # a try killed before its commit leaves it to the next try to delete
    writer = FragmentFileWriter(files, dataset, name, schema)
    try:
        for start in range(0, fragment.physical_rows, CHUNK_ROWS):
            rows = min(CHUNK_ROWS, fragment.physical_rows - start)
            chunk: dict[str, pa.Array] = {}
            for reader, names in readers:
                table = reader.read_range(start, rows, batch_size=rows).to_table()
                chunk.update((name, table.column(name)) for name in names)
            writer.write(pa.RecordBatch.from_arrays([pa.concat_arrays(chunk[n].chunks) if isinstance(chunk[n], pa.ChunkedArray)
                                                     else chunk[n] for n in ordered], schema=schema))
    finally:
        writer.close()
    return writer.data_file()


def compact_function_files(files: TableFiles, max_files: int = MAX_FUNCTION_FILES) -> Compaction:
    """Make the Function files of every fragment holding more than `max_files` of them one file.

    Example:
        >>> import tempfile, pyarrow as pa, pyarrow.compute as pc
        >>> from gpufn_dagster import make_function, refresh_column
        >>> uri = tempfile.mkdtemp() + "/t.lance"
        >>> _ = lance.write_dataset(pa.table({"x": [1, 2, 3]}), uri)
        >>> def adding(k):
        ...     return lambda x: pc.add(x, k)
        >>> for k in range(3):
        ...     _ = refresh_column(uri, make_function(adding(k), table="t", column=f"y{k}", output_type=pa.int64()))
        >>> [len(f.data_files()) for f in lance.dataset(uri).get_fragments()]
        [4]
        >>> compact_function_files(TableFiles(uri), max_files=2)
        Compaction(fragments=1, files_before=3, files_after=1, skipped=None)
        >>> [len(f.data_files()) for f in lance.dataset(uri).get_fragments()], lance.dataset(uri).to_table(columns=["y2"])["y2"].to_pylist()
        ([2], [3, 4, 5])
    """
    dataset = files.dataset()
    names = function_columns(dataset.schema)
    if not names:
        return Compaction(skipped="no Function columns")
    def piled(columns: list[str]) -> dict[int, str]:
        """Each field id of `columns`, with its column, if some fragment's files of them piled up; else {}."""
        ids = {i: name for name in columns for i in file_field_ids(dataset, [name])}
        return ids if any(piled_up(f.metadata, set(ids), max_files) for f in dataset.get_fragments()) else {}

    # Indexes are read only when files piled up: every refresh asks, few find any.
    if not piled(names) or not (name_of := piled([n for n in names if n not in indexed_columns(dataset)])):
        return Compaction(skipped=f"no fragment holds more than {max_files} Function files")
    columns = set(lease_scopes(dataset.schema))  # and each slice's lease in use (`slices.scope`: column@slice)
    in_use = {name.split("/")[0] for name in files.names("_gpufn/leases")}
    scopes = sorted(columns | {scope for scope in in_use if scope.split("@")[0] in columns})
    leases: list[ColumnLease] = []
    written = WrittenFiles(files, "compaction")
    committed = False
    try:
        for scope in scopes:
            lease = ColumnLease(files, scope, HOLDER)
            if not lease.try_acquire():
                return Compaction(skipped=f"a refresh holds the lease {scope}: the table is left for a later try")
            leases.append(lease)
        dataset = files.dataset()  # as it is now that no refresh can commit
        fragments = [f.metadata for f in dataset.get_fragments()]
        merged_files, replaced, before = [], [], 0
        for fragment in fragments:
            positions = piled_up(fragment, set(name_of), max_files)
            if not positions:
                replaced.append(fragment)
                continue
            merged = _merged_file(files, dataset, fragment, positions, name_of, written)
            merged_files.append(merged)
            before += len(positions)
            kept = [f for i, f in enumerate(fragment.files) if i not in positions]
            replaced.append(dataclasses.replace(fragment, files=[*kept, merged]))
        if not merged_files:
            return Compaction(skipped=f"no fragment holds more than {max_files} Function files")
        for lease in leases:
            lease.check()
        try:
            files.commit(lance.LanceOperation.Merge(replaced, dataset.lance_schema, preserves_nullability=True),
                         dataset.version, f"gpufn: the Function files of {len(merged_files)} fragments made one each")
        except (OSError, RuntimeError, ValueError) as error:  # another writer changed the table meanwhile
            return Compaction(skipped=f"another writer changed the table meanwhile ({str(error).splitlines()[0][:200]})")
        committed = True
        return Compaction(len(merged_files), before, len(merged_files))
    finally:
        if not committed:  # whatever stopped it: the files it wrote are no version's
            for name in written.created:
                files.delete(f"data/{name}")
        if leases:  # and those of an earlier try killed before its commit
            written.settle(files.dataset())
        for lease in leases:
            lease.release()
