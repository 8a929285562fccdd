"""Committing a refresh: one DataReplacement of the rewritten fragments at the version the plan
read, the column's state saved before it, and (`publish_every_rows`) whole fragments committed as
the refresh goes."""

from __future__ import annotations

import lance
from lance.commit import CommitConflictError

from ..errors import CommitRefused
from ..function_spec.functions import Function
from ..tags import refresh_commit_message
from .files import TableFiles
from .fragments import FragmentResult
from .lease import ColumnLease
from .state import ColumnState, settle_state


def state_after(state: ColumnState, results: list[FragmentResult]) -> ColumnState:
    """The column state with this attempt's findings added (not yet pruned)."""
    return ColumnState(
        verified=state.verified | {r.work.content_key for r in results
                                   if r.group is None and not r.outcome.errors and not r.incomplete},
        failed_files=state.failed_files | {r.file for r in results if r.file and r.outcome.errors})


class Publisher:
    """`publish_every_rows`: commits finished fragments as the refresh goes, so a days-long backfill
    shows results before it ends. Each commit is a DataReplacement at the version the plan read,
    like the final one; it holds only whole fragments of one Function version, so a reader of any
    version sees each fragment's values all from one version. A commit that loses a race leaves its
    fragments to the final commit."""

    def __init__(self, files: TableFiles, dataset: lance.LanceDataset, function: Function, state: ColumnState,
                 lease: ColumnLease):
        self.files, self.dataset, self.function, self.state, self.lease = files, dataset, function, state, lease
        self.every = function.options.publish_every_rows
        self.pending: list[FragmentResult] = []
        self.published: set[int] = set()  # fragment ids committed already
        self.latest: lance.LanceDataset | None = None
        self.commits = 0

    def add(self, result: FragmentResult) -> None:
        if self.every is None or result.group is None:
            return
        self.pending.append(result)
        if sum(r.work.live_rows for r in self.pending) >= self.every:
            self.state = state_after(self.state, self.pending)
            # merged into the saved state, not written over it: a slice refreshing beside this one
            # (another partition) keeps what it saved
            settle_state(self.files, self.function.sig_column, self.state)
            self.lease.check()
            committed = commit_groups(self.files, self.dataset, self.function, [r.group for r in self.pending])
            if committed is not None:
                self.published |= {r.work.fragment_id for r in self.pending}
                self.latest, self.commits = committed, self.commits + 1
            self.pending = []


def commit_groups(files: TableFiles, dataset: lance.LanceDataset, function: Function,
                  groups: list[lance.LanceOperation.DataReplacementGroup]) -> lance.LanceDataset | None:
    """One DataReplacement of every rewritten fragment at the version read; None when a concurrent
    writer of the same fragments won the race (the caller re-plans)."""
    try:
        return files.commit(lance.LanceOperation.DataReplacement(groups), dataset.version,
                            refresh_commit_message(function.name, function.version))
    except CommitConflictError:
        return None
    except OSError as err:  # not a race: retrying cannot help, so say what Lance refused
        raise CommitRefused(
            f"Lance refused the commit of Function {function.name!r} to table {function.table!r} "
            f"(version {dataset.version}): {err}. Nothing was committed.") from err
