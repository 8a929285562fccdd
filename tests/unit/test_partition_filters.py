"""Unit layer of a partition's slice: which keys a partition column can name, and the Lance filter each gives."""

from __future__ import annotations

import dagster as dg
import pyarrow as pa
import pytest

from gpufn_dagster.errors import FunctionDefinitionError, PartitionKeyError
from gpufn_dagster.function_spec.partitions import Partitioning

OTHER_SPELLINGS_OF_10 = ["1_0", "+10", " 10", "10 ", "010", "\u0661\u0660"]  # int() reads each as 10


def test_an_integer_column_names_each_integer_by_one_key_only():
    numbers = Partitioning(dg.DynamicPartitionsDefinition(name="numbers"), "n")
    types = {"n": pa.int64()}
    assert numbers.where(["10"], types) == "`n` = 10"
    assert numbers.where(["-3", "0", "10"], types) == "`n` IN (-3, 0, 10)"
    for key in [*OTHER_SPELLINGS_OF_10, "-0", "two"]:
        with pytest.raises(PartitionKeyError) as err:
            numbers.where([key], types)
        assert isinstance(err.value, FunctionDefinitionError)
        assert str(err.value).startswith(f"field 'partition_column': partition key {key!r} cannot be written as a "
                                         "filter on column 'n' (int64)")
    # A string column holds the key as it is written: every spelling is a key of its own.
    assert numbers.where(["+10"], {"n": pa.string()}) == "`n` = '+10'"


def test_a_dimension_of_two_is_held_to_the_same_rule():
    both = Partitioning(dg.MultiPartitionsDefinition({"shard": dg.DynamicPartitionsDefinition(name="shards"),
                                                      "source": dg.StaticPartitionsDefinition(["news"])}),
                        {"shard": "shard", "source": "source"})
    types = {"shard": pa.int32(), "source": pa.string()}
    assert both.where([dg.MultiPartitionKey({"shard": "7", "source": "news"})], types) == \
        "`shard` = 7 AND `source` = 'news'"
    with pytest.raises(PartitionKeyError, match="partition key '07' cannot be written as a filter on column 'shard'"):
        both.where([dg.MultiPartitionKey({"shard": "07", "source": "news"})], types)


def test_static_keys_another_key_already_names_are_problems_against_the_schema():
    static = Partitioning(dg.StaticPartitionsDefinition(["10", *OTHER_SPELLINGS_OF_10, "0", "-4"]), "n")
    problems = static.problems("Function 'f'", pa.schema([("n", pa.int32())]))
    assert [p.split("partition key ")[1].split(" cannot")[0] for p in problems] == \
        [repr(k) for k in OTHER_SPELLINGS_OF_10]
    assert all(p.startswith("Function 'f': field 'partition_column': ") for p in problems)
    assert static.problems("Function 'f'", pa.schema([("n", pa.string())])) == []
