"""A deadline on one call of a Function: past it, `RowTimeout` is raised inside the call.

The Function runs on the refresh's model thread (or a warm instance's serving thread), never the
main thread, so a signal (SIGALRM, Geneva's way) cannot reach it. One watchdog thread per process
holds the deadlines; when one passes, it raises `RowTimeout` in the calling thread with
`PyThreadState_SetAsyncExc`, which lands at the thread's next Python instruction: a loop, a Python
client waiting in slices, a model stepping through Python code all stop at once. A call blocked
inside native code for good (a socket read with no timeout) is only stopped when it returns to
Python; give such clients their own timeout.

Arming and disarming is a dictionary update under a lock (a few microseconds), so a per-row
deadline costs little even for Functions called row by row.

Example:
    >>> import time
    >>> from gpufn_dagster.errors import RowTimeout
    >>> try:
    ...     with deadline(0.2):
    ...         while True:
    ...             time.sleep(0.01)
    ... except RowTimeout:
    ...     print("stopped")
    stopped
    >>> with deadline(None):  # no deadline: nothing armed
    ...     pass
"""

from __future__ import annotations

import ctypes
import itertools
import os
import select
import threading
import time

from ..errors import RowTimeout

_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
_set_async_exc.argtypes = [ctypes.c_ulong, ctypes.py_object]
_set_async_exc.restype = ctypes.c_int


def raise_in(thread: int, exception: type[BaseException]) -> None:
    """Raise `exception` in `thread` at its next Python instruction (what a deadline does when it
    passes; a terminated run's refresh does it to the Function's call in flight)."""
    _set_async_exc(thread, ctypes.py_object(exception))


class _Watchdog:
    """The process's deadlines: token -> (monotonic deadline, thread id), served by one daemon thread.

    What an armed thread runs between arming and its block's end takes no Python-level lock (a
    Condition's or an Event's `__enter__` is Python code, where a RowTimeout landing after the
    acquire would leave it held for good): a plain C lock, and a pipe byte to wake the thread. Firing pops the
    deadline and raises in its thread under that lock, so a disarm either removes the deadline
    before it fires or learns that it fired.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed: dict[int, tuple[float, int]] = {}
        self._tokens = itertools.count()
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = os.pipe()  # one byte wakes the thread: a C call, safe to interrupt after

    def arm(self, seconds: float) -> int:
        if self._thread is None or not self._thread.is_alive():  # first use, or a forked child; before arming
            self._thread = threading.Thread(target=self._serve, name="gpufn-deadline", daemon=True)
            self._thread.start()
        with self._lock:
            token = next(self._tokens)
            self._armed[token] = (time.monotonic() + seconds, threading.get_ident())
        os.write(self._wake_w, b"w")
        return token

    def disarm(self, token: int) -> bool:
        """Remove the deadline; True when it had already fired."""
        with self._lock:
            return self._armed.pop(token, None) is None

    def _serve(self) -> None:
        while True:
            with self._lock:
                now = time.monotonic()
                for token, (due, thread) in list(self._armed.items()):
                    if due <= now:
                        del self._armed[token]
                        raise_in(thread, RowTimeout)
                due = min((d for d, _ in self._armed.values()), default=None)
            ready, _, _ = select.select([self._wake_r], [], [], None if due is None else max(due - now, 0.0))
            if ready:
                os.read(self._wake_r, 4096)

    def after_fork(self) -> None:
        os.close(self._wake_r)
        os.close(self._wake_w)
        self.__init__()  # the parent's thread is not in the child; the next arm starts one


_WATCHDOG = _Watchdog()
os.register_at_fork(after_in_child=_WATCHDOG.after_fork)


class deadline:  # noqa: N801 - used as a context manager, like contextlib's
    """Raise `RowTimeout` in this thread if the block runs past `seconds` (None or 0: no deadline).

    A fired deadline whose exception has not surfaced yet when the block ends is withdrawn, so it
    never escapes past the `with`. (A class, not a generator: no Python frame between the block
    and the disarm for the exception to land in.)
    """

    def __init__(self, seconds: float | None):
        self.seconds = seconds
        self.token: int | None = None

    def __enter__(self) -> None:
        if self.seconds:
            self.token = _WATCHDOG.arm(self.seconds)

    def __exit__(self, *exc: object) -> None:
        if self.token is not None and _WATCHDOG.disarm(self.token):
            _set_async_exc(threading.get_ident(), ctypes.py_object())  # NULL: clear a pending RowTimeout
