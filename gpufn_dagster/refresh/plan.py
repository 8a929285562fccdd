"""Which fragments of a table a refresh must visit, decided from fragment metadata alone.

A fragment is clean -- skipped without reading a row -- when its output columns live in a file
this engine wrote (`gpufn-<function version>-<input files hash>-<uuid>.lance`) for the current
Function version and the data files holding the inputs are the ones it read. Lance never edits a
file in place: appends add fragments, in-place column updates swap data files, row updates move
rows to new fragments, so any change that could alter an input shows up here. A visited fragment
is then decided row by row against the per-row signature column (see `signature`).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import lance

from ..functions import Function

OUR_FILE = re.compile(r"^gpufn-(?P<version>[0-9a-f]{16})-(?P<inputs>[0-9a-f]{12})-[0-9a-f]{32}\.lance$")


@dataclass(frozen=True)
class FragmentWork:
    """One fragment to visit, with what identifies its state (for checkpoints and the file name)."""

    fragment_id: int
    physical_rows: int
    live_rows: int
    inputs_hash: str
    state_key: str
    reason: str  # "new": outputs never written here; "stale": written for other inputs or version


def field_ids(dataset: lance.LanceDataset, names: list[str] | tuple[str, ...]) -> list[int]:
    schema = dataset.lance_schema
    return [schema.field(name).id() for name in names]


def _files_holding(fragment: lance.fragment.FragmentMetadata, ids: set[int]) -> list[str]:
    return sorted(f.path for f in fragment.files if ids.intersection(f.fields))


def plan_fragments(dataset: lance.LanceDataset, function: Function) -> list[FragmentWork]:
    """The fragments whose output may be missing or stale; clean fragments are left out."""
    input_ids = set(field_ids(dataset, function.inputs))
    output_ids = set(field_ids(dataset, [*function.columns, function.sig_column]))
    work = []
    for fragment in dataset.get_fragments():
        meta = fragment.metadata
        inputs_hash = hashlib.sha256("\n".join(_files_holding(meta, input_ids)).encode()).hexdigest()[:12]
        output_files = _files_holding(meta, output_ids)
        ours = OUR_FILE.match(output_files[0]) if len(output_files) == 1 else None
        if ours and ours["version"] == function.version and ours["inputs"] == inputs_hash:
            continue
        deletion = meta.deletion_file.path(meta.id) if meta.deletion_file else ""
        state = "\n".join([inputs_hash, *output_files, deletion, str(meta.physical_rows), str(function.batch_size)])
        work.append(
            FragmentWork(
                fragment_id=meta.id,
                physical_rows=meta.physical_rows,
                live_rows=fragment.count_rows(),
                inputs_hash=inputs_hash,
                state_key=hashlib.sha256(state.encode()).hexdigest()[:16],
                reason="stale" if output_files else "new",
            )
        )
    return work
