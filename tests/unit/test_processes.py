"""The harness's server processes end with their test: default signal handling even when started
from a background job (SIGINT ignored), stopped by process group with a deadline and then SIGKILL,
and named by the session-end check while they live."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from gpufn_devcluster import processes

# A "server" that starts a child in its group, then reports its own ignored signals.
SERVER = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(open("/proc/self/status").read(), flush=True)
time.sleep(600)
"""
# One that ignores SIGTERM, as a hung shutdown does.
STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(600)"


def _ignored(status: str) -> int:
    return int(next(line for line in status.splitlines() if line.startswith("SigIgn:")).split()[1], 16)


def _wait_for_output(log: Path, text: str) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if log.exists() and text in (content := log.read_text()):
            return content
        time.sleep(0.1)
    raise AssertionError(f"{log} never said {text!r}")


def test_a_server_started_with_sigint_ignored_handles_sigint_and_sigterm_and_stops_with_its_group(tmp_path):
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as in a shell's background job
    try:
        process = processes.start([sys.executable, "-c", SERVER], log=tmp_path / "server.log")
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        ignored = _ignored(_wait_for_output(tmp_path / "server.log", "SigIgn:"))
        assert not ignored & (1 << (signal.SIGINT - 1)) and not ignored & (1 << (signal.SIGTERM - 1))
        assert any(f"pgid {process.pid}:" in s for s in processes.survivors())
    finally:
        processes.stop(process, grace=20)
    assert process.returncode == -signal.SIGTERM
    assert not any(f"pgid {process.pid}:" in s for s in processes.survivors())  # its child went with it


def test_a_server_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):
    process = processes.start([sys.executable, "-c", STUBBORN], log=tmp_path / "stubborn.log")
    _wait_for_output(tmp_path / "stubborn.log", "up")
    began = time.monotonic()
    processes.stop(process, grace=1)
    assert process.returncode == -signal.SIGKILL
    assert time.monotonic() - began < 30  # the grace, then SIGKILL: not however long it would linger
    assert not any(f"pgid {process.pid}:" in s for s in processes.survivors())
