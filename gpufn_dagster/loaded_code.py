"""What code and settings this process runs with: the source files it imported from outside the
Python installation (the project's code, editable installs) and its environment.

A process that keeps something loaded for later -- a warm run worker its code location, a warm
Function instance its model -- must not serve a run whose code or settings differ from what it
loaded: the warm run worker compares its files before its run (`changed`), and a warm instance
is keyed by `settings_digest` beside its Function version, which covers the Function's code but
rightly not a module global read from the environment or a `.env` value.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import sysconfig
from pathlib import Path

# Variables that differ between the processes of one run by design, not by setting: the local slot's
# devices (a warm instance is keyed by its device already) and the step forkserver's instance.
_PER_PROCESS_ENV = frozenset({"CUDA_VISIBLE_DEVICES", "GPUFN_STEP_PRELOAD"})
_PACKAGE = Path(__file__).resolve().parent


def _installed() -> tuple[str, ...]:
    return tuple(sorted({sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}))


def loaded_files() -> dict[str, tuple[int, int]]:
    """The source file of every imported module outside the Python installation (the project's
    code, editable installs), with its modification time and size."""
    installed = _installed()
    found = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and not os.path.abspath(path).startswith(installed):
            try:
                stat = os.stat(path)
            except OSError:
                continue
            found[path] = (stat.st_mtime_ns, stat.st_size)
    return found


def changed(files: dict[str, tuple[int, int]]) -> list[str]:
    """Which of `files` (from `loaded_files`) changed or went since."""
    out = []
    for path, (mtime, size) in files.items():
        try:
            stat = os.stat(path)
        except OSError:
            out.append(path)
            continue
        if (stat.st_mtime_ns, stat.st_size) != (mtime, size):
            out.append(path)
    return out


def settings_digest() -> str:
    """A digest of this process's environment and of the project files it loaded, the same in every
    process of a code location loaded from the same files with the same settings (the run worker,
    each step it forks, a step it runs itself).

    gpufn's own modules count as the whole package's files, not as those this process happened to
    import (a warm run worker imports a few more than a step does).

    >>> settings_digest() == settings_digest()
    True
    """
    package = str(_PACKAGE)
    files = {path: stamp for path, stamp in loaded_files().items() if not os.path.abspath(path).startswith(package)}
    for path in sorted(_PACKAGE.rglob("*.py")):
        stat = path.stat()
        files[str(path)] = (stat.st_mtime_ns, stat.st_size)
    environment = {k: v for k, v in os.environ.items() if k not in _PER_PROCESS_ENV}
    payload = json.dumps({"environment": sorted(environment.items()), "files": sorted(files.items())})
    return hashlib.sha256(payload.encode()).hexdigest()[:16]
