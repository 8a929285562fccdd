"""Functions as Dagster assets: lancedb's calling conventions, the tags/kinds/deps the UI and the
launcher read, and errors at definition load that list what is valid."""

from __future__ import annotations

import dagster as dg
import lancedb
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from gpufn_dagster import FunctionDefinitionError, build_definitions, function_of, gpu_function
from gpufn_dagster.function_spec.functions import CallStyle
from gpufn_dagster.assets.resources import STABLE_ROW_IDS


def make_table(db_uri: str, rows: int = 100) -> None:
    db = lancedb.connect(db_uri)
    db.create_table("items", pa.table({"id": list(range(rows)), "text": [f"item {i}" for i in range(rows)],
                                       "price": [float(i) for i in range(rows)]}), storage_options=STABLE_ROW_IDS)


def column(db_uri: str, name: str) -> list:
    table = lancedb.connect(db_uri).open_table("items")
    return table.to_lance().to_table(columns=["id", name]).sort_by("id").column(name).to_pylist()


def materialize(db_uri: str, *assets) -> dg.ExecuteInProcessResult:
    defs = build_definitions(assets=list(assets), db_uri=db_uri)
    return dg.materialize(list(assets), resources=defs.resources, instance=dg.DagsterInstance.ephemeral())


@lancedb.udf
def text_length(text: str) -> int:
    return len(text)


@lancedb.udf
class Scaler:
    def __init__(self, factor: float = 2.0):
        self.factor = factor

    def __call__(self, price: float) -> float:
        return price * self.factor


class Tagger:
    closed: list[str] = []

    def __init__(self, prefix: str):
        self.prefix = prefix

    def __call__(self, text: pa.Array) -> pa.Array:
        return pc.binary_join_element_wise(self.prefix, text, "")

    def close(self) -> None:
        Tagger.closed.append(self.prefix)


def test_conventions_scalar_batch_record_batch_class_and_lancedb_udf(db_uri):
    make_table(db_uri)
    plain = gpu_function(table="items", column="double_price")(lambda_free_double)
    arrays = gpu_function(table="items", column="tagged", output_type=pa.string(), init={"prefix": "#"})(Tagger)
    record = gpu_function(table="items", column="summary", inputs=["text", "price"], output_type=pa.string())(summarize)
    udf_fn = gpu_function(table="items", column="text_length")(text_length)
    udf_cls = gpu_function(table="items", column="tripled", init={"factor": 3.0})(Scaler)

    assert function_of(plain).call_style is CallStyle.ROW
    assert function_of(arrays).call_style is CallStyle.ARRAYS
    assert function_of(record).call_style is CallStyle.RECORD_BATCH
    assert function_of(udf_fn).output_type == pa.int64()
    assert function_of(udf_cls).is_class and function_of(udf_cls).inputs == ("price",)

    assert materialize(db_uri, plain, arrays, record, udf_fn, udf_cls).success
    assert column(db_uri, "double_price")[:3] == [0.0, 2.0, 4.0]
    assert column(db_uri, "tagged")[:2] == ["#item 0", "#item 1"]
    assert column(db_uri, "summary")[1] == "item 1 costs 1.0"
    assert column(db_uri, "text_length")[10] == len("item 10")
    assert column(db_uri, "tripled")[2] == 6.0
    assert Tagger.closed == ["#"]  # close() once, at the end of the worker


def lambda_free_double(price: float) -> float:
    return price * 2


def summarize(batch: pa.RecordBatch) -> pa.Array:
    return pa.array([f"{t} costs {p}" for t, p in zip(batch["text"].to_pylist(), batch["price"].to_pylist(), strict=True)])


def test_struct_result_fills_several_columns(db_uri):
    make_table(db_uri, 10)
    kind = pa.struct([("upper", pa.string()), ("words", pa.int64())])

    def split(text: str) -> dict:
        return {"upper": text.upper(), "words": len(text.split())}

    asset = gpu_function(table="items", column=["upper", "words"], output_type=kind)(split)
    assert materialize(db_uri, asset).success
    assert column(db_uri, "upper")[3] == "ITEM 3"
    assert column(db_uri, "words")[3] == 2


def test_missing_input_column_fails_definitions_and_lists_columns(db_uri):
    make_table(db_uri)

    def by_colour(colour: str) -> str:
        return colour

    asset = gpu_function(table="items", column="c")(by_colour)
    with pytest.raises(FunctionDefinitionError, match=r"field 'inputs': table 'items' has no column 'colour'; "
                                                      r"it has id, text, price"):
        build_definitions(assets=[asset], db_uri=db_uri)


def test_switching_the_error_policy_recomputes_nothing(db_uri):
    make_table(db_uri)
    calls = []

    def tracked(text: str) -> str:
        calls.append(text)
        return text

    materialize(db_uri, gpu_function(table="items", column="t", on_error="fail")(tracked))
    calls.clear()
    result = materialize(db_uri, gpu_function(table="items", column="t", on_error="skip")(tracked))
    assert result.success and calls == []


def test_the_launchpad_takes_only_what_may_change_per_run_and_refuses_the_rest_by_name(db_uri):
    make_table(db_uri, 300)
    sizes: list[int] = []

    def batch_upper(text: pa.Array) -> pa.Array:
        sizes.append(len(text))
        return pa.array([t.upper() for t in text.to_pylist()])

    asset = gpu_function(table="items", column="shout", inputs=["text"], output_type=pa.string(), gpu=True,
                         batch_size=64)(batch_upper)
    defs = build_definitions(assets=[asset], db_uri=db_uri)
    job = defs.resolve_implicit_global_asset_job_def()
    fields = job.run_config_schema.config_type.fields["ops"].config_type.fields["items__shout"].config_type.fields
    config_fields = fields["config"].config_type.fields
    assert sorted(config_fields) == ["batch_size", "checkpoint_seconds", "on_error", "publish_every_rows", "where"]
    assert all(f.description for f in config_fields.values())  # the Launchpad documents each

    with pytest.raises(dg.DagsterInvalidConfigError) as err:  # once accepted as "No errors", run with 1 GPU
        dg.materialize([asset], resources=defs.resources, instance=dg.DagsterInstance.ephemeral(),
                       run_config={"ops": {"items__shout": {"config": {"gpu_count": 2}}}})
    assert 'unexpected config entry "gpu_count" at path root:ops:items__shout:config' in str(err.value)

    result = dg.materialize([asset], resources=defs.resources, instance=dg.DagsterInstance.ephemeral(),
                            run_config={"ops": {"items__shout": {"config": {"batch_size": 16}}}})
    assert result.success and sum(sizes) == 300 and max(sizes) == 16  # this run's ceiling, not the definition's 64
    (event,) = result.get_asset_materialization_events()
    assert event.materialization.metadata["function_version"].value == function_of(asset).version  # values unchanged


def gpu_shout(text: str) -> str:
    return text.upper()


def test_a_gpu_functions_asset_page_shows_its_class_hardware_table_columns_and_source(db_uri):
    import inspect

    make_table(db_uri)
    asset = gpu_function(table="items", column="shout", gpu_class="a100-80gb")(gpu_shout)
    defs = build_definitions(assets=[asset], db_uri=db_uri)
    spec = next(iter(defs.resolve_all_asset_specs()))
    meta = spec.metadata
    assert (meta["gpu_model"], meta["gpu_memory_gib"]) == ("NVIDIA-A100-SXM4-80GB", 80.0)
    assert meta["local_slots"] == 1 and meta["price_per_gpu_hour"].value > 0
    assert meta["table_uri"] == f"{db_uri}/items.lance"
    (column,) = meta["dagster/column_schema"].columns
    assert (column.name, column.type) == ("shout", "string") and "from text" in column.description
    (reference,) = meta["dagster/code_references"].code_references
    assert reference.file_path == __file__ and reference.line_number == inspect.getsourcelines(gpu_shout)[1]
    # What a page in another process shows of the spec: the code behind it, not a bare class name.
    from dagster._serdes import deserialize_value, serialize_value

    across = deserialize_value(serialize_value(meta["gpufn/function"]))
    assert across.value == f"{__name__}.gpu_shout, called per row" and across.instance is None
