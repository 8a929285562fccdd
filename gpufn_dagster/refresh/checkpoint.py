"""Durable progress of a refresh, so a killed run repeats only work done since the last checkpoint.

Computed output is saved every `checkpoint_seconds` (and batch boundaries are deterministic) as
an Arrow IPC file named by its physical row range, under a
directory keyed by Function version and the fragment's state (input files, output files,
deletions, batch size). A re-run with the same key reuses saved chunks instead of calling the
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
        return self.dir / f"{work.fragment_id}-{work.content_key}"

    @staticmethod
    def _atomic_write(path: Path, write) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        write(tmp)
        os.replace(tmp, path)

    def save_chunk(self, work: FragmentWork, start: int, end: int, batches: list[pa.RecordBatch],
                   outcome: dict) -> None:
        """Durably record the output for physical rows [start, end) of the fragment, and the
        outcome of computing it (failed rows, retried rows that succeeded, rows changed)."""
        schema = batches[0].schema.with_metadata({"gpufn.outcome": json.dumps(outcome)})

        def write(tmp: Path) -> None:
            with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
                for batch in batches:
                    writer.write_batch(batch.replace_schema_metadata(schema.metadata))

        self._atomic_write(self._fragment_dir(work) / f"{start:010d}-{end:010d}.arrow", write)

    def chunks(self, work: FragmentWork) -> dict[int, tuple[int, Path]]:
        """Saved chunks of the fragment: start row -> (end row, file)."""
        found = {}
        for path in self._fragment_dir(work).glob("*.arrow"):
            start, end = (int(p) for p in path.stem.split("-"))
            found[start] = (end, path)
        return found

    @staticmethod
    def load_chunk(path: Path) -> tuple[list[pa.RecordBatch], dict]:
        with pa.memory_map(str(path)) as source:
            reader = pa.ipc.open_file(source)
            batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
            outcome = json.loads((reader.schema.metadata or {}).get(b"gpufn.outcome", b"{}"))
        return batches, outcome

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
