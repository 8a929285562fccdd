"""The process that keeps one Function instance warm on one local slot (embedded mode).

Started by the first step that needs the instance (`embedded.warm`), in a session of its own, so
it outlives that step and its run. It loads the Function (its class constructed, its model on the
slot's device, `CUDA_VISIBLE_DEVICES` inherited from the step), then answers calls: an Arrow
record batch of inputs in, the output array and the failed rows out (`execute.call_function`,
with the Function's error policy and out-of-memory splits, in this process). One process holds
one instance of one Function version on one slot, so two versions never share a process. A
process starts fresh each time, so the modules it imports are the code of that version.

It exits when no step has used it for the class's `local.warm.idle`, when the process that
launched the run that started it (the daemon, `dagster dev`) is gone, on SIGTERM (a newer instance
needed the room), and if loading fails (the error is left for the step that waits, in
`<key>.error`).

    python -m gpufn_dagster.embedded.warm_host <spec file>
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import sys
import threading
import time
from multiprocessing.connection import Connection, Listener
from pathlib import Path
from typing import Any

from ..function_spec.code_version import format_exc, format_exception
from .procfs import alive


def _resident_bytes() -> int:
    """This process's resident memory (what the slot's `warm.memory` bound counts)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Host:
    """One loaded instance, its listener, and the bookkeeping its registry entry shows."""

    def __init__(self, spec_path: Path):
        spec = pickle.loads(spec_path.read_bytes())  # before any user import: sys.path comes with it
        spec_path.unlink()  # read once: the Function and the key live on in this process only
        self.spec = spec
        self.entry = spec_path.with_suffix(".json")
        self.lock = threading.Lock()  # one call at a time on the device
        self.last_used = time.time()
        self.busy = 0

    def load(self) -> None:
        spec = self.spec
        sys.path[:0] = [p for p in spec["sys_path"] if p not in sys.path]
        os.chdir(spec["cwd"])
        began = time.monotonic()
        self.function = pickle.loads(spec["function"])  # its callable imported by where it is defined
        self.call = self.function.open()
        self.load_seconds = time.monotonic() - began
        self.loaded_at = time.time()

    def publish(self) -> None:
        """Write the registry entry steps read: where to connect, what is loaded, when, how big."""
        record = {**{k: self.spec[k] for k in ("key", "version", "settings", "function_name", "gpu_class", "slot",
                                                "device", "address", "idle_seconds")},
                  "pid": os.getpid(), "loaded_at": self.loaded_at, "load_seconds": self.load_seconds,
                  "last_used": self.last_used, "resident_bytes": _resident_bytes(), "authkey": self.spec["authkey"].hex()}
        temporary = self.entry.with_suffix(".json.tmp")
        temporary.write_text(json.dumps(record))
        os.chmod(temporary, 0o600)
        os.replace(temporary, self.entry)

    def serve(self, connection: Connection) -> None:
        from ..refresh.execute import BatchFit, Rows, call_function

        self.busy += 1
        try:
            while True:
                try:
                    message = connection.recv()
                except (EOFError, OSError):
                    return
                if message[0] == "done":
                    return
                _, inputs, addresses, ids, fit_rows = message
                fit = BatchFit(rows=fit_rows)
                with self.lock:
                    try:
                        values, errors = call_function(self.call, self.function, inputs, Rows(addresses, ids), fit)
                        reply: tuple[Any, ...] = ("ok", values, errors, fit.rows, fit.splits)
                    except Exception as err:  # the Function's failure under on_error="fail": the step raises it
                        reply = ("raise", _portable(err))
                    self.last_used = time.time()
                connection.send(reply)
        finally:
            self.busy -= 1
            self.last_used = time.time()
            connection.close()
            self.publish()

    def watch(self) -> None:
        """End the process when idle past the slot's `warm.idle` or when its owner is gone."""
        idle, owner = self.spec["idle_seconds"], self.spec["owner_pid"]
        while True:
            time.sleep(0.5)
            if (not self.busy and time.time() - self.last_used > idle) or not alive(owner):
                self.end()

    def end(self, *_: Any) -> None:
        """Leave the registry and exit at once (idle, owner gone, or SIGTERM: a newer instance needed the room)."""
        self.entry.unlink(missing_ok=True)
        os._exit(0)


def _portable(err: BaseException) -> BaseException:
    """The exception itself when it pickles (FunctionFailed does), else a RuntimeError saying it."""
    try:
        pickle.loads(pickle.dumps(err))
        return err
    except Exception:
        return RuntimeError(f"{type(err).__name__}: {err}\n{format_exception(err)}")


def main(spec_path: str) -> None:
    host = Host(Path(spec_path))
    signal.signal(signal.SIGTERM, host.end)
    try:
        host.load()
    except BaseException:
        Path(spec_path).with_suffix(".error").write_text(format_exc())
        raise SystemExit(1) from None
    listener = Listener(host.spec["address"], family="AF_UNIX", authkey=host.spec["authkey"])
    host.publish()
    threading.Thread(target=host.watch, daemon=True).start()
    while True:
        try:
            connection = listener.accept()
        except OSError:  # a client that failed the handshake
            continue
        threading.Thread(target=host.serve, args=(connection,), daemon=True).start()


if __name__ == "__main__":
    main(sys.argv[1])
