"""One refresh of a column at a time: a lease beside the table, renewed while the refresh runs.

Two runs refreshing the same Function at once would both compute every stale row (twice the GPU
bill) and one would then lose the commit. The second run instead waits for the lease, then plans
against what the first committed and computes only what is still stale (usually nothing). The
holder renews the lease every `ttl / 3` seconds; a holder that was killed stops renewing, so its
lease expires after `ttl` seconds and the next refresh takes it over -- at once when the holder was
a process on the same host that no longer exists.

The lease lives on the table's own storage, so workers on different nodes share it. It is a
sequence of generations, `_gpufn/leases/<signature column>/<generation>.json`, built on the one
atomic step every store offers (`TableFiles.create`: write only if the name is free): the holder
is whoever created the highest generation. Taking over a void lease means creating the next
generation, which only one taker can win; the winner removes the older ones. A holder whose
generation is gone or no longer the highest has lost the lease and must not commit.

A refresh spread over several steps (`fanout`: plan, shards, commit, in different processes or
pods) holds one lease under one token, its run id: each step adopts the generation its plan
created, renews it while it runs, and leaves it (`keep`) for the next; the commit releases it.
No process holds such a lease between steps, so whoever waits for it may say when its token has
ended (`ended`: the run and its re-executions are over), and takes it over then instead of
waiting out its ttl.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from ..errors import LeaseLost
from .files import TableFiles

DEFAULT_TTL = 60.0


def _stamp(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def _waiting_line(current: dict[str, Any], ends_with_run: bool) -> str:
    """What a refresh waiting for the lease says. A lease no process holds (a fanned-out refresh's,
    between its steps) may be a killed run's: the line says how to free it.

    >>> print(_waiting_line({"holder": "run r1", "renewed_at": 0.0, "expires_at": 1e12, "pid": None}, True)[:128])
    waiting for the refresh of this column by run r1 to finish (lease held since 1970-01-01T00:00:00Z at the latest renewal, expires
    """
    line = (f"waiting for the refresh of this column by {current['holder']} to finish (lease held since "
            f"{_stamp(current['renewed_at'])} at the latest renewal, expires in "
            f"{current['expires_at'] - time.time():.0f}s unless renewed); rows it computes will not be computed again")
    if current.get("pid") is None and ends_with_run:
        line += (f". If {current['holder']} was killed (its process gone, the run still STARTED), mark it ended -- "
                 "Terminate, then Force termination, on its page; or DagsterInstance.report_run_canceled -- and this "
                 "refresh takes the lease over at once, adopting what it checkpointed")
    return line


class ColumnLease:
    """The right to refresh one Function column; use as a context manager."""

    def __init__(self, files: TableFiles, scope: str, holder: str, *, ttl: float = DEFAULT_TTL,
                 on_wait: Callable[[str], None] | None = None, poll: float = 0.5, report_every: float = 10.0,
                 token: str | None = None, keep: bool = False, ended: Callable[[str], bool] | None = None):
        self.files = files
        self.dir = f"_gpufn/leases/{scope}"  # the column's signature column, or a slice's (`slices.scope`)
        self.holder, self.ttl, self.on_wait, self.poll, self.report_every = holder, ttl, on_wait, poll, report_every
        self.token = token or uuid.uuid4().hex
        self.keep = keep  # on release, leave the lease to the next step of the same refresh
        self.ended = ended  # whether another holder's token (its run) has ended for good
        self.generation: int | None = None
        self.waited = 0.0
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self.lost = False

    def _name(self, generation: int) -> str:
        return f"{self.dir}/{generation:012d}.json"

    def _record(self) -> bytes:
        now = time.time()
        return json.dumps({"holder": self.holder, "token": self.token, "host": socket.gethostname(),
                           # A lease kept across a refresh's steps outlives each step's process: no pid to check.
                           "pid": None if self.keep else os.getpid(), "renewed_at": now, "expires_at": now + self.ttl}).encode()

    def _generations(self) -> list[int]:
        return sorted(int(n.removesuffix(".json")) for n in self.files.names(self.dir)
                      if n.endswith(".json") and n.removesuffix(".json").isdigit())

    def _read(self, generation: int) -> dict[str, Any] | None:
        data = self.files.read(self._name(generation))
        try:
            return json.loads(data) if data else None
        except json.JSONDecodeError:
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
        except (PermissionError, ValueError, KeyError, TypeError):
            return False
        return False

    def _void(self, current: dict[str, Any]) -> str | None:
        """Why the lease no longer binds anyone, or None while its holder keeps it."""
        if self._dead(current):
            return "its process is gone"
        token = current.get("token")
        # Only a lease no process holds (a fanned-out refresh's, kept between its steps) can outlive
        # its holder unseen; asking whether its run ended costs the run storage a query per poll.
        if current.get("pid") is None and self.ended is not None and token and token != self.token \
                and self.ended(token):
            return "its run has ended"
        if current.get("expires_at", 0) < time.time():
            return f"it expired {time.time() - current.get('expires_at', 0):.0f}s ago without being renewed"
        return None

    def _take(self, generation: int) -> bool:
        if not self.files.create(self._name(generation), self._record()):
            return False
        self.generation = generation
        for older in self._generations():
            if older < generation:
                self.files.delete(self._name(older))
        return True

    def acquire(self) -> None:
        started = time.monotonic()
        last_report = -self.report_every
        while True:
            generations = self._generations()
            if not generations:
                if self._take(1):
                    break
                continue
            top = generations[-1]
            current = self._read(top)
            if current is None:  # released and removed, or not yet readable: look again
                time.sleep(self.poll / 5)
                continue
            if current.get("token") == self.token:  # an earlier step of this refresh holds it: adopt it
                self.generation = top
                self.files.write(self._name(top), self._record())
                break
            why = self._void(current)
            if why is not None:
                if self.on_wait:
                    self.on_wait(f"the refresh lease of {current.get('holder')} (pid {current.get('pid')} on "
                                 f"{current.get('host')}) is void: {why}; taking it over")
                if self._take(top + 1):
                    break
                continue
            waited = time.monotonic() - started
            if self.on_wait and waited - last_report >= self.report_every:
                self.on_wait(_waiting_line(current, self.ended is not None))
                last_report = waited
            time.sleep(self.poll)
        self.waited = time.monotonic() - started
        self._renewer = threading.Thread(target=self._renew, name="gpufn-lease", daemon=True)
        self._renewer.start()

    def try_acquire(self) -> bool:
        """Take the lease only if no one holds it (none yet, released, or void), without waiting;
        renewed while held, as after `acquire`. False: a refresh holds it now."""
        generations = self._generations()
        if generations:
            current = self._read(generations[-1])
            if current is None or self._void(current) is None:  # held (or being taken) now
                return False
        if not self._take(generations[-1] + 1 if generations else 1):
            return False
        self._renewer = threading.Thread(target=self._renew, name="gpufn-lease", daemon=True)
        self._renewer.start()
        return True

    def _still_held(self) -> bool:
        current = self._read(self.generation) if self.generation is not None else None
        return (current is not None and current.get("token") == self.token
                and max(self._generations(), default=0) == self.generation)

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            if not self._still_held():
                self.lost = True
                return
            self.files.write(self._name(self.generation), self._record())

    def check(self) -> None:
        """Raise if the lease was lost (checked before committing)."""
        if self.lost or not self._still_held():
            self.lost = True
            raise LeaseLost(f"the refresh lease {self.files.path(self.dir)} expired while held by {self.holder}; "
                            "another refresh took over, so this one stops without committing")

    def release(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        if self.generation is not None and not self.keep and self._still_held():
            self.files.delete(self._name(self.generation))

    def __enter__(self) -> ColumnLease:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
