"""Facts about processes, read from Linux's /proc: whether one still runs, who its parent is, what
command it runs, and an identity that a reused pid cannot take over.

The processes gpufn keeps beyond one step or run (a warm Function instance, a warm run worker) are
found, watched and signalled through these, from whichever process asks: the daemon that started
them, the webserver that terminates a run, the test that checks none is left.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def stat_fields(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name: state, parent pid, ... ([] when gone).

    >>> import os
    >>> stat_fields(os.getpid())[1] == str(os.getppid()), stat_fields(2**22 + 1)
    (True, [])
    """
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def alive(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie -- ended, not yet reaped -- does not).

    >>> import os
    >>> alive(os.getpid()), alive(2**22 + 1)
    (True, False)
    """
    stat = stat_fields(pid)
    return bool(stat) and stat[0] not in ("Z", "X")


def command_words(pid: int) -> list[str]:
    """The command line of process `pid`, word by word ([] when gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def identity(pid: int) -> str:
    """`pid@start`: the pid and when the process started (clock ticks since boot), which no later
    process with the same pid shares ("" when it is gone).

    >>> import os
    >>> identity(os.getpid()).startswith(f"{os.getpid()}@"), identity(2**22 + 1)
    (True, '')
    """
    stat = stat_fields(pid)
    return f"{pid}@{stat[19]}" if len(stat) > 19 else ""


def same_process(process_identity: str) -> int | None:
    """The pid of the process `identity` named, if that very process still runs; else None.

    >>> import os
    >>> same_process(identity(os.getpid())) == os.getpid(), same_process(f"{os.getpid()}@0"), same_process("")
    (True, None, None)
    """
    pid = process_identity.partition("@")[0]
    if not pid.isdigit() or identity(int(pid)) != process_identity or not alive(int(pid)):
        return None
    return int(pid)


def age_seconds(pid: int) -> float:
    """Seconds since process `pid` started (its start in clock ticks since boot, to 10 ms).

    >>> import os
    >>> 0 <= age_seconds(os.getpid()) < 3600 * 24 * 365
    True
    """
    return time.clock_gettime(time.CLOCK_BOOTTIME) - int(stat_fields(pid)[19]) / os.sysconf("SC_CLK_TCK")


def running_module(module: str) -> list[int]:
    """The pids of live processes running `python -m <module>` (what `ps` shows as such)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            words = command_words(int(proc.name))
            if any(words[i:i + 2] == ["-m", module] for i in range(len(words))) and alive(int(proc.name)):
                found.append(int(proc.name))
    return found


def flocked(paths: list[Path]) -> set[Path]:
    """Which of these files some process holds an exclusive `flock` on now (from /proc/locks, which
    names each lock's inode: nothing is locked or touched to find out).

    >>> import fcntl, tempfile
    >>> held, free = (Path(tempfile.mkstemp()[1]) for _ in range(2))
    >>> handle = open(held); fcntl.flock(handle, fcntl.LOCK_EX)
    >>> flocked([held, free]) == {held}
    True
    """
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return set()
    locked = set()  # (major, minor, inode): the same inode number on another device is another file
    for line in lines:
        words = line.split()
        if len(words) > 5 and words[1] == "FLOCK" and words[3] == "WRITE":
            major, minor, inode = words[5].split(":")
            locked.add((int(major, 16), int(minor, 16), int(inode)))
    found = set()
    for path in paths:
        try:
            stat = path.stat()
        except OSError:
            continue
        if (os.major(stat.st_dev), os.minor(stat.st_dev), stat.st_ino) in locked:
            found.add(path)
    return found
