"""Durable progress of a refresh, so a killed run repeats only the batch it was in.

Every computed batch is saved as an Arrow IPC file named by its physical row range, under a
directory keyed by Function version and the fragment's state (input files, output files,
deletions, batch size). A re-run with the same key reuses saved batches instead of calling the
Function, and a finished fragment's Lance file is reused outright. Nothing here is visible to
table readers: the table only changes at commit, and the directory is removed after it.
Writes go to a temporary name and are renamed into place, so a kill never leaves half a file
that a re-run would trust.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow as pa

from .plan import FragmentWork


class CheckpointStore:
    def __init__(self, table_uri: str, sig_column: str, function_version: str):
        self.root = Path(table_uri) / "_gpufn" / "checkpoints" / sig_column
        self.dir = self.root / function_version

    def _fragment_dir(self, work: FragmentWork) -> Path:
        return self.dir / f"{work.fragment_id}-{work.state_key}"

    @staticmethod
    def _atomic_write(path: Path, write) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        write(tmp)
        os.replace(tmp, path)

    def save_batch(self, work: FragmentWork, start: int, end: int, batch: pa.RecordBatch, failed: list[dict]) -> None:
        def write(tmp: Path) -> None:
            meta = batch.schema.with_metadata({"gpufn.errors": json.dumps(failed)})
            with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, meta) as writer:
                writer.write_batch(batch.replace_schema_metadata(meta.metadata))

        self._atomic_write(self._fragment_dir(work) / f"{start:010d}-{end:010d}.arrow", write)

    def load_batch(self, work: FragmentWork, start: int, end: int) -> tuple[pa.RecordBatch, list[dict]] | None:
        path = self._fragment_dir(work) / f"{start:010d}-{end:010d}.arrow"
        if not path.exists():
            return None
        with pa.memory_map(str(path)) as source:
            reader = pa.ipc.open_file(source)
            batch = reader.get_batch(0) if reader.num_record_batches else reader.schema.empty_table().to_batches()[0]
            errors = json.loads((reader.schema.metadata or {}).get(b"gpufn.errors", b"[]"))
        return batch, errors

    def save_fragment(self, work: FragmentWork, record: dict) -> None:
        self._atomic_write(self._fragment_dir(work) / "done.json", lambda tmp: tmp.write_text(json.dumps(record)))

    def load_fragment(self, work: FragmentWork) -> dict | None:
        path = self._fragment_dir(work) / "done.json"
        return json.loads(path.read_text()) if path.exists() else None

    def discard_batches(self, work: FragmentWork) -> None:
        for path in self._fragment_dir(work).glob("*.arrow"):
            path.unlink()

    def clear(self) -> None:
        """Drop all progress for this column (every Function version): called after a commit."""
        shutil.rmtree(self.root, ignore_errors=True)
