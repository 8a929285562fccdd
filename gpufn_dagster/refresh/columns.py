"""The columns a Function owns in its table: its outputs and the hidden per-row signature."""

from __future__ import annotations

import lance
import pyarrow as pa
from lancedb.materialized_view import DEFINITION_META_KEY

from ..errors import FunctionDefinitionError
from ..function_spec.arrow_types import datafusion_type
from ..function_spec.functions import Function
from ..tags import FUNCTION_KEY, SIG_COLUMN_KEY
from .files import TableFiles
from .signature import SIG_TYPE

_ADD_ATTEMPTS = 5




def is_function_column(field: pa.Field) -> bool:
    """Whether a column was declared by a Function (its output or signature), not written by users."""
    return SIG_COLUMN_KEY.encode() in (field.metadata or {})


def is_view(schema: pa.Schema) -> bool:
    """Whether the table is a lancedb materialized view (its schema carries the view's definition)."""
    return DEFINITION_META_KEY in (schema.metadata or {})


def declared_fields(function: Function, on_view: bool) -> list[pa.Field]:
    """The output and signature fields, tagged with the signature column they belong to.

    On a lancedb materialized view every column the view's query does not produce must be a
    lancedb computed column, or the view refuses to refresh; there they are declared as SQL
    computed columns that yield NULL (rows the view adds stay unfilled until this engine fills
    them).
    """
    fields = [*function.output_fields, pa.field(function.sig_column, SIG_TYPE)]
    tagged = []
    for f in fields:
        metadata = {SIG_COLUMN_KEY: function.sig_column, FUNCTION_KEY: function.name}
        if on_view:
            metadata.update({"computed_column": "true", "computed_column.kind": "sql", "computed_column.inputs": "[]",
                             "computed_column.expression": f"arrow_cast(NULL, '{datafusion_type(f.type)}')"})
        tagged.append(f.with_metadata(metadata))
    return tagged


def ensure_columns(files: TableFiles, function: Function) -> lance.LanceDataset:
    """Add the output and signature columns (all-NULL, metadata only) if missing; check their types."""
    for attempt in range(_ADD_ATTEMPTS):
        dataset = files.dataset()
        schema = dataset.schema
        wanted = declared_fields(function, is_view(schema))
        for name in function.inputs:
            if name not in schema.names:
                raise FunctionDefinitionError(
                    f"Function {function.name!r}: field 'inputs': table {function.table!r} has no column {name!r}; "
                    f"it has {', '.join(n for n in schema.names if not n.startswith('_gpufn'))}")
        for f in wanted:
            if f.name in schema.names and not is_function_column(schema.field(f.name)):
                raise FunctionDefinitionError(
                    f"Function {function.name!r}: field 'column': {f.name!r} is a column of table {function.table!r} "
                    "that no Function computes (its data would be overwritten); choose another column name")
            if f.name in schema.names and schema.field(f.name).type != f.type:
                raise FunctionDefinitionError(
                    f"Function {function.name!r}: field 'output_type': column {f.name!r} of table "
                    f"{function.table!r} is {schema.field(f.name).type}, the Function returns {f.type}")
        missing = [f for f in wanted if f.name not in schema.names]
        if not missing:
            return dataset
        try:
            dataset.add_columns(missing)
            return files.dataset()
        except OSError:  # a concurrent commit won the race; re-read and retry
            if attempt == _ADD_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")
