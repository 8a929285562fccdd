"""What a refresh learned about fragments that their file names cannot say, kept beside the table.

- `verified`: fragments whose every row was found current although their output files are not
  the engine's own (compaction rewrote them into one file with the other columns). Such a
  fragment is not rewritten -- rewriting it would drop its rows from the vector index -- and
  with its key recorded here it is not even read again until its files change.
- `verified` also holds slices' findings: `<content key>_<slice key>` says every row of that slice
  in that fragment was found current (a slice refresh reads only its own rows of a fragment).
- `failed_files`: output files the engine wrote that hold rows which failed (signature `FAILED`).
  The fragment must be visited again so those rows are retried, although its file is current.

Keys name files and Function versions, and Lance never edits a file in place, so an entry can
only go out of date by naming files no fragment uses any more; those are dropped on each save.
Written whole (`TableFiles.write`), so a reader sees the old or the new state, never half of one;
`settle_state` merges what this refresh learned into the latest saved state, so slices of one
column that commit one after another (under their commit lock) never drop each other's findings.
"""

from __future__ import annotations

import json
from collections.abc import Callable
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


def settle_state(files: TableFiles, sig_column: str, learned: ColumnState, current_keys: set[str] | None = None,
                 in_use: Callable[[], set[str]] | None = None) -> None:
    """Merge what a refresh learned into the latest saved state and drop entries about fragments or
    files that are gone (a slice's entry lives as long as its fragment's content key); None keeps
    them all (before a commit, when what is current is about to change). `in_use` lists the
    table's data files, asked only when some file holds failed rows: listing them costs a call per
    file of every Function on the table, so a refresh without failures pays nothing for its siblings.

    >>> import tempfile; from gpufn_dagster.refresh.files import TableFiles
    >>> files = TableFiles(tempfile.mkdtemp() + "/t.lance")
    >>> save_state(files, "s", ColumnState({"a_1"}, set()))
    >>> settle_state(files, "s", ColumnState({"b", "c_2"}, {"f"}), current_keys={"a", "b"}, in_use=lambda: {"f"})
    >>> state = load_state(files, "s")
    >>> sorted(state.verified), state.failed_files
    (['a_1', 'b'], {'f'})
    """
    latest = load_state(files, sig_column)
    verified = {k for k in latest.verified | learned.verified if current_keys is None or k.split("_")[0] in current_keys}
    failed = latest.failed_files | learned.failed_files
    save_state(files, sig_column, ColumnState(verified, failed & in_use() if failed and in_use is not None else failed))
