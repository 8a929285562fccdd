"""The embedded mode's run launcher: Dagster's default launcher, with each code location's next run
worker started before its run (a warm run worker, `embedded.warm_worker`).

    run_launcher:
      module: gpufn_dagster            # the package exports GpuLocalRunLauncher
      class: GpuLocalRunLauncher
      config: {warm_run_workers: true} # false: every run worker is started by the code server, as Dagster does

A run launches by handing it to its location's warm worker -- one line on the worker's standard
input, nothing waited for, as `launch_run` must not block the daemon -- and the next warm worker of
that location starts at once, so it has loaded the code by the time the next run comes. (Its
preparing -- seconds of imports on one core -- overlaps the run just launched: on a 2-core machine
a sensor's 50-row embedding took 1.3 s instead of 0.5 s, yet appends were committed sooner than
when the next worker prepared only after that run had ended, and found itself unready: BENCHMARKS.md.) The first run
of a location since the daemon started finds none: it gets a worker started for it, as slow as a
cold start, no slower. A location served by another Python than this process's (a workspace entry
with its own `executable_path`) is launched through its code server as before.

A run handed to a warm worker carries the worker's process identity (`RUN_WORKER_TAG`); terminating
it interrupts that process as the code server would its own run process (the run ends canceled),
from whichever process asks -- the webserver, the daemon. Warm workers still waiting end with this
launcher (`dispose`) or, if it dies, when their standard input closes.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

import dagster as dg
from dagster import DefaultRunLauncher, serialize_value

from ..private_ledger import (EngineEventData, ExecuteRunArgs, HoldsInstance, InstanceRef, LaunchRunContext,
                              RepositoryPythonOrigin, note_launched)
from .procfs import identity, same_process
from ..tags import RUN_WORKER_TAG
from .warm_worker import MODULE


class WarmWorker:
    """The launcher's handle on one warm run worker process: started for a code location, handed one run."""

    def __init__(self, origin: RepositoryPythonOrigin, instance_ref: InstanceRef, location_name: str, run_id: str):
        """`run_id`: the run whose launch starts it; it loads the code location with that run's load data."""
        ready_r, ready_w = os.pipe()
        self.started = time.monotonic()
        self.process = subprocess.Popen([sys.executable, "-m", MODULE, serialize_value(origin), serialize_value(instance_ref),
                                         location_name, run_id, str(ready_w)],
                                        stdin=subprocess.PIPE, pass_fds=(ready_w,), text=True)
        os.close(ready_w)
        self._ready = os.fdopen(ready_r)
        self.prepared_seconds: float | None = None
        self.identity = identity(self.process.pid)

    def ready(self) -> bool:
        """Whether it has loaded the code and started its step forkserver (without waiting)."""
        if self.prepared_seconds is None and select.select([self._ready], [], [], 0)[0]:
            line = self._ready.readline().strip()
            self.prepared_seconds = float(line) if line else None
        return self.prepared_seconds is not None

    def waiting(self) -> bool:
        """Whether it is still there to take a run."""
        return self.process.poll() is None

    def hand(self, args: ExecuteRunArgs) -> None:
        """Give it its run; it executes it when prepared (at once, when it is). A thread reaps the
        process when its run ends, so no finished worker lingers as a zombie of the daemon."""
        assert self.process.stdin is not None
        self.process.stdin.write(serialize_value(args) + "\n")
        self.process.stdin.close()
        self._ready.close()
        threading.Thread(target=self.process.wait, name=f"reap-run-worker-{self.process.pid}", daemon=True).start()

    def stop(self) -> None:
        """End it before it took a run (closing its input ends it; a kill if it does not)."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()
        self._ready.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class GpuLocalRunLauncher(HoldsInstance, DefaultRunLauncher):
    """Dagster's `DefaultRunLauncher` whose runs start in a warm run worker of their code location.

    Example:
        >>> GpuLocalRunLauncher(warm_run_workers=False).warm_run_workers
        False
    """

    def __init__(self, inst_data: Any = None, warm_run_workers: bool = True):
        super().__init__(inst_data=inst_data)
        self.warm_run_workers = warm_run_workers
        self._next: dict[str, WarmWorker] = {}  # by serialized repository origin (the origin holds lists)
        self._lock = threading.Lock()

    @classmethod
    def config_type(cls) -> dict[str, dg.Field]:
        return {"warm_run_workers": dg.Field(bool, default_value=True, is_required=False, description=(
            "Start each code location's next run worker before its run (the code loaded, the step forkserver "
            "started), so a run starts in a fraction of a second; false: as Dagster's DefaultRunLauncher."))}

    @classmethod
    def from_config_value(cls, inst_data: Any, config_value: Mapping[str, Any]) -> GpuLocalRunLauncher:
        return cls(inst_data=inst_data, **config_value)

    @property
    def waiting(self) -> list[WarmWorker]:
        """The warm workers started for the next run of each code location, not handed one yet."""
        with self._lock:
            return [worker for worker in self._next.values() if worker.waiting()]

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        origin = run.job_code_origin
        if not self.warm_run_workers or origin is None or origin.repository_origin.executable_path != sys.executable:
            super().launch_run(context)
            return
        repository = origin.repository_origin
        location = run.remote_job_origin.location_name if run.remote_job_origin else ""
        key = serialize_value(repository) + location

        def start() -> WarmWorker:
            return WarmWorker(repository, self.instance.get_ref(), location, run.run_id)

        with self._lock:
            worker = self._next.pop(key, None)
            if worker is not None and not worker.waiting():
                worker = None
            fresh = worker is None
            worker = worker or start()
            ready = worker.ready()
            worker.hand(ExecuteRunArgs(job_origin=origin, run_id=run.run_id, instance_ref=self.instance.get_ref()))
            self._next[key] = start()
        self.instance.add_run_tags(run.run_id, {RUN_WORKER_TAG: worker.identity})
        age = time.monotonic() - worker.started
        if fresh:
            said = ("No warm run worker of this code location was waiting (its first run since the daemon started, or "
                    f"the last one ended): started process {worker.process.pid} for this run.")
        elif ready:
            said = (f"Handed to the warm run worker, process {worker.process.pid}: started {age:.1f}s ago, it had loaded "
                    f"the code location and started its step forkserver in {worker.prepared_seconds:.1f}s.")
        else:
            said = (f"Handed to the warm run worker, process {worker.process.pid}, started {age:.1f}s ago and still "
                    "loading the code location: the run starts when it has.")
        self.instance.report_engine_event(said, run, EngineEventData({
            "Run worker pid": str(worker.process.pid), "Warm": str(not fresh),
            "Seconds since it started": round(age, 3)}), cls=self.__class__)
        note_launched(self, run.run_id)

    def terminate(self, run_id: str) -> bool:
        run = self.instance.get_run_by_id(run_id)
        if run is None or RUN_WORKER_TAG not in run.tags:
            return super().terminate(run_id)
        if run.is_finished:
            return False
        self.instance.report_run_canceling(run)
        pid = same_process(run.tags[RUN_WORKER_TAG])
        if pid is None:
            self.instance.report_engine_event(
                f"Its run worker ({run.tags[RUN_WORKER_TAG]}) is no longer running: nothing to interrupt.", run,
                cls=self.__class__)
            return False
        os.kill(pid, signal.SIGINT)  # what the code server sends its own run process: the run ends canceled
        return True

    def dispose(self) -> None:
        with self._lock:
            waiting, self._next = list(self._next.values()), {}
        for worker in waiting:
            worker.stop()
        super().dispose()
