"""A code location for the real-node test: `docs__shout` on class l4, spread over 2 workers.

The Function logs each row it computes with whether it ran inside the suite's worker image (a
file only that image has) to `$GPUFN_TEST_LOG`.
"""

import os

from gpufn_dagster import build_definitions, gpu_function


def shout(text: str) -> str:
    with open(os.environ["GPUFN_TEST_LOG"], "a") as log:
        log.write(f"{text}|{os.path.exists('/etc/gpufn-worker-image')}\n")
    return text.upper()


defs = build_definitions(assets=[gpu_function(table="docs", column="shout", gpu_class="l4", workers=2)(shout)])
