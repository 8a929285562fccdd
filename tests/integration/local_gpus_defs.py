"""A code location for the GPU-weighted slots test: on class `default` (4 local slots, given by the
test), `docs__slow` and `docs__later` ask for one GPU, `docs__pair` for two; both hold their slots until the
test opens their gate (see local_defs)."""

from gpufn_dagster import build_definitions, gpu_function

from local_defs import held_upper  # noqa: E402 - a sibling module on Dagster's code location path

slow = gpu_function(table="docs", column="slow", gpu_class="default", batch_size=2)(held_upper)
later = gpu_function(table="docs", column="later", gpu_class="default", batch_size=2)(held_upper)
pair = gpu_function(table="docs", column="pair", gpu_class="default", gpu_count=2, batch_size=2)(held_upper)
defs = build_definitions(assets=[slow, later, pair])
