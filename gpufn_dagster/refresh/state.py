"""What a refresh learned about fragments that their file names cannot say, kept beside the table.

- `verified`: fragments whose every row was found current although their output files are not
  the engine's own (compaction rewrote them into one file with the other columns). Such a
  fragment is not rewritten -- rewriting it would drop its rows from the vector index -- and
  with its key recorded here it is not even read again until its files change.
- `failed_files`: output files the engine wrote that hold rows which failed (signature `FAILED`).
  The fragment must be visited again so those rows are retried, although its file is current.

Keys name files and Function versions, and Lance never edits a file in place, so an entry can
only go out of date by naming files no fragment uses any more; those are dropped on each save.
Written whole (`TableFiles.write`), so a reader sees the old or the new state, never half of one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from .files import TableFiles


@dataclass
class ColumnState:
    verified: set[str] = field(default_factory=set)
    failed_files: set[str] = field(default_factory=set)


def _name(sig_column: str) -> str:
    return f"_gpufn/state/{sig_column}.json"


def load_state(files: TableFiles, sig_column: str) -> ColumnState:
    data = files.read(_name(sig_column))
    try:
        parsed = json.loads(data) if data is not None else {}
    except json.JSONDecodeError:
        parsed = {}
    return ColumnState(set(parsed.get("verified", [])), set(parsed.get("failed_files", [])))


def save_state(files: TableFiles, sig_column: str, state: ColumnState) -> None:
    files.write(_name(sig_column), json.dumps(
        {"verified": sorted(state.verified), "failed_files": sorted(state.failed_files)}).encode())
