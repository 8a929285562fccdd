"""Writing one fragment's new column values as a Lance data file aligned to its physical rows.

A `DataReplacement` swaps a field's file per fragment, so the new file must hold exactly
`physical_rows` rows in physical order; rows deleted from the fragment are written as NULL.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import lance
import numpy as np
import pyarrow as pa
from lance.file import LanceFileWriter

from ..function_spec.functions import FunctionDefinitionError
from ..tags import SIG_COLUMN_KEY
from .files import TableFiles


def storage_version(dataset: lance.LanceDataset) -> tuple[str, int, int]:
    version = dataset.data_storage_version
    if version in ("legacy", "0.1"):
        raise FunctionDefinitionError(
            f"table {dataset.uri}: Lance file format {version} cannot hold per-fragment column files; "
            "rewrite it with data_storage_version='stable'")
    major, minor = (int(p) for p in version.split("."))
    return version, major, minor


def preorder(field: Any) -> Iterator[Any]:
    """A Lance field, then its children's fields, depth first."""
    yield field
    for child in field.children():
        yield from preorder(child)


def file_field_ids(dataset: lance.LanceDataset, names: list[str] | tuple[str, ...]) -> list[int]:
    """The field ids a new data file of the named columns lists, as Lance's own writer lists them:
    every field, nested ones included (format 2.0), or only the leaves (2.1+: a list or struct field
    has no column of its own, its items and members do). Its column indices are 0, 1, ... in that order.

    >>> import tempfile
    >>> t = pa.table({"id": [1], "v": pa.array([[1.0]], pa.list_(pa.float32()))})
    >>> file_field_ids(lance.write_dataset(t, tempfile.mkdtemp(), data_storage_version="2.1"), ["v"])
    [2]
    >>> file_field_ids(lance.write_dataset(t, tempfile.mkdtemp(), data_storage_version="2.0"), ["v"])
    [1, 2]
    """
    _, major, minor = storage_version(dataset)
    schema = dataset.lance_schema
    fields = [nested for name in names for nested in preorder(schema.field(name))]
    return [f.id() for f in fields if (major, minor) < (2, 1) or not f.children()]


# A signature is 64 random bits: Lance's compression finds nothing to save in it, and trying costs
# about as much CPU as encoding the Function's own int64 output (bench/row_cost_bench.py).
_UNCOMPRESSED = {"lance-encoding:compression": "none"}


def file_schema(schema: pa.Schema) -> pa.Schema:
    """The schema a new data file is written with: the signature columns (`SIG_COLUMN_KEY` names
    the field itself) stored uncompressed; the dataset's own schema is left as it is.

    >>> f = pa.field("_gpufn_sig_y", pa.uint64(), metadata={SIG_COLUMN_KEY: "_gpufn_sig_y"})
    >>> file_schema(pa.schema([pa.field("y", pa.int64()), f])).field(1).metadata[b"lance-encoding:compression"]
    b'none'
    """
    def encoded(field: pa.Field) -> pa.Field:
        is_signature = (field.metadata or {}).get(SIG_COLUMN_KEY.encode()) == field.name.encode()
        return field.with_metadata({**(field.metadata or {}), **_UNCOMPRESSED}) if is_signature else field

    return pa.schema([encoded(f) for f in schema], metadata=schema.metadata)


def data_file_name(prefix: str) -> str:
    """A new, unique data file name (`<prefix>-<uuid>.lance`)."""
    return f"{prefix}-{uuid.uuid4().hex}.lance"


class FragmentFileWriter:
    """Streams one fragment's output batches into a Lance file aligned to its physical rows."""

    def __init__(self, files: TableFiles, dataset: lance.LanceDataset, name: str, schema: pa.Schema):
        version, self.major, self.minor = storage_version(dataset)
        self.name = name
        self.schema = schema
        self.field_ids = file_field_ids(dataset, schema.names)
        self.writer = LanceFileWriter(files.path(f"data/{self.name}"), file_schema(schema), version=version,
                                      storage_options=files.storage_options or None)
        self.rows = 0

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows:
            self.writer.write_batch(batch)
            self.rows += batch.num_rows

    def pad_to(self, rows: int) -> None:
        if rows > self.rows:
            self.write(pa.RecordBatch.from_arrays(
                [pa.nulls(rows - self.rows, f.type) for f in self.schema], schema=self.schema))

    def close(self) -> None:
        self.writer.close()

    def data_file(self) -> lance.fragment.DataFile:
        """The written file as a fragment's data file of its columns."""
        return lance.fragment.DataFile(self.name, self.field_ids, list(range(len(self.field_ids))), self.major,
                                       self.minor)


def align_to_physical(batch: pa.RecordBatch, offsets: np.ndarray, start: int, schema: pa.Schema) -> pa.RecordBatch:
    """Place live rows at their physical offsets in [start, last+1); deleted rows become NULL."""
    end = int(offsets[-1]) + 1
    if end - start == len(offsets):
        return batch
    index = np.full(end - start, -1, dtype=np.int64)
    index[offsets - start] = np.arange(len(offsets))
    take = pa.array(index, mask=index < 0)
    return pa.RecordBatch.from_arrays([col.take(take) for col in batch.columns], schema=schema)


