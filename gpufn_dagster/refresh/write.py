"""Writing one fragment's new column values as a Lance data file aligned to its physical rows.

A `DataReplacement` swaps a field's file per fragment, so the new file must hold exactly
`physical_rows` rows in physical order; rows deleted from the fragment are written as NULL.
"""

from __future__ import annotations

import uuid

import lance
import numpy as np
import pyarrow as pa
from lance.file import LanceFileWriter

from ..function_spec.functions import FunctionDefinitionError
from .files import TableFiles


def storage_version(dataset: lance.LanceDataset) -> tuple[str, int, int]:
    version = dataset.data_storage_version
    if version in ("legacy", "0.1"):
        raise FunctionDefinitionError(
            f"table {dataset.uri}: Lance file format {version} cannot hold per-fragment column files; "
            "rewrite it with data_storage_version='stable'")
    major, minor = (int(p) for p in version.split("."))
    return version, major, minor


def data_file_name(prefix: str) -> str:
    """A new, unique data file name (`<prefix>-<uuid>.lance`)."""
    return f"{prefix}-{uuid.uuid4().hex}.lance"


class FragmentFileWriter:
    """Streams one fragment's output batches into a Lance file aligned to its physical rows."""

    def __init__(self, files: TableFiles, dataset: lance.LanceDataset, name: str, schema: pa.Schema):
        version, self.major, self.minor = storage_version(dataset)
        self.name = name
        self.schema = schema
        self.writer = LanceFileWriter(files.path(f"data/{self.name}"), schema, version=version,
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

    def data_file(self, field_ids: list[int]) -> lance.fragment.DataFile:
        return lance.fragment.DataFile(self.name, field_ids, list(range(len(field_ids))), self.major, self.minor)


def align_to_physical(batch: pa.RecordBatch, offsets: np.ndarray, start: int, schema: pa.Schema) -> pa.RecordBatch:
    """Place live rows at their physical offsets in [start, last+1); deleted rows become NULL."""
    end = int(offsets[-1]) + 1
    if end - start == len(offsets):
        return batch
    index = np.full(end - start, -1, dtype=np.int64)
    index[offsets - start] = np.arange(len(offsets))
    take = pa.array(index, mask=index < 0)
    return pa.RecordBatch.from_arrays([col.take(take) for col in batch.columns], schema=schema)


