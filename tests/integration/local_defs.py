"""A code location for the embedded-slots test: a slow GPU Function on class `default` (1 local slot)."""

import os
import time

from gpufn_dagster import build_definitions, gpu_function


def slow_upper(text: str) -> str:
    time.sleep(0.5)
    return f"{text.upper()}@{os.environ.get('CUDA_VISIBLE_DEVICES')}"


slow = gpu_function(table="docs", column="slow", gpu_class="default", batch_size=2)(slow_upper)
defs = build_definitions(assets=[slow])
