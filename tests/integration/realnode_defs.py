"""A code location for the real-node tests: `docs__shout` on class l4, spread over 2 workers, and
the `gpu_capacity` sensor, which the deployment test's daemon pod runs.

The Function logs each row it computes with whether it ran inside the suite's worker image (a
file only that image has) to `$GPUFN_TEST_LOG`, and takes `$GPUFN_TEST_ROW_SECONDS` per row
(none by default), so a test can catch a shard while it computes.
"""

import os
import time

from gpufn_dagster import build_definitions, gpu_function
from gpufn_dagster import capacity_sensor


def shout(text: str) -> str:
    time.sleep(float(os.environ.get("GPUFN_TEST_ROW_SECONDS", "0")))
    with open(os.environ["GPUFN_TEST_LOG"], "a") as log:
        log.write(f"{text}|{os.path.exists('/etc/gpufn-worker-image')}\n")
    return text.upper()


defs = build_definitions(assets=[gpu_function(table="docs", column="shout", gpu_class="l4", workers=2)(shout)],
                         sensors=[capacity_sensor(minimum_interval_seconds=2)])
