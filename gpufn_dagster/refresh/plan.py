"""Which fragments of a table a refresh must visit, decided from fragment metadata alone.

A fragment is clean -- skipped without reading a row -- when its output columns live in a file
this engine wrote (`gpufn-<function version>-<input files hash>-<uuid>.lance`) for the current
Function version and the data files holding the inputs are the ones it read. Lance never edits a
file in place: appends add fragments, in-place column updates swap data files, row updates move
rows to new fragments, so any change that could alter an input shows up here. A visited fragment
is then decided row by row against the per-row signature column (see `signature`).

A slice refresh (`where`, `slices`) visits only fragments holding rows of the slice; in a fragment
that also holds other rows, only the slice's rows are checked (`FragmentWork.rows`), and its
findings are keyed by the fragment's content and the slice.

Two facts a file name cannot carry come from the column's `state`: a fragment found all current
after compaction is skipped by its content key, and an engine file holding failed rows is
visited again so they are retried.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

import lance
import numpy as np

from ..function_spec.functions import Function
from ..private_ledger import data_file_path
from .slices import slice_key, slice_rows
from .state import ColumnState
from .write import preorder

OUR_FILE = re.compile(r"^gpufn-(?P<version>[0-9a-f]{16})-(?P<inputs>[0-9a-f]{12})-[0-9a-f]{32}\.lance$")


@dataclass(frozen=True)
class FragmentWork:
    """One fragment to visit, with what identifies its state (for checkpoints and the file name)."""

    fragment_id: int
    physical_rows: int
    live_rows: int
    inputs_hash: str
    content_key: str  # the fragment's files and the Function version: what `verified` remembers, and
    # where its checkpoints live
    reason: str  # "new": outputs never written here; "stale": written for other inputs or version, or failed rows
    # A slice's rows when the fragment holds others too (sorted physical offsets); None: every row.
    rows: np.ndarray | None = field(default=None, compare=False, repr=False)


def field_ids(dataset: lance.LanceDataset, names: list[str] | tuple[str, ...]) -> list[int]:
    """The Lance field ids of the named columns and of every field nested in them (a list's item, a
    struct's members), in pre-order: a data file holds a column when it lists any of them (files of
    format 2.1+ list only the leaves)."""
    schema = dataset.lance_schema
    return [nested.id() for name in names for nested in preorder(schema.field(name))]



def _files_holding(fragment: lance.fragment.FragmentMetadata, ids: set[int]) -> list[str]:
    return sorted(data_file_path(f) for f in fragment.files if ids.intersection(f.fields))


def _key(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _fragment_files(meta: lance.fragment.FragmentMetadata, function: Function, input_ids: set[int],
                    output_ids: set[int]) -> tuple[str, list[str], str]:
    """(inputs hash, output files, content key) of one fragment."""
    inputs_hash = hashlib.sha256("\n".join(_files_holding(meta, input_ids)).encode()).hexdigest()[:12]
    output_files = _files_holding(meta, output_ids)
    deletion = meta.deletion_file.path(meta.id) if meta.deletion_file else ""
    return inputs_hash, output_files, _key(function.version, inputs_hash, *output_files, deletion,
                                           str(meta.physical_rows))


def _ids(dataset: lance.LanceDataset, function: Function) -> tuple[set[int], set[int]]:
    return set(field_ids(dataset, function.inputs)), set(field_ids(dataset, [*function.columns, function.sig_column]))


def content_keys(dataset: lance.LanceDataset, function: Function) -> set[str]:
    """The content key of every fragment now (to forget state about fragments that are gone)."""
    input_ids, output_ids = _ids(dataset, function)
    return {_fragment_files(f.metadata, function, input_ids, output_ids)[2] for f in dataset.get_fragments()}


def plan_fragments(dataset: lance.LanceDataset, function: Function,
                   state: ColumnState | None = None, where: str | None = None) -> list[FragmentWork]:
    """The fragments whose output may be missing or stale; clean fragments are left out.

    `where`: only fragments holding rows the filter selects, and of those only these rows.
    """
    state = state or ColumnState()
    input_ids, output_ids = _ids(dataset, function)
    selected = slice_rows(dataset, where) if where is not None else None
    work = []
    for fragment in dataset.get_fragments():
        meta = fragment.metadata
        if selected is not None and meta.id not in selected:
            continue
        inputs_hash, output_files, content_key = _fragment_files(meta, function, input_ids, output_ids)
        ours = OUR_FILE.match(output_files[0]) if len(output_files) == 1 else None
        if (ours and ours["version"] == function.version and ours["inputs"] == inputs_hash
                and output_files[0] not in state.failed_files):
            continue
        live = fragment.count_rows()
        rows = selected[meta.id] if selected is not None and len(selected[meta.id]) < live else None
        if rows is not None:  # part of the fragment: what was found is about the slice's rows only
            content_key = f"{content_key}_{slice_key(where or '')}"
        if content_key in state.verified:
            continue
        work.append(
            FragmentWork(
                fragment_id=meta.id,
                physical_rows=meta.physical_rows,
                live_rows=live if rows is None else len(rows),
                inputs_hash=inputs_hash,
                content_key=content_key,
                reason="stale" if output_files else "new",
                rows=rows,
            )
        )
    return work
