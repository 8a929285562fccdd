"""Durable progress of a refresh, so a killed run repeats only work done since the last checkpoint.

Computed output is saved every `checkpoint_seconds` as an Arrow IPC object named by its physical
row range, under a folder keyed by Function version and the fragment's content (input files,
output files, deletions), beside the table on the table's own storage (`files`): a worker that
dies on one node is resumed by a worker on another. A re-run with the same key reuses saved
chunks instead of calling the Function, and a finished fragment's Lance file is reused outright.
Nothing here is visible to table readers: the table only changes at commit, and the folder is
removed after it. Each object is written whole, so a kill never leaves half a chunk that a re-run
would trust.

The key makes the saved parts any later refresh's, not only a re-execution's: a new run of the
same Function version over the same fragment content adopts them. Each part carries the checksum
of its output, verified before it is used, and one that fails is removed and computed again
(`PartDamaged`): a chunk the SHA-256 of its bytes, in its name (`<start>-<end>-<checksum>.arrow`,
so name and bytes are written as one; hashing bytes already in memory costs ~0.7 ns a byte); a
finished fragment's file, written by Lance's file writer straight to the store, the store's own
checksum of it (size and entity tag, `TableFiles.stored_checksum`), in its `done.json` -- hashing
its bytes would mean reading every file back after writing it, 15% more CPU on a trivial refresh.
"""

from __future__ import annotations

import json

import pyarrow as pa

from ..errors import PartDamaged
from ..tags import OUTCOME_KEY
from .files import TableFiles, checksum
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
        data = sink.getvalue().to_pybytes()
        self.files.write(f"{self._fragment_dir(work)}/{start:010d}-{end:010d}-{checksum(data)}.arrow", data)

    def chunks(self, work: FragmentWork) -> dict[int, tuple[int, str]]:
        """Saved chunks of the fragment: start row -> (end row, object name). A chunk saved without
        a checksum (by an older release) is not one: its rows are computed again."""
        found = {}
        folder = self._fragment_dir(work)
        for name in self.files.names(folder):
            if (span := chunk_span(name)) is not None:
                found[span[0]] = (span[1], f"{folder}/{name}")
        return found

    def load_chunk(self, name: str) -> tuple[list[pa.RecordBatch], dict]:
        """A chunk's batches and outcome, once its bytes match the checksum in its name
        (`PartDamaged` when they do not; the chunk is removed, so the next look computes its rows)."""
        data = self.files.read(name)
        if data is None:
            raise FileNotFoundError(f"checkpoint chunk {self.files.path(name)} vanished")
        expected, found = name.rsplit("-", 1)[-1].removesuffix(".arrow"), checksum(data)
        if found != expected:
            self.files.delete(name)
            raise PartDamaged(f"checkpoint chunk {self.files.path(name)} failed its checksum (sha256 "
                              f"{found}, saved as {expected}); its rows are computed again")
        reader = pa.ipc.open_file(pa.py_buffer(data))
        batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        outcome = json.loads((reader.schema.metadata or {}).get(OUTCOME_KEY.encode(), b"{}"))
        return batches, outcome

    def save_fragment(self, work: FragmentWork, record: dict) -> None:
        """Record the fragment as finished: `record` names its file (None: nothing changed) with the
        file's checksum, and the outcome."""
        self.files.write(f"{self._fragment_dir(work)}/done.json", json.dumps(record).encode())

    def load_fragment(self, work: FragmentWork) -> dict | None:
        """The fragment's finished record, once its file is there and matches its checksum; None
        when there is none. A record whose file is gone, was saved without a checksum, or fails it
        is removed with its file (`PartDamaged` says which failed; the fragment is computed again)."""
        name = f"{self._fragment_dir(work)}/done.json"
        data = self.files.read(name)
        if data is None:
            return None
        record = json.loads(data)
        if record["file"] is None:
            return record
        found = self.files.stored_checksum(f"data/{record['file']}")
        if found is not None and found == record.get("checksum"):
            return record
        self.files.delete(name)
        if found is None or "checksum" not in record:
            return None
        self.files.delete(f"data/{record['file']}")
        raise PartDamaged(f"the finished file {self.files.path('data/' + record['file'])} of fragment "
                          f"{work.fragment_id} failed its checksum (the store says {found}, saved as {record['checksum']}); "
                          "the fragment is computed again")

    def discard_batches(self, work: FragmentWork) -> None:
        for _end, name in self.chunks(work).values():
            self.files.delete(name)

    def rows_saved(self) -> int:
        """The rows this Function version's checkpoints hold now (every fragment and shard): what a
        resumed refresh will not compute again."""
        rows = 0
        for name in self.files.names(self.dir):
            leaf = name.rsplit("/", 1)[-1]
            if (span := chunk_span(leaf)) is not None:
                rows += span[1] - span[0]
            elif leaf == "done.json":
                record = json.loads(self.files.read(f"{self.dir}/{name}") or b"{}")
                rows += int(record.get("rows", 0))
        return rows

    def clear(self) -> None:
        """Drop all progress for this column (every Function version): called after a commit."""
        self.files.delete_folder(self.root)


def chunk_span(name: str) -> tuple[int, int] | None:
    """The physical rows [start, end) a chunk's name says it holds; None for any other name (a
    finished record, or a chunk of an older release, saved without a checksum).

    >>> chunk_span("0000000100-0000000150-bc51e9e65d79e1c90ba544ab2eae1044.arrow"), chunk_span("done.json")
    ((100, 150), None)
    """
    parts = name.removesuffix(".arrow").split("-")
    if not name.endswith(".arrow") or len(parts) != 3:
        return None
    return int(parts[0]), int(parts[1])
