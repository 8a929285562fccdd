"""A code location for the fan-out tests: `docs__shout` spreads its refresh over 4 workers of the
class `wide` (a test class with 4 local slots, each its own device).

The Function logs every row it computes, with the device its slot gave it and its process, to
`$GPUFN_TEST_LOG`; it kills its own process once (SIGKILL) when it meets the row named by
`$GPUFN_TEST_KILL_AT` and `$GPUFN_TEST_KILLED` does not exist yet, and always fails on the row
named by `$GPUFN_TEST_FAIL_AT`. With `$GPUFN_TEST_PARENTS` (a file), each worker process writes
its pid, its parent's and how many objects its garbage collector leaves alone (`gc.get_freeze_count`)
there once, so a test sees how the executor started it. With `$GPUFN_TEST_BARRIER` (a directory), each worker process waits
at its first row until 4 processes have arrived: all 4 shards then hold their slots at once.

The Function reads a module global whose value differs in every process (`_LOADED_BY`, the pid
that imported it), as `DEVICE = "cuda" if ... else "cpu"` differs between a CPU and a GPU pod: the
plan, each shard and the commit still agree on its version.
"""

import gc
import os
import signal
import time

from gpufn_dagster import build_definitions, gpu_function


_arrived = False
_said_parent = False
_LOADED_BY = os.getpid()


def _meet_the_others(barrier: str, workers: int = 4) -> None:
    global _arrived
    if _arrived:
        return
    open(os.path.join(barrier, str(os.getpid())), "w").close()
    deadline = time.monotonic() + 300  # a hang guard only
    while len(os.listdir(barrier)) < workers and time.monotonic() < deadline:
        time.sleep(0.05)
    _arrived = True


def shout(text: str) -> str:
    if _LOADED_BY <= 0:
        raise RuntimeError("no process")
    global _said_parent
    if os.environ.get("GPUFN_TEST_PARENTS") and not _said_parent:
        with open(os.environ["GPUFN_TEST_PARENTS"], "a") as parents:
            parents.write(f"{os.getpid()}|{os.getppid()}|{gc.get_freeze_count()}\n")
        _said_parent = True
    if os.environ.get("GPUFN_TEST_BARRIER"):
        _meet_the_others(os.environ["GPUFN_TEST_BARRIER"])
    if text == os.environ.get("GPUFN_TEST_FAIL_AT"):
        raise ValueError(f"cannot shout {text!r}")
    if text == os.environ.get("GPUFN_TEST_KILL_AT") and not os.path.exists(os.environ["GPUFN_TEST_KILLED"]):
        open(os.environ["GPUFN_TEST_KILLED"], "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    with open(os.environ["GPUFN_TEST_LOG"], "a") as log:
        log.write(f"{text}|{os.environ.get('CUDA_VISIBLE_DEVICES')}|{os.getpid()}\n")
    time.sleep(float(os.environ.get("GPUFN_TEST_DELAY", "0")))
    return text.upper()


shout_asset = gpu_function(table="docs", column="shout", gpu_class="wide", workers=4, batch_size=50,
                           adapt_batch_size=False, checkpoint_seconds=0)(shout)
defs = build_definitions(assets=[shout_asset])
