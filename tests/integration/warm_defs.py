"""A code location for the warm-instance tests, on table `docs`, class `default`:

- `docs__tagged` and `docs__retagged`: one class Function with two `init`s (so two versions).
  Its constructor sleeps `$GPUFN_TEST_LOAD_SECONDS` (a model loading) and writes its pid and tag
  to `$GPUFN_TEST_LOADS`; each call writes the pid that computed it and its rows to
  `$GPUFN_TEST_CALLS`. A call holding the row `$GPUFN_TEST_CRASH_AT` kills the process computing
  it, once (`$GPUFN_TEST_CRASHED` marks that it did).
- `docs__spread`: the same Function spread over 3 workers (shards).
- `docs__closure`: a Function whose callable is a closure, which no other process can import.
"""

import os
import signal
import time

import pyarrow as pa

from gpufn_dagster import build_definitions, gpu_function


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
        with open(os.environ["GPUFN_TEST_CALLS"], "a") as calls:
            calls.write(f"{os.getpid()}|{len(rows)}\n")
        return pa.array([f"{t}#{self.tag}" for t in rows])


tagged = gpu_function(table="docs", column="tagged", gpu_class="default", output_type=pa.string(),
                      init={"tag": "v1"})(Tagger)
retagged = gpu_function(table="docs", column="retagged", gpu_class="default", output_type=pa.string(),
                        init={"tag": "v2"})(Tagger)
spread = gpu_function(table="docs", column="spread", gpu_class="default", output_type=pa.string(),
                      init={"tag": "s"}, workers=3)(Tagger)


def _exclaimer():
    def exclaim(text: str) -> str:
        return text + "!"

    return exclaim


closure = gpu_function(table="docs", column="closure", gpu_class="default")(_exclaimer())
defs = build_definitions(assets=[tagged, retagged, spread, closure])
