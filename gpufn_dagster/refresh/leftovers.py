"""Data files a killed or failed refresh wrote but never committed, removed by the next refresh.

Each data file is noted (an empty marker under `<table>.lance/_gpufn/written/<signature column>/`)
before it is written. After a refresh of the column commits, its own markers are dropped; the
markers left by earlier refreshes name files that were never committed, or were committed by a
refresh killed right after its commit -- so a leftover file is deleted only when no version of
the table references it (time travel to an old version keeps working). The column's lease makes
sure no other refresh of the column is writing meanwhile.
"""

from __future__ import annotations

import lance

from .files import TableFiles


class WrittenFiles:
    """The data files refreshes of one column wrote, until a commit settles them."""

    def __init__(self, files: TableFiles, scope: str):
        """`scope`: the column's signature column, or a slice's (`slices.scope`): a slice settles
        only files its own earlier runs left, never those of a slice refreshing beside it."""
        self.files = files
        self.dir = f"_gpufn/written/{scope}"
        self.created: set[str] = set()

    def note(self, name: str) -> None:
        """Record a data file before it is written."""
        self.files.write(f"{self.dir}/{name}", b"")
        self.created.add(name)

    def settle(self, dataset: lance.LanceDataset) -> int:
        """After this refresh committed (or found nothing to commit): forget its own files and delete
        earlier refreshes' files that no version references; returns how many were deleted."""
        for name in self.created:
            self.files.delete(f"{self.dir}/{name}")
        leftovers = set(self.files.names(self.dir)) - self.created
        if not leftovers:
            return 0
        referenced: set[str] = set()
        for version in dataset.versions():
            old = self.files.dataset(version["version"])
            referenced |= {f.path for fragment in old.get_fragments() for f in fragment.metadata.files}
        deleted = 0
        for name in leftovers:
            if name not in referenced:
                self.files.delete(f"data/{name}")
                deleted += 1
            self.files.delete(f"{self.dir}/{name}")
        return deleted
