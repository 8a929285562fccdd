"""One refresh of a column at a time: a lease file beside the table, renewed while the refresh runs.

Two runs refreshing the same Function at once would both compute every stale row (twice the GPU
bill) and one would then lose the commit. The second run instead waits for the lease, then plans
against what the first committed and computes only what is still stale (usually nothing). The
holder renews the lease every `ttl / 3` seconds; a holder that was killed stops renewing, so its
lease expires after `ttl` seconds and the next refresh takes it over -- at once when the holder was
a process on the same host that no longer exists.

Creating the lease is atomic (a hard link that fails if the name exists), and so is taking over an
expired one (a rename that only one taker can win), so two waiters never both hold it.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import LeaseLost

DEFAULT_TTL = 60.0


class ColumnLease:
    """The right to refresh one Function column; use as a context manager."""

    def __init__(self, table_uri: str, sig_column: str, holder: str, *, ttl: float = DEFAULT_TTL,
                 on_wait: Callable[[str], None] | None = None, poll: float = 0.5, report_every: float = 10.0):
        self.path = Path(table_uri) / "_gpufn" / "leases" / f"{sig_column}.json"
        self.holder, self.ttl, self.on_wait, self.poll, self.report_every = holder, ttl, on_wait, poll, report_every
        self.token = uuid.uuid4().hex
        self.waited = 0.0
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self.lost = False

    def _record(self) -> dict[str, Any]:
        now = time.time()
        return {"holder": self.holder, "token": self.token, "host": socket.gethostname(), "pid": os.getpid(),
                "renewed_at": now, "expires_at": now + self.ttl}

    def _write_new(self) -> bool:
        """Create the lease file with its content in one step; False when it already exists."""
        tmp = self.path.with_name(f".{self.token}.tmp")
        tmp.write_text(json.dumps(self._record()))
        try:
            os.link(tmp, self.path)
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)

    def _read(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    @staticmethod
    def _dead(current: dict[str, Any]) -> bool:
        """The holder is a process of this host that no longer runs."""
        if current.get("host") != socket.gethostname():
            return False
        try:
            os.kill(int(current["pid"]), 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    def _take_expired(self) -> None:
        graveyard = self.path.with_name(f".expired-{self.token}")
        try:
            os.rename(self.path, graveyard)  # only one taker wins; the others find the name gone
        except FileNotFoundError:
            return
        graveyard.unlink(missing_ok=True)

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        last_report = -self.report_every
        while not self._write_new():
            current = self._read()
            if current is None:
                continue
            dead = self._dead(current)
            if dead or current["expires_at"] < time.time():
                if self.on_wait:
                    why = ("its process is gone" if dead else
                           f"it expired {time.time() - current['expires_at']:.0f}s ago without being renewed")
                    self.on_wait(f"the refresh lease of {current['holder']} (pid {current['pid']} on "
                                 f"{current['host']}) is void: {why}; taking it over")
                self._take_expired()
                continue
            waited = time.monotonic() - started
            if self.on_wait and waited - last_report >= self.report_every:
                self.on_wait(f"waiting for the refresh of this column by {current['holder']} to finish (lease held "
                             f"since {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(current['renewed_at']))} at the "
                             f"latest renewal, expires in {current['expires_at'] - time.time():.0f}s unless renewed); "
                             "rows it computes will not be computed again")
                last_report = waited
            time.sleep(self.poll)
        self.waited = time.monotonic() - started
        self._renewer = threading.Thread(target=self._renew, name="gpufn-lease", daemon=True)
        self._renewer.start()

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            current = self._read()
            if current is None or current.get("token") != self.token:
                self.lost = True
                return
            tmp = self.path.with_name(f".{self.token}.tmp")
            tmp.write_text(json.dumps(self._record()))
            os.replace(tmp, self.path)

    def check(self) -> None:
        """Raise if the lease was lost (checked before committing)."""
        if self.lost:
            raise LeaseLost(f"the refresh lease {self.path} expired while held by {self.holder}; another refresh "
                            "took over, so this one stops without committing")

    def release(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        current = self._read()
        if current is not None and current.get("token") == self.token:
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> ColumnLease:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
