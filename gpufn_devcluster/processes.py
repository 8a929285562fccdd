"""Server processes the test harness starts (control plane, object store): on free ports, each in
its own session with a parent-death signal, so nothing outlives the Python process that started
it, even when that process is killed."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path

_PR_SET_PDEATHSIG = 1


class ClusterError(RuntimeError):
    """A harness component failed to build, start or become ready; the message has its log tail."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def spawn(binary: Path, args: list[str], log: Path, cwd: Path) -> subprocess.Popen:
    """Start `binary args...` with its output in `log`."""
    with open(log, "wb") as out, warnings.catch_warnings():
        # preexec_fn forces fork(); lance/lancedb warn about forking, but the child only execs a binary.
        warnings.simplefilter("ignore", RuntimeWarning)
        warnings.simplefilter("ignore", UserWarning)
        return subprocess.Popen([str(binary), *args], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=_die_with_parent, cwd=cwd)


def stop_all(processes: Mapping[str, subprocess.Popen], grace: float = 10.0) -> None:
    """SIGTERM every process (last started first), SIGKILL what has not exited after `grace` s."""
    for process in reversed(list(processes.values())):
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for process in processes.values():
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def log_tail(log: Path, lines: int = 30) -> str:
    """The last lines a process wrote (empty before it wrote any)."""
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else ""


def wait_ready(name: str, process: subprocess.Popen, ready: Callable[[], object], log: Path,
               timeout: float = 60.0, poll: float = 0.2) -> None:
    """Wait until `ready()` is true; raise ClusterError with the log's tail if the process exits
    first or `timeout` passes. A probe's OSError (a port not listening yet) counts as not ready."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ClusterError(f"{name} exited with {process.returncode}:\n{log_tail(log)}")
        try:
            if ready():
                return
        except OSError:
            pass
        time.sleep(poll)
    raise ClusterError(f"{name} not ready after {timeout:.0f}s:\n{log_tail(log)}")
