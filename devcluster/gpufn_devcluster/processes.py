"""Server processes the test harness starts (control plane, object store, `dagster dev`, `gpufn
serve`): on free ports, each in its own session with a parent-death signal and default signal
handling, stopped by process group with a deadline and then SIGKILL, so nothing outlives the
Python process that started it, even when that process is killed.

Default handling matters: a process started from a shell's background job inherits an ignored
SIGINT, and Dagster maps SIGTERM to whatever SIGINT does, so such a `dagster dev` ignores both.
Every process group started here is remembered; `survivors()` names those still alive (the
suite's session-end check).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import subprocess
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path

_PR_SET_PDEATHSIG = 1
_log = logging.getLogger(__name__)


class ClusterError(RuntimeError):
    """A harness component failed to build, start or become ready; the message has its log tail."""


_HANDED_OUT: set[int] = set()  # ports free_port() gave this process: none is handed out twice

PORT_CLASH = "address already in use"  # as Go servers and PostgreSQL log it, in lower case


def free_port() -> int:
    """A port free on 127.0.0.1 now and not handed out before by this process. Free now is not
    free later (another process may take it before the server binds it): servers started on such
    ports go through `retry_port_clash`."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def retry_port_clash(launch: Callable[[], None], clean: Callable[[], None], name: str,
                     attempts: int = 3) -> None:
    """Run `launch()` (which picks its ports with free_port, starts a server and waits for it);
    when the server fails because a port was taken between the pick and the bind, `clean()` what
    it left and launch again on new ports, up to `attempts` times. Any other failure is raised."""
    for attempt in range(1, attempts + 1):
        try:
            launch()
            return
        except ClusterError as error:
            if PORT_CLASH not in str(error).lower() or attempt == attempts:
                raise
            clean()
            _log.warning("%s: a port was taken before it bound (attempt %d), starting again", name, attempt)


_STARTED: dict[int, str] = {}  # process group -> the command that started it, for every start() here


def _child_setup() -> None:
    """In the child, before exec: SIGINT and SIGTERM handled by default (not inherited as ignored),
    and SIGKILL when the parent dies."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def start(args: list[str], *, log: Path | None = None, cwd: Path | None = None,
          env: Mapping[str, str] | None = None) -> subprocess.Popen:
    """Start `args` as a server in a process group of its own, output to `log` (else discarded)."""
    with open(log or os.devnull, "wb") as out, warnings.catch_warnings():
        # preexec_fn forces fork(); lance/lancedb warn about forking, but the child only execs.
        warnings.simplefilter("ignore", RuntimeWarning)
        warnings.simplefilter("ignore", UserWarning)
        process = subprocess.Popen([str(a) for a in args], stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_child_setup,
                                   cwd=cwd, env=None if env is None else dict(env))
    _STARTED[process.pid] = " ".join(str(a) for a in args)[:200]
    return process


def spawn(binary: Path, args: list[str], log: Path, cwd: Path) -> subprocess.Popen:
    """Start `binary args...` with its output in `log`."""
    return start([str(binary), *args], log=log, cwd=cwd)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_group(group: int, sig: signal.Signals) -> None:
    try:
        os.killpg(group, sig)
    except ProcessLookupError:
        pass


def stop_all(processes: Mapping[str, subprocess.Popen], grace: float = 10.0) -> None:
    """SIGTERM every process group (last started first), SIGKILL what is still there after `grace` s:
    the leader and anything it started in its group, even once the leader itself has exited."""
    started = list(processes.values())
    for process in reversed(started):
        _signal_group(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for process in started:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        while _group_alive(process.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _group_alive(process.pid) or process.poll() is None:
            _signal_group(process.pid, signal.SIGKILL)
            process.wait()


def stop(process: subprocess.Popen, grace: float = 30.0) -> None:
    """Stop one process started by `start`, by its process group, SIGKILL after `grace` s."""
    stop_all({"process": process}, grace)


def survivors() -> list[str]:
    """The commands of process groups started here that still have a live member."""
    return [f"pgid {group}: {command}" for group, command in _STARTED.items() if _group_alive(group)]


def kill_survivors() -> None:
    """SIGKILL every process group started here that is still alive."""
    for group in list(_STARTED):
        if _group_alive(group):
            _signal_group(group, signal.SIGKILL)


def log_tail(log: Path, lines: int = 30) -> str:
    """The last lines a process wrote (empty before it wrote any)."""
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else ""


def wait_ready(name: str, process: subprocess.Popen, ready: Callable[[], object], log: Path,
               timeout: float = 60.0, poll: float = 0.2) -> None:
    """Wait until `ready()` is true; raise ClusterError with the log's tail if the process exits
    first, logs that a port it binds is in use, or `timeout` passes. A probe's OSError (a port not
    listening yet) counts as not ready."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ClusterError(f"{name} exited with {process.returncode}:\n{log_tail(log)}")
        if PORT_CLASH in log_tail(log, 5).lower():
            raise ClusterError(f"{name} could not bind its port:\n{log_tail(log)}")
        try:
            if ready():
                return
        except OSError:
            pass
        time.sleep(poll)
    raise ClusterError(f"{name} not ready after {timeout:.0f}s:\n{log_tail(log)}")
