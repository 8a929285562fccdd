"""Warm Function instances in the embedded mode: a Function's loaded instance (its class
constructed, its model on the slot's device) outlives the step that loaded it, so the next step of
the same Function version on the same local slot computes at once instead of loading it again.

Design: one long-lived process per kept instance (`embedded.warm_host`), started by the first step
of a Function version on a local slot, in a session of its own. The steps that hold that slot
later hand it their calls over a Unix socket -- an Arrow record batch in, the output array and
the failed rows out -- and it runs the engine's `call_function` on them, so the error policy and
out-of-memory splits behave as in the step. Chosen over keeping instances in the run worker or a
forkserver because each run is a process of its own (runs never share memory), and over one
process per slot serving several versions because a process that imported one version's modules
cannot import another's: one process, one version, one device, so two never share an instance.

- Keyed by (class, slot, device, Function version, settings): the slot's lock (`embedded.slots`) means
  one step at a time uses a slot's instances; nothing is shared between versions, devices or
  settings, and an instance of the same version loaded with other settings is ended when found.
- Bounded by the class's `local.warm`: `idle` (unused that long, the process ends), `instances`
  and `memory` per slot (the least recently used end first when a new one loads).
- A crash of the process fails the call in flight -- only the step using it -- naming the
  process and its log; the next step starts a fresh one.
- The step's log says which: "reused the instance loaded at ... (version ...)" with
  `load_seconds` 0, or why it loaded anew.
- The same seam (`worker.FunctionInstance`: ready, call, close) would serve Kubernetes: a
  long-lived instance pod per GPU node (a Deployment on the class's pool) answering the same
  socket protocol over the pod network, the slot being a GPU that pod holds; not built yet.

The callable travels by where it is defined (`function_spec.target`), so every form a Function
is written in -- a decorated `def` or `class`, `gpu_function(...)(f)`, a `lancedb.udf`, a YAML
import path -- reaches the slot's process; one that cannot (a lambda, a closure) is loaded in the
step as before, and the log says why. An instance is keyed by its version and by the settings of
the code location that loaded it (`loaded_code.settings_digest`: environment, loaded files), so it
never serves a step whose code or settings differ from those it was loaded with.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any

import pyarrow as pa

from ..classes import GpuClass
from ..errors import FunctionDefinitionError, FunctionFailed, RefreshStopped
from ..function_spec.functions import Function
from ..loaded_code import settings_digest
from .procfs import alive, command_words, running_module, stat_fields
from ..tags import time_tag
from ..refresh.execute import BatchFit, RowError, Rows
from ..refresh.progress import Progress
from ..refresh.worker import FunctionInstance, InstanceSource, loading

HOST_MODULE = "gpufn_dagster.embedded.warm_host"
# Processes that stand between a step and the process that launched its run: skipped when
# looking for the owner a warm instance's process lives no longer than.
_RUN_PROCESSES = ("api execute_run", "api execute_step", "multiprocessing", "gpufn_dagster.embedded.warm_worker")


@dataclass(frozen=True)
class Slot:
    """The local slot a step holds while it refreshes: its class, index and device, and the
    directory (the instance's slot locks) where its warm instances register."""

    gpu_class: GpuClass
    index: int
    device: str  # CUDA_VISIBLE_DEVICES of the slot ('' when the class names no devices)
    directory: Path

    def key(self, version: str, settings: str) -> str:
        """The registry key of `version`'s instance on this slot, loaded with `settings`
        (`loaded_code.settings_digest`: the code location's environment and files).

        >>> from gpufn_dagster.classes import GpuClass
        >>> l4 = GpuClass(name="l4", gpu_model="L4", gpu_memory="24GiB", max_gpu_count_per_worker=1)
        >>> slot = Slot(l4, 0, "0", Path("/x"))
        >>> slot.key("v1", "s") == slot.key("v1", "s") != Slot(l4, 1, "1", Path("/x")).key("v1", "s")
        True
        >>> slot.key("v1", "s") != slot.key("v1", "t")
        True
        """
        return hashlib.sha256(f"{self.gpu_class.name}|{self.index}|{self.device}|{version}|{settings}".encode()
                              ).hexdigest()[:20]

    def holds(self, record: dict[str, Any]) -> bool:
        """Whether a registry entry is an instance of this slot: the registry directory holds every
        class's and slot's, and only the slot's own count towards its `local.warm` bounds.

        >>> from gpufn_dagster.classes import GpuClass
        >>> l4 = GpuClass(name="l4", gpu_model="L4", gpu_memory="24GiB", max_gpu_count_per_worker=1)
        >>> [Slot(l4, 0, "0", Path("/x")).holds({"gpu_class": "l4", "slot": s, "device": "0"}) for s in (0, 1)]
        [True, False]
        """
        return (record["gpu_class"], record["slot"], record["device"]) == (self.gpu_class.name, self.index, self.device)


def owner_pid() -> int:
    """The process a warm instance lives no longer than: the first ancestor of this step that is
    not part of the run (its worker, its forkserver): the daemon or `dagster dev` that launched it,
    or the test process that ran the daemon's pass."""
    pid = os.getppid()
    while pid > 1:
        words = " ".join(command_words(pid))
        stat = stat_fields(pid)
        if not words or not stat or not any(marker in words for marker in _RUN_PROCESSES):
            return pid
        pid = int(stat[1])
    return os.getppid()


def _end(pid: int) -> None:
    """Ask a warm instance's process to end (it removes its registry entry)."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass


def registered(directory: Path) -> list[dict[str, Any]]:
    """The warm instances whose process is alive, from their registry entries (stale ones removed)."""
    found = []
    for entry in sorted(directory.glob("*.json")):
        try:
            record = json.loads(entry.read_text())
        except (OSError, ValueError):
            continue
        if alive(record["pid"]):
            found.append(record)
        else:  # its log stays: a crash's step names it
            entry.unlink(missing_ok=True)
    return found


def stop_hosts(directory: Path) -> list[int]:
    """End every warm instance registered in `directory`; their pids."""
    stopped = [record["pid"] for record in registered(directory)]
    for pid in stopped:
        _end(pid)
    return stopped


def host_processes(under: Path | None = None) -> list[int]:
    """The pids of the warm instances' processes running on this machine (those whose registry is
    under `under`, when given): what `ps` would show as `python -m gpufn_dagster.embedded.warm_host`."""
    return [pid for pid in running_module(HOST_MODULE)
            if under is None or any(w.startswith(str(under)) for w in command_words(pid))]


class WarmInstance(FunctionInstance):
    """The Function's instance in its slot's warm process: reused when one of this version is
    registered there, else started (and kept after this step ends)."""

    def __init__(self, function: Function, slot: Slot, say: Callable[[str], None]):
        super().__init__(function)
        self.slot, self.say = slot, say
        self.settings = settings_digest()
        self.key = slot.key(function.version, self.settings)
        self.connection: Connection | None = None
        self.record: dict[str, Any] | None = None
        self.started: subprocess.Popen | None = None
        self.interrupted = False  # the run was terminated mid-call: the process was ended on purpose

    def ready(self, progress: Progress, report: Callable[[Progress], None] | None) -> None:
        if self.connection is not None:
            return
        directory = self.slot.directory
        directory.mkdir(parents=True, exist_ok=True)
        others = [r for r in registered(directory) if self.slot.holds(r)]
        mine = [r for r in others if r["key"] == self.key]
        if mine and self._connect(mine[0]):
            self.say(f"{self.function.name}: reused the instance loaded at {time_tag(mine[0]['loaded_at'])} "
                     f"(version {self.function.version}, in process {mine[0]['pid']} on local slot {self.slot.index} "
                     f"of class {self.slot.gpu_class.name!r}); nothing loaded")
            return
        # The same version loaded with other settings (the code location's environment or files changed since)
        # never serves again: ended now, so its device memory is free for this one.
        outdated = [r for r in others if r["version"] == self.function.version and r["key"] != self.key]
        for record in [*mine, *outdated]:  # registered but not answering, or outdated: end it
            _end(record["pid"])
            deadline = time.monotonic() + 10
            while alive(record["pid"]) and time.monotonic() < deadline:
                time.sleep(0.05)
            others.remove(record)
        why = ("the warm one of this version did not answer, so it was ended" if mine else
               "the warm one of this version was loaded with other settings (the code location's environment or "
               "files changed since), so it was ended" if outdated else
               "no instance of this version was warm on this slot (first use, the code changed, the last one was "
               "ended with its terminated run or by a crash, or it was idle longer than local.warm.idle "
               f"{self.slot.gpu_class.local.warm.idle.total_seconds():.0f}s)")
        before = progress.load_seconds
        with loading(progress, report):
            self._make_room(others)
            record = self._start()
        self.say(f"{self.function.name}: loaded the instance anew ({why}) in process {record['pid']} on local slot "
                 f"{self.slot.index} of class {self.slot.gpu_class.name!r}, in {progress.load_seconds - before:.1f}s; "
                 f"it stays warm for the next step of version {self.function.version}")

    def _connect(self, record: dict[str, Any]) -> bool:
        try:
            self.connection = Client(record["address"], family="AF_UNIX", authkey=bytes.fromhex(record["authkey"]))
        except (OSError, EOFError):
            return False
        self.record = record
        return True

    def _make_room(self, others: list[dict[str, Any]]) -> None:
        """End the slot's least recently used instances (`others`, its registered ones) beyond
        `local.warm` (count and memory); never another slot's, which may be in a call of a step
        running beside this one."""
        warm = self.slot.gpu_class.local.warm
        others = sorted(others, key=lambda r: r["last_used"])
        while others and (len(others) >= warm.instances
                          or (warm.memory is not None and sum(r["resident_bytes"] for r in others) >= warm.memory)):
            oldest = others.pop(0)
            _end(oldest["pid"])
            self.say(f"{self.function.name}: ended the warm instance of {oldest['function_name']} (version "
                     f"{oldest['version']}) on this slot to make room (local.warm: {warm.instances} instance(s)"
                     + (f", {warm.memory} bytes" if warm.memory is not None else "") + ")")

    def _start(self) -> dict[str, Any]:
        """Start the slot's process for this version and wait until it loaded the instance."""
        spec_path = self.slot.directory / f"{self.key}.pickle"
        for suffix in (".json", ".error"):
            spec_path.with_suffix(suffix).unlink(missing_ok=True)
        address = "\0gpufn-warm-" + hashlib.sha256(f"{self.slot.directory.resolve()}|{self.key}".encode()).hexdigest()[:24]
        spec = {"key": self.key, "version": self.function.version, "function_name": self.function.name,
                "gpu_class": self.slot.gpu_class.name, "slot": self.slot.index, "device": self.slot.device,
                "address": address, "authkey": secrets.token_bytes(16), "owner_pid": owner_pid(),
                "idle_seconds": self.slot.gpu_class.local.warm.idle.total_seconds(),
                "settings": self.settings, "function": pickle.dumps(self.function), "sys_path": list(sys.path),
                "cwd": os.getcwd()}
        spec_path.write_bytes(pickle.dumps(spec))
        os.chmod(spec_path, 0o600)
        log = spec_path.with_suffix(".log")
        with open(log, "ab") as out:
            self.started = subprocess.Popen([sys.executable, "-m", HOST_MODULE, str(spec_path)], stdin=subprocess.DEVNULL,
                                            stdout=out, stderr=out, start_new_session=True, cwd=os.getcwd())
        entry = spec_path.with_suffix(".json")
        while True:
            if entry.exists():
                record = json.loads(entry.read_text())
                if self._connect(record):
                    return record
            if self.started.poll() is not None:
                error = spec_path.with_suffix(".error")
                detail = error.read_text().strip().splitlines()[-1] if error.exists() else _tail(log)
                raise FunctionFailed(f"Function {self.function.name!r} failed to load in its warm instance's process "
                                     f"(exit {self.started.returncode}): {detail} (log: {log})")
            time.sleep(0.05)

    def call(self, inputs: pa.RecordBatch, rows: Rows, fit: BatchFit) -> tuple[pa.Array, list[RowError]]:
        assert self.connection is not None and self.record is not None
        try:
            self.connection.send(("call", inputs, rows.addresses, rows.ids, fit.rows))
            reply = self.connection.recv()
        except (EOFError, OSError) as err:
            self.connection = None
            if self.interrupted:
                raise RefreshStopped from err
            log = self.slot.directory / f"{self.key}.log"
            raise FunctionFailed(
                f"Function {self.function.name!r}: its warm instance's process (pid {self.record['pid']}) on local slot "
                f"{self.slot.index} of class {self.slot.gpu_class.name!r} ended during a call ({_exit(self.record['pid'])}); "
                f"this step fails, and the next one loads a fresh instance (log: {log}: {_tail(log)})") from err
        if reply[0] == "raise":
            raise reply[1]
        _, values, errors, fit.rows, splits = reply
        fit.splits += splits
        return values, errors

    def interrupt(self, thread: int) -> None:
        """The run was terminated mid-call: end the instance's process, which frees its GPU at once
        (a model's call cannot be stopped from this process); the next step loads a fresh one."""
        self.interrupted = True
        if self.record is not None:
            _end(self.record["pid"])

    def close(self) -> None:
        """End this step's use; the instance stays loaded for the next step."""
        if self.connection is not None:
            try:
                self.connection.send(("done",))
            except OSError:
                pass
            self.connection.close()
            self.connection = None


def _exit(pid: int) -> str:
    return "it is gone" if not alive(pid) else "it stopped answering"


def _tail(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no log"
    return lines[-1] if lines else "empty log"


def unsendable(function: Function) -> str | None:
    """Why `function` cannot be sent to its slot's own process (a closure, a lambda), or None when it can.

    >>> import textwrap, pyarrow as pa
    >>> from gpufn_dagster import make_function
    >>> unsendable(make_function(textwrap.dedent, table="docs", column="d", output_type=pa.string())) is None
    True
    >>> same = make_function(lambda text: text, table="docs", column="same", output_type=pa.string())
    >>> unsendable(same).startswith("its callable cannot be sent")
    True
    """
    try:
        pickle.loads(pickle.dumps(function))
    except Exception as err:  # noqa: BLE001 -- whatever pickle raises is the reason
        return f"its callable cannot be sent to a process of its own ({type(err).__name__}: {err})"
    return None


def warm_instances(gpu_class: GpuClass | None, held: Any, say: Callable[[str], None],
                   in_run_worker: bool = False) -> InstanceSource:
    """Where a step's refresh gets its Function's instance: the warm process of the local slot it
    holds (`held`: `embedded.slots.HeldSlots`, its first slot for a step of several GPUs) when its class
    keeps instances (`local.warm.idle` > 0) and the Function can be sent to another process; else
    loaded in the step (the log says why when it could not be sent).

    A step run by the run worker itself (`in_run_worker`: the run's `in_process` executor option)
    always computes on the slot's process -- one kept only for this step under `idle: 0` -- so the
    run worker, which goes on to its run's other steps, never initializes a device; a Function that
    cannot be sent there is refused, saying what to do.

    >>> warm_instances(None, None, print) is FunctionInstance
    True
    """
    if gpu_class is None or held is None or (gpu_class.local.warm.idle.total_seconds() <= 0 and not in_run_worker):
        return FunctionInstance
    slot = Slot(gpu_class, held.slots[0], ",".join(held.devices), held.lock_dir / "warm")

    def source(function: Function) -> FunctionInstance:
        why = unsendable(function)
        if why is not None:
            if in_run_worker:
                raise FunctionDefinitionError(
                    f"{function.name}: a GPU Function computes in its local slot's own process when the run's steps "
                    f"run in the run worker (execution.config.in_process), and {why}: define it at a module's top "
                    "level, or run without in_process")
            say(f"{function.name}: loaded in this step, not kept warm: {why}; define it at a module's top level to "
                "keep it warm")
            return FunctionInstance(function)
        return WarmInstance(function, slot, say)

    return source
