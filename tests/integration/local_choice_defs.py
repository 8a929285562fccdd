"""A code location for the ordered-classes tests: `docs__slow` on class `default`, `docs__on_l4` on
class `l4`, and `docs__either`, which accepts `default` and then `l4`; each holds its slots until
the test opens its gate (see local_defs)."""

from gpufn_dagster import build_definitions, gpu_function

from local_defs import held_upper  # noqa: E402 - a sibling module on Dagster's code location path

slow = gpu_function(table="docs", column="slow", gpu_class="default", batch_size=2)(held_upper)
on_l4 = gpu_function(table="docs", column="on_l4", gpu_class="l4", batch_size=2)(held_upper)
either = gpu_function(table="docs", column="either", gpu_class=["default", "l4"], batch_size=2)(held_upper)
defs = build_definitions(assets=[slow, on_l4, either])
