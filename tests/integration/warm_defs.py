"""A code location for the warm-instance tests, on table `docs`, class `default`, with a Function in
every form the README writes (the callables are `warm_udfs`'s):

- `docs__tagged`: `@gpu_function` on a class (the module's name `Tagged` then holds the asset);
  `docs__retagged`: the same class called with another `init` (another version), in the
  `gpu_function(...)(cls)` form; `docs__spread`: the decorated class spread over 3 workers (shards).
- `docs__marked`: `@gpu_function` on a `def`; `docs__counted`: a `lancedb.udf`; `docs__yamled`: a
  YAML `FunctionColumn` (`warm_yaml/defs/yamled/defs.yaml`).
- `docs__configured`: a Function whose module reads a setting from the environment when it loads.
- `docs__closure`: a Function whose callable is a closure, which no other process can import.

Loaded as a code location's `python_file` (its folder on sys.path, so `warm_udfs` and `warm_yaml` import).
"""

import importlib
from pathlib import Path

import lancedb
import pyarrow as pa
from dagster.components import load_defs

from gpufn_dagster import build_definitions, gpu_function
from warm_udfs import Tagger, configured, note_call


@gpu_function(table="docs", column="tagged", gpu_class="default", output_type=pa.string(), init={"tag": "v1"})
class Tagged(Tagger):
    """Tagger, tagging 'v1'."""


retagged = gpu_function(table="docs", column="retagged", gpu_class="default", output_type=pa.string(),
                        init={"tag": "v2"})(Tagger)


@gpu_function(table="docs", column="spread", gpu_class="default", output_type=pa.string(), init={"tag": "s"},
              workers=3)
class Spread(Tagger):
    """Tagger, tagging 's', over 3 workers."""


@gpu_function(table="docs", column="marked", gpu_class="default")
def marked(text: str) -> str:
    note_call(1)
    return f"{text}#def"


@lancedb.udf(gpu=True)
def count_chars(text: str) -> int:
    note_call(1)
    return len(text)


counted = gpu_function(table="docs", column="counted", gpu_class="default")(count_chars)
configured_asset = gpu_function(table="docs", column="configured", gpu_class="default")(configured)
yamled = load_defs(importlib.import_module("warm_yaml.defs"), project_root=Path(__file__).parent).assets


def _exclaimer():
    def exclaim(text: str) -> str:
        return text + "!"

    return exclaim


closure = gpu_function(table="docs", column="closure", gpu_class="default")(_exclaimer())
defs = build_definitions(assets=[Tagged, retagged, Spread, marked, counted, configured_asset, *yamled, closure])
