"""The warm-instance tests' callables, plain (undecorated): what `warm_defs.py` decorates and what
its YAML Function names by import path (`warm_udfs:Tagger`).

`Tagger`'s constructor sleeps `$GPUFN_TEST_LOAD_SECONDS` (a model loading) and writes its pid and
tag to `$GPUFN_TEST_LOADS`; each call of any callable here writes the pid that computed it and its
rows to `$GPUFN_TEST_CALLS`. A call holding the row `$GPUFN_TEST_CRASH_AT` kills the process
computing it, once (`$GPUFN_TEST_CRASHED` marks that it did).
"""

import os
import signal
import time

import pyarrow as pa

# A setting read from the environment when the module loads (a `.env` value, say): the Function's
# version counts this line's text, not the value, so only the instance's settings can tell them apart.
SETTING = os.environ.get("GPUFN_TEST_SETTING", "unset")


def note_call(rows: int) -> None:
    """Say which process computed a call (the warm instance's, or the step's own)."""
    with open(os.environ["GPUFN_TEST_CALLS"], "a") as calls:
        calls.write(f"{os.getpid()}|{rows}\n")


class Tagger:
    def __init__(self, tag: str):
        time.sleep(float(os.environ.get("GPUFN_TEST_LOAD_SECONDS", "0")))
        with open(os.environ["GPUFN_TEST_LOADS"], "a") as loads:
            loads.write(f"{os.getpid()}|{tag}\n")
        self.tag = tag

    def __call__(self, text: pa.Array) -> pa.Array:
        rows = text.to_pylist()
        crash = os.environ.get("GPUFN_TEST_CRASH_AT")
        if crash in rows and not os.path.exists(os.environ["GPUFN_TEST_CRASHED"]):
            open(os.environ["GPUFN_TEST_CRASHED"], "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        note_call(len(rows))
        return pa.array([f"{t}#{self.tag}" for t in rows])


def configured(text: str) -> str:
    """The row as the module's setting marks it."""
    note_call(1)
    return f"{text}#{SETTING}"
