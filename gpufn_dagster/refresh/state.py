"""What a refresh learned about fragments that their file names cannot say, kept beside the table.

- `verified`: fragments whose every row was found current although their output files are not
  the engine's own (compaction rewrote them into one file with the other columns). Such a
  fragment is not rewritten -- rewriting it would drop its rows from the vector index -- and
  with its key recorded here it is not even read again until its files change.
- `failed_files`: output files the engine wrote that hold rows which failed (signature `FAILED`).
  The fragment must be visited again so those rows are retried, although its file is current.

Keys name files and Function versions, and Lance never edits a file in place, so an entry can
only go out of date by naming files no fragment uses any more; those are dropped on each save.
Written with a rename, so a reader sees the old or the new state, never half of one.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class ColumnState:
    verified: set[str] = field(default_factory=set)
    failed_files: set[str] = field(default_factory=set)


def _path(table_uri: str, sig_column: str) -> Path:
    return Path(table_uri) / "_gpufn" / "state" / f"{sig_column}.json"


def load_state(table_uri: str, sig_column: str) -> ColumnState:
    try:
        data = json.loads(_path(table_uri, sig_column).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return ColumnState()
    return ColumnState(set(data.get("verified", [])), set(data.get("failed_files", [])))


def save_state(table_uri: str, sig_column: str, state: ColumnState) -> None:
    path = _path(table_uri, sig_column)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"verified": sorted(state.verified), "failed_files": sorted(state.failed_files)}))
    os.replace(tmp, path)
