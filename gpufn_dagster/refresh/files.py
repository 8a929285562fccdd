"""A table's storage: its Lance dataset and the files the engine keeps beside it, on a local
directory or an object store (`s3://bucket/db/t.lance`, also `gs://`, `az://`).

The engine's own files -- checkpoints, column state, leases, markers of written data files --
live under `<table>/_gpufn/`, on the same storage as the table, so a worker that dies on one
node is resumed by a worker on another. They go through obstore, which wraps the Rust
`object_store` crate Lance itself uses: the same `storage_options` (and the same `AWS_*`
environment variables) configure both, and every operation here means the same on both kinds of
storage:

- `write` replaces an object whole; a reader sees the old one or the new one, never half
  (object stores by nature; locally a temporary file renamed into place).
- `create` writes an object only if none has that name, and says whether it did: the one atomic
  step leases are built on (`If-None-Match: *` on S3, a hard link locally). A store that ignores
  conditional writes cannot make it atomic (nor Lance's commits): the README says what to do there.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lance
import obstore
from obstore.exceptions import AlreadyExistsError, NotFoundError
from obstore.store import LocalStore, from_url

# object_store's HTTP client settings; every other storage option configures the store itself.
_CLIENT_OPTIONS = {"allow_http", "allow_invalid_certificates", "connect_timeout", "timeout", "proxy_url",
                   "pool_idle_timeout", "pool_max_idle_per_host", "user_agent"}
# Options only Lance reads (its commit and retry settings); the store itself would refuse them.
_LANCE_ONLY = {"client_max_retries", "client_retry_timeout", "download_retry_count", "new_table_enable_stable_row_ids",
               "new_table_data_storage_version", "new_table_enable_v2_manifest_paths"}


def checksum(data: bytes) -> str:
    """The checksum a checkpointed part is saved and verified with: SHA-256, 128 bits of it in hex.

    >>> checksum(b"rows")
    'bc51e9e65d79e1c90ba544ab2eae1044'
    """
    return hashlib.sha256(data).hexdigest()[:32]


def is_remote(uri: str) -> bool:
    """Whether the URI names an object store rather than a local path.

    >>> is_remote("s3://bucket/db"), is_remote("/data/db"), is_remote("file:///data/db")
    (True, False, False)
    """
    return "://" in uri and not uri.startswith("file://")


def _store(uri: str, storage_options: Mapping[str, str]) -> Any:
    if not is_remote(uri):
        path = Path(uri.removeprefix("file://")).resolve()
        return LocalStore(path, mkdir=True)
    config = {k: v for k, v in storage_options.items() if k not in _CLIENT_OPTIONS and k not in _LANCE_ONLY}
    client = {k: v for k, v in storage_options.items() if k in _CLIENT_OPTIONS}
    return from_url(uri, config=config or None, client_options=client or None)


class TableFiles:
    """One Lance table and the engine's files beside it.

    Args:
        uri: the table (`<db>/<name>.lance`), a local path or an object-store URI.
        storage_options: how to reach an object store (`aws_endpoint`, `aws_region`, credentials,
            `allow_http`), as Lance takes them; empty reads the `AWS_*` environment variables.

    Example:
        >>> import tempfile
        >>> files = TableFiles(tempfile.mkdtemp() + "/t.lance")
        >>> files.create("_gpufn/a", b"1"), files.create("_gpufn/a", b"2"), files.read("_gpufn/a")
        (True, False, b'1')
        >>> files.write("_gpufn/b/c", b"x"); files.names("_gpufn/b")
        ['c']
    """

    def __init__(self, uri: str, storage_options: Mapping[str, str] | None = None):
        self.uri = uri.rstrip("/")
        self.storage_options = dict(storage_options or {})
        self._store = _store(self.uri, self.storage_options)

    def dataset(self, version: int | None = None) -> lance.LanceDataset:
        """The table as Lance reads it now (or at `version`)."""
        return lance.dataset(self.uri, version=version, storage_options=self.storage_options or None)

    def commit(self, operation: Any, read_version: int, message: str) -> lance.LanceDataset:
        """Commit a Lance operation to the table (Lance's own conflict checks apply)."""
        return lance.LanceDataset.commit(self.uri, operation, read_version=read_version, commit_message=message,
                                         storage_options=self.storage_options or None)

    def path(self, name: str) -> str:
        """The full URI of a file of the table, for Lance's file writer."""
        return f"{self.uri}/{name}"

    def read(self, name: str) -> bytes | None:
        """The object's bytes, or None when there is none."""
        try:
            return bytes(obstore.get(self._store, name).bytes())
        except (NotFoundError, FileNotFoundError):
            return None

    def stored_checksum(self, name: str) -> str | None:
        """What the store says of the object's content, from one HEAD: its size and entity tag (on
        S3 the MD5 of what it stored, checked by the store itself; locally one that changes with any
        rewrite of the file). Cheap where `checksum` of the bytes would mean reading a fragment's
        whole file back after writing it; None when there is none."""
        try:
            meta = obstore.head(self._store, name)
        except (NotFoundError, FileNotFoundError):
            return None
        return f"{meta['size']}:{meta['e_tag']}"

    def write(self, name: str, data: bytes) -> None:
        """Replace the object whole."""
        obstore.put(self._store, name, data)

    def create(self, name: str, data: bytes) -> bool:
        """Write the object only if none has that name; False when one already had it."""
        try:
            obstore.put(self._store, name, data, mode="create")
            return True
        except (AlreadyExistsError, FileExistsError):
            return False

    def exists(self, name: str) -> bool:
        try:
            obstore.head(self._store, name)
            return True
        except (NotFoundError, FileNotFoundError):
            return False

    def names(self, prefix: str) -> list[str]:
        """The objects under a folder, as names relative to it (recursively)."""
        prefix = prefix.rstrip("/") + "/" if prefix else ""
        found = []
        for chunk in obstore.list(self._store, prefix or None):
            found.extend(str(meta["path"])[len(prefix):] for meta in chunk)
        return sorted(found)

    def delete(self, name: str) -> None:
        """Remove the object if there is one."""
        try:
            obstore.delete(self._store, name)
        except (NotFoundError, FileNotFoundError):
            pass

    def delete_folder(self, prefix: str) -> None:
        """Remove every object under the folder."""
        names = [f"{prefix.rstrip('/')}/{n}" for n in self.names(prefix)]
        for start in range(0, len(names), 1000):
            obstore.delete(self._store, names[start:start + 1000])
