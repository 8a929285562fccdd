"""A run worker's step forkserver, started before its run and kept only while it still fits the run.

Dagster's multiprocess executor starts multiprocessing's forkserver when a run launches its first
step: a fresh interpreter importing the preloaded modules (Dagster, Arrow, Lance, the engine), some
seconds before the first step can fork. A warm run worker (`embedded.warm_worker`) starts it while it
waits for its run instead, so the run's steps fork at once. What the forkserver imported and the
environment it inherited are fixed when it starts; a run whose steps would start a different one --
another start method or preload list in its run config, or an environment changed since (a secret
injected for the code location) -- gets its own, exactly as without a warm worker: the one started
ahead is stopped first (`fit`).

multiprocessing keeps one forkserver per process and has no public way to stop it; the ledger's
`private_ledger.stop_forkserver` reaches its private parts.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
from collections.abc import Mapping, Sequence
from typing import Any

from dagster import serialize_value

from ..private_ledger import InstanceRef, stop_forkserver

# Which instance the step forkserver opens once, to import its storage (`embedded.step_preload`, the
# last of the executor's default preloads, reads it). The run worker's executor sets it before its
# first step; a warm run worker before it starts its forkserver.
STEP_PRELOAD_ENV = "GPUFN_STEP_PRELOAD"

_started: tuple[tuple[str, ...], dict[str, str]] | None = None


def start_ahead(preload_modules: Sequence[str]) -> None:
    """Start this process's forkserver now, importing `preload_modules` (as `preloads` gives them)
    in it; in the background: the first step to fork waits for the imports, not this call."""
    global _started
    multiprocessing.get_context("forkserver").set_forkserver_preload(list(preload_modules))
    multiprocessing.forkserver.ensure_running()
    _started = (tuple(preload_modules), dict(os.environ))


def preload_spec(instance_ref: InstanceRef) -> str:
    """The value of `STEP_PRELOAD_ENV` for a run on this instance (the same in the run worker and in
    the warm worker that prepared it: it depends on the instance alone)."""
    return serialize_value(instance_ref)


# Dagster's multiprocess executor imports this first in every forkserver it starts.
_EXECUTOR_MODULE = "dagster._core.executor.multiprocess"


def preloads(options: Mapping[str, Any] | None, job_module: str | None) -> tuple[str, ...]:
    """What Dagster's multiprocess executor preloads in a forkserver given its `forkserver:` options:
    the `preload_modules` given, else the job's module, else `dagster`; its own module first.

    >>> preloads({"preload_modules": ["lance"]}, "my.defs"), preloads({}, "my.defs"), preloads(None, None)
    (('dagster._core.executor.multiprocess', 'lance'), ('dagster._core.executor.multiprocess', 'my.defs'), ('dagster._core.executor.multiprocess', 'dagster'))
    """
    given = (options or {}).get("preload_modules")
    wanted = list(given) if given is not None else [job_module] if job_module else ["dagster"]
    return tuple(wanted if _EXECUTOR_MODULE in wanted else [_EXECUTOR_MODULE, *wanted])


def mismatch(start_method: Mapping[str, Any], job_module: str | None, started: tuple[tuple[str, ...], Mapping[str, str]],
             environ: Mapping[str, str]) -> str | None:
    """Why a forkserver started ahead does not fit a run's steps, or None when it does.

    >>> started = (("dagster._core.executor.multiprocess", "lance"), {"HOME": "/root"})
    >>> mismatch({"forkserver": {"preload_modules": ["lance"]}}, None, started, {"HOME": "/root"}) is None
    True
    >>> mismatch({"spawn": {}}, None, started, {"HOME": "/root"})
    'the run starts its steps with spawn'
    >>> mismatch({"forkserver": {}}, "my.defs", started, {"HOME": "/root"})
    'the run preloads other modules (dagster._core.executor.multiprocess, my.defs)'
    >>> mismatch({"forkserver": {"preload_modules": ["lance"]}}, None, started, {"HOME": "/root", "TOKEN": "x"})
    'the environment changed since it started (TOKEN)'
    """
    method, options = next(iter(start_method.items()))
    if method != "forkserver":
        return f"the run starts its steps with {method}"
    wanted = preloads(options, job_module)
    if wanted != started[0]:
        return f"the run preloads other modules ({', '.join(wanted)})"
    changed = sorted(k for k in {*environ, *started[1]} if environ.get(k) != started[1].get(k))
    if changed:
        return f"the environment changed since it started ({', '.join(changed[:5])})"
    return None


def stop_ahead() -> None:
    """Stop the forkserver started ahead, if any: a run whose steps run in its worker (`in_process`)
    forks none, and the server's memory (and, if it is still importing, its CPU) goes back. It is
    killed, not asked: one still importing its preloads would only hear the request once done."""
    global _started
    if _started is not None:
        stop_forkserver()
        _started = None


def fit(start_method: Mapping[str, Any], job_module: str | None) -> str | None:
    """Keep the forkserver started ahead if the run's `start_method` (the multiprocess executor's
    config) would start the same one; otherwise stop it, so the run's first step starts its own,
    and say why. None when it fits, or when none was started ahead."""
    if _started is None:
        return None
    why = mismatch(start_method, job_module, _started, os.environ)
    if why is not None:
        stop_ahead()
    return why


# What a step of a gpufn run imports before it computes a row: Dagster, Arrow, Lance and the engine.
# A forkserver imports them once per run; each step is then a fork of it, not a fresh interpreter
# importing them again. None of them touches CUDA, so a step still initializes its device itself,
# after its local slot has set CUDA_VISIBLE_DEVICES (a process forked after CUDA initialized could
# not use it). The Function's own modules are added when the job was loaded from a module.
PRELOAD_MODULES = ("dagster._core.executor.multiprocess", "dagster", "pyarrow", "lance", "lancedb",
                   "gpufn_dagster.assets.function_asset", "gpufn_dagster.assets.fanout_asset",
                   "gpufn_dagster.refresh.engine")
# Preloaded last: the run's instance storage (`step_preload`).
STEP_PRELOAD_MODULE = "gpufn_dagster.embedded.step_preload"


def default_start_method() -> dict[str, Any]:
    """The start method of a run's step processes when its config names none: a forkserver
    preloading `PRELOAD_MODULES`, then the run's instance (`STEP_PRELOAD_MODULE`).

    Not the job's module, which Dagster itself would preload: a code location that opens its
    database when it loads (`build_definitions` checks its tables) starts Lance's thread pools,
    which a step forked from that server does not inherit safely (a step crashed with SIGSEGV
    when the location was preloaded). Each step loads its code location itself.

    >>> default_start_method()
    {'forkserver': {'preload_modules': [..., 'gpufn_dagster.refresh.engine', 'gpufn_dagster.embedded.step_preload']}}
    """
    return {"forkserver": {"preload_modules": [*PRELOAD_MODULES, STEP_PRELOAD_MODULE]}}


def default_preloads() -> tuple[str, ...]:
    """What the forkserver of `default_start_method` imports: a warm run worker starts it ahead."""
    return preloads(default_start_method()["forkserver"], None)
