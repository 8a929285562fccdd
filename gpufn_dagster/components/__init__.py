"""The YAML front end: Functions and materialized views declared in `defs.yaml`, as Dagster Components.

    # defs/word_count/defs.yaml
    type: gpufn_dagster.components.FunctionColumn
    attributes:
      table: docs
      column: word_count
      function: my_project.udfs:count_words     # import path of the callable, class or lancedb.udf
      gpu_class: l4                              # omit for a CPU Function (or gpu: true for `default`)

`FunctionColumn` takes exactly the options `gpu_function` takes (it *is* a `FunctionOptions`)
and builds exactly the asset `gpu_function` builds, so YAML and Python declarations are
interchangeable. Unknown fields are rejected by Dagster's schema check with the file and line; a
bad import path, an unknown class, too many GPUs or a bad output type are reported with the file
and the field. `RefreshSchedule` and `TableSensor` declare a pipeline's schedule and sensor the
same way.

May import: assets, function_spec, top-level modules.
Never imports: run, run.k8s, embedded, refresh, kubernetes, dagster_k8s.
"""

from .function_column import FunctionColumn
from .materialized_view import MaterializedView
from .triggers import RefreshSchedule, TableSensor

__all__ = ["FunctionColumn", "MaterializedView", "RefreshSchedule", "TableSensor"]
