"""Lists kept current between watcher ticks by watches, as Kubernetes controllers' informers keep theirs.

A tick that lists 10,000 GPU run pods, their Jobs and 1,000 nodes spends most of its CPU receiving
and decoding tens of megabytes of JSON that did not change since the tick before, and its first
list of them can take longer than a sensor evaluation may. So the sensor keeps an `Informers`:
for each of the tick's lists a thread lists once (from the API server's watch cache,
`resourceVersion=0`, as client-go's reflectors do) and then watches from that list's version,
applying each added, changed or deleted object to the list it keeps. A tick reads the kept list
without an API call; it waits for a list's first read only as long as its own deadline allows.

What a kept list promises, and when a tick gets none:

- it holds every object the watch delivered, each without its `managedFields` (never read; most of
  a pod's bytes), in the API's list order (namespace, name);
- a watch is reopened from the last version seen when the API server ends it (`WATCH_SECONDS`),
  and the kept list is trusted only while its watch answered within `FRESH_SECONDS`: a watch the
  server expired (410 Gone), that failed, or that went quiet past its read timeout ends, and the
  next tick starts a new one (which lists again);
- a change reaches the kept list within the watch's latency, so a tick may judge a pod as it was
  milliseconds before -- the next tick sees it, as every informer-fed controller does;
- a list nobody has read for `IDLE_SECONDS` (its sensor stopped) stops its watch.

Each list is one daemon thread with its own connection; the object that keeps them lives as long
as the sensor's definition that made it, so reloaded code starts afresh.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import urllib3
from kubernetes.watch.watch import iter_resp_lines

from .client import View, call, list_items

# (connect, read) seconds of a kept list's first read: 10,000 pods from a busy API server take tens
# of seconds, which no tick waits for (it waits what its deadline allows; the thread reads on).
LIST_TIMEOUT = (5.0, 120.0)
# The API server ends each watch after this long, and the thread reopens it from the last version.
WATCH_SECONDS = 60
# A kept list is trusted only while its watch answered (an event, or a reopening) within this.
FRESH_SECONDS = WATCH_SECONDS + 30.0
# A list nobody read for this long stops its watch (its sensor stopped ticking).
IDLE_SECONDS = 600.0


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    metadata = obj.get("metadata") or {}
    return metadata.get("namespace") or "", metadata.get("name") or ""


def _kept(obj: dict[str, Any]) -> View:
    """An object as a kept list holds it: without its managedFields, read as a `View` (which keeps
    the fields read, so a steady object costs its reading once)."""
    (obj.get("metadata") or {}).pop("managedFields", None)
    return View(obj)


class Informer:
    """One list (`fn(*args, **selectors)`) read once and kept current by a watch of the same call.

    `wait(seconds)` is the kept list once it was read (the same `View`s from one read to the next
    until the watch brings a change); it raises what ended the thread, or a read timeout when the
    first read has not finished in `seconds`.
    """

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], selectors: dict[str, Any],
                 clock: Callable[[], float] = time.monotonic):
        self._fn, self._args, self._selectors = fn, args, selectors
        self._clock = clock
        self._objects: dict[tuple[str, str], View] = {}
        self._ordered: list[View] | None = None  # the kept list in the API's order, until it changes
        self._version = ""
        self._lock = threading.Lock()
        self._listed = threading.Event()  # set once the first read finished (or the thread ended)
        self._heard = self._read = clock()
        self._alive = True
        self.error: BaseException | None = None  # what ended the thread, if anything did
        self.ended: str | None = None  # why the thread ended, once it has
        self._thread = threading.Thread(target=self._run, name=f"gpufn-informer-{getattr(fn, '__name__', 'list')}",
                                        daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        """Whether its list can still be trusted: the thread runs, reading its list for the first time
        or watching with an answer lately."""
        return self._alive and (not self._listed.is_set() or self._clock() - self._heard <= FRESH_SECONDS)

    def wait(self, seconds: float) -> list[View]:
        """The kept list, waiting at most `seconds` for its first read."""
        self._read = self._clock()
        if not self._listed.wait(max(seconds, 0.0)):
            raise urllib3.exceptions.ReadTimeoutError(
                None, getattr(self._fn, "__name__", "list"),
                "its first list (kept current by a watch from then on) is still being read; a later tick reads it")
        if self.error is not None:
            raise self.error
        if not self.alive:
            raise urllib3.exceptions.ProtocolError(f"its watch ended: {self.ended or 'nothing heard lately'}")
        with self._lock:
            if self._ordered is None:
                self._ordered = [obj for _, obj in sorted(self._objects.items())]
            return self._ordered

    def stop(self) -> None:
        """Let the thread end at its next answer (it ends by itself after `IDLE_SECONDS` unread)."""
        self._alive = False

    def _run(self) -> None:
        try:
            items, self._version = list_items(self._fn, *self._args, request_timeout=LIST_TIMEOUT,
                                              resource_version="0", **self._selectors)
            with self._lock:
                self._objects = {_key(obj): _kept(obj) for obj in items}
            self._heard = self._clock()
            self._listed.set()
            self._watch()
        except Exception as err:  # noqa: BLE001 -- any failure ends the thread; the next tick starts another
            self.error, self.ended = err, f"{type(err).__name__}: {err}"
        finally:
            self._alive = False
            self._listed.set()

    def _watch(self) -> None:
        while self._alive:
            if self._clock() - self._read > IDLE_SECONDS:
                self.ended = "not read"
                return
            answer = call(self._fn, *self._args, watch=True, resource_version=self._version,
                          allow_watch_bookmarks=True, timeout_seconds=WATCH_SECONDS, _preload_content=False,
                          request_timeout=(LIST_TIMEOUT[0], FRESH_SECONDS), **self._selectors)
            self._heard = self._clock()  # reopened: what it kept is as current as that
            try:
                for line in iter_resp_lines(answer):
                    if not self._apply(json.loads(line)) or not self._alive:
                        return
            finally:
                answer.release_conn()

    def _apply(self, event: dict[str, Any]) -> bool:
        """Apply one watch event to the kept list; False when the watch must end (an ERROR: 410 Gone)."""
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            self.ended = f"{obj.get('code')} {obj.get('reason')}: {obj.get('message')}"
            return False
        with self._lock:
            if kind in ("ADDED", "MODIFIED"):
                self._objects[_key(obj)] = _kept(obj)
            elif kind == "DELETED":
                self._objects.pop(_key(obj), None)
            if kind != "BOOKMARK":
                self._ordered = None
            self._version = (obj.get("metadata") or {}).get("resourceVersion") or self._version
        self._heard = self._clock()
        return True


class Informers:
    """The watcher's kept lists, one per list call (function, arguments, selectors); the sensor
    keeps one between its ticks.

    Example:
        >>> Informers().stop()
    """

    def __init__(self) -> None:
        self._kept: dict[tuple[Any, ...], Informer] = {}

    def of(self, fn: Callable[..., Any], args: tuple[Any, ...], selectors: dict[str, Any]) -> Informer:
        """The informer of call `fn(*args, **selectors)`: the one kept, or a new one (which starts
        reading) when there is none or it ended."""
        key = (fn.__name__, args, tuple(sorted(selectors.items())))
        informer = self._kept.get(key)
        if informer is None or not informer.alive:
            if informer is not None:
                informer.stop()
            informer = self._kept[key] = Informer(fn, args, dict(selectors))
        return informer

    def stop(self) -> None:
        """End every thread (each ends by itself once unread for `IDLE_SECONDS`)."""
        for informer in self._kept.values():
            informer.stop()
        self._kept.clear()
