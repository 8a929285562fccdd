"""Durable progress of a refresh, so a killed run repeats only work done since the last checkpoint.

Computed output is saved every `checkpoint_seconds` as an Arrow IPC object named by its physical
row range, under a folder keyed by Function version and the fragment's content (input files,
output files, deletions), beside the table on the table's own storage (`files`): a worker that
dies on one node is resumed by a worker on another. A re-run with the same key reuses saved
chunks instead of calling the Function, and a finished fragment's Lance file is reused outright.
Nothing here is visible to table readers: the table only changes at commit, and the folder is
removed after it. Each object is written whole, so a kill never leaves half a chunk that a re-run
would trust.
"""

from __future__ import annotations

import json

import pyarrow as pa

from ..tags import OUTCOME_KEY
from .files import TableFiles
from .plan import FragmentWork


class CheckpointStore:
    def __init__(self, files: TableFiles, scope: str, function_version: str):
        """`scope`: the column's signature column, or a slice's scope (`slices.scope`)."""
        self.files = files
        self.root = f"_gpufn/checkpoints/{scope}"
        self.dir = f"{self.root}/{function_version}"

    def _fragment_dir(self, work: FragmentWork) -> str:
        return f"{self.dir}/{work.fragment_id}-{work.content_key}"

    def save_chunk(self, work: FragmentWork, start: int, end: int, batches: list[pa.RecordBatch],
                   outcome: dict) -> None:
        """Durably record the output for physical rows [start, end) of the fragment, and the
        outcome of computing it (failed rows, retried rows that succeeded, rows changed)."""
        schema = batches[0].schema.with_metadata({OUTCOME_KEY: json.dumps(outcome)})
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, schema) as writer:
            for batch in batches:
                writer.write_batch(batch.replace_schema_metadata(schema.metadata))
        self.files.write(f"{self._fragment_dir(work)}/{start:010d}-{end:010d}.arrow", sink.getvalue().to_pybytes())

    def chunks(self, work: FragmentWork) -> dict[int, tuple[int, str]]:
        """Saved chunks of the fragment: start row -> (end row, object name)."""
        found = {}
        folder = self._fragment_dir(work)
        for name in self.files.names(folder):
            if name.endswith(".arrow"):
                start, end = (int(p) for p in name.removesuffix(".arrow").split("-"))
                found[start] = (end, f"{folder}/{name}")
        return found

    def load_chunk(self, name: str) -> tuple[list[pa.RecordBatch], dict]:
        data = self.files.read(name)
        if data is None:
            raise FileNotFoundError(f"checkpoint chunk {self.files.path(name)} vanished")
        reader = pa.ipc.open_file(pa.py_buffer(data))
        batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        outcome = json.loads((reader.schema.metadata or {}).get(OUTCOME_KEY.encode(), b"{}"))
        return batches, outcome

    def save_fragment(self, work: FragmentWork, record: dict) -> None:
        self.files.write(f"{self._fragment_dir(work)}/done.json", json.dumps(record).encode())

    def load_fragment(self, work: FragmentWork) -> dict | None:
        data = self.files.read(f"{self._fragment_dir(work)}/done.json")
        return json.loads(data) if data is not None else None

    def discard_batches(self, work: FragmentWork) -> None:
        for _end, name in self.chunks(work).values():
            self.files.delete(name)

    def rows_saved(self) -> int:
        """The rows this Function version's checkpoints hold now (every fragment and shard): what a
        resumed refresh will not compute again."""
        rows = 0
        for name in self.files.names(self.dir):
            leaf = name.rsplit("/", 1)[-1]
            if leaf.endswith(".arrow"):
                start, end = (int(p) for p in leaf.removesuffix(".arrow").split("-"))
                rows += end - start
            elif leaf == "done.json":
                record = json.loads(self.files.read(f"{self.dir}/{name}") or b"{}")
                rows += int(record.get("rows", 0))
        return rows

    def clear(self) -> None:
        """Drop all progress for this column (every Function version): called after a commit."""
        self.files.delete_folder(self.root)
