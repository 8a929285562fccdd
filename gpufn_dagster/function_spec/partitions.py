"""A partitioned Function: which rows of its table one Dagster partition is (a Lance filter).

A partition is a slice of the table named by its own column(s), never a copy of the data:

- time windows (daily, hourly, weekly, monthly, any cron): `column >= start AND column < end` on a
  date or timestamp column (start and end in the partitions' timezone; as UTC instants for a
  column with a timezone), or `column = '<key>'` on a string column holding the key;
- static and dynamic keys: `column = '<key>'` (or `column = <key>` on an integer column);
- two dimensions (`MultiPartitionsDefinition`): one column per dimension, joined with AND;
- anything else: a `partition_filter` template, with `{key}` (or `{<dimension>}`, `{start}`,
  `{end}`) replaced by SQL literals, quotes included: `"lower(source) = {key}"`.

A run of several partitions (a single-run backfill) is the OR of their filters, or one window for
a contiguous time range. Pure: the table's schema is given to `problems`, never read here.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import dagster as dg
import pyarrow as pa

from ..errors import FunctionDefinitionError, PartitionKeyError

# An integer key as `str(int(key))` writes it: `int()` also reads "+10", "010", " 10" and "1_0",
# and each of them would select the rows of key "10" -- two partitions sharing one slice.
_INTEGER_KEY = re.compile(r"0|-?[1-9][0-9]*")


def literal(value: str) -> str:
    """A SQL string literal (Lance's filter dialect), quotes doubled.

    >>> literal("it's")
    "'it''s'"
    """
    return "'" + value.replace("'", "''") + "'"


def _instant(at: datetime.datetime, data_type: pa.DataType) -> str:
    """A window bound as a literal of the column's type."""
    if pa.types.is_date(data_type):
        return f"date '{at.date().isoformat()}'"
    if getattr(data_type, "tz", None):
        return f"TIMESTAMP '{at.astimezone(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')}'"
    return f"TIMESTAMP '{at.strftime('%Y-%m-%d %H:%M:%S')}'"


def _is_midnight(at: datetime.datetime) -> bool:
    return (at.hour, at.minute, at.second, at.microsecond) == (0, 0, 0, 0)


@dataclass(frozen=True)
class Partitioning:
    """How a Function's Dagster partitions map to rows of its table.

    Attributes:
        partitions_def: the asset's partitions definition.
        column: the column a partition is named by; for two dimensions, dimension name -> column.
        template: a `partition_filter` instead of the column(s).

    >>> p = Partitioning(dg.StaticPartitionsDefinition(["news", "wiki"]), "source")
    >>> p.where(["news"], {"source": pa.string()})
    "`source` = 'news'"
    >>> p.where(["news", "wiki"], {"source": pa.string()})
    "`source` IN ('news', 'wiki')"
    >>> daily = Partitioning(dg.DailyPartitionsDefinition("2026-01-01"), "day")
    >>> daily.where(["2026-01-02", "2026-01-03"], {"day": pa.date32()})
    "`day` >= date '2026-01-02' AND `day` < date '2026-01-04'"
    """

    partitions_def: dg.PartitionsDefinition
    column: str | Mapping[str, str] | None = None
    template: str | None = None

    @property
    def columns(self) -> tuple[str, ...]:
        """The table columns the filter reads (none known for a template)."""
        if isinstance(self.column, str):
            return (self.column,)
        return tuple(self.column.values()) if self.column else ()

    # --- checks ------------------------------------------------------------------------------

    def check(self, label: str) -> None:
        """What can be said without the table: the options fit the partitions definition."""
        if (self.column is None) == (self.template is None):
            raise FunctionDefinitionError(
                f"{label}: field 'partition_column': a partitioned Function names the column a partition is "
                "(partition_column) or a filter (partition_filter), exactly one of them")
        multi = isinstance(self.partitions_def, dg.MultiPartitionsDefinition)
        if self.column is not None and multi != (not isinstance(self.column, str)):
            dims = [d.name for d in self.partitions_def.partitions_defs] if multi else []
            raise FunctionDefinitionError(
                f"{label}: field 'partition_column': "
                + (f"two-dimensional partitions need a column per dimension ({', '.join(dims)}), as a mapping"
                   if multi else "one-dimensional partitions need one column name"))
        if multi and isinstance(self.column, Mapping):
            dims = {d.name for d in self.partitions_def.partitions_defs}
            if set(self.column) != dims:
                raise FunctionDefinitionError(
                    f"{label}: field 'partition_column': dimensions {sorted(self.column)} do not match the "
                    f"partitions definition's {sorted(dims)}")
        if self.template is not None:
            try:
                self._fill(self._sample_fields())
            except (KeyError, IndexError, ValueError) as err:
                raise FunctionDefinitionError(
                    f"{label}: field 'partition_filter': {self.template!r} uses a placeholder this partitions "
                    f"definition does not give ({err}); it gives {', '.join('{' + k + '}' for k in self._sample_fields())}"
                ) from None

    def problems(self, label: str, schema: pa.Schema) -> list[str]:
        """What is wrong against the table's schema: a missing column, a type that cannot hold the
        partitions, a key that cannot be written as a filter on it."""
        out = []
        types = {f.name: f.type for f in schema}
        for dimension, name in self._dimension_columns():
            if name not in types:
                out.append(f"{label}: field 'partition_column': table has no column {name!r}; it has "
                           f"{', '.join(n for n in schema.names if not n.startswith('_gpufn'))}")
                continue
            reason = _type_problem(dimension, types[name])
            if reason:
                out.append(f"{label}: field 'partition_column': column {name!r} is {types[name]}: {reason}")
                continue
            if isinstance(dimension, dg.StaticPartitionsDefinition):
                for key in dimension.get_partition_keys():
                    try:
                        _value(key, name, types[name])
                    except PartitionKeyError as err:
                        out.append(f"{label}: {err}")
        return out

    # --- filters -----------------------------------------------------------------------------

    def where(self, keys: Sequence[str], types: Mapping[str, pa.DataType],
              window: dg.TimeWindow | None = None) -> str:
        """The Lance filter selecting the rows of these partitions (one run's keys, in order).

        `window`: the run's time window, for a contiguous range of time partitions. Raises
        PartitionKeyError for a key its column cannot be filtered by (a dynamic partition's key is
        first seen here, when a run of it starts).
        """
        if not keys:
            raise ValueError("a partitioned refresh needs at least one partition key")
        if self.template is not None:
            filters = [self._fill(self._fields(key)) for key in keys]
            return filters[0] if len(filters) == 1 else " OR ".join(f"({f})" for f in filters)
        if isinstance(self.partitions_def, dg.MultiPartitionsDefinition):
            filters = [" AND ".join(self._one(dim, self.column[dim.name], key.keys_by_dimension[dim.name], types)
                                    for dim in self.partitions_def.partitions_defs)
                       for key in map(self._multi_key, keys)]
            return filters[0] if len(filters) == 1 else " OR ".join(f"({f})" for f in filters)
        assert isinstance(self.column, str)
        if isinstance(self.partitions_def, dg.TimeWindowPartitionsDefinition) and not pa.types.is_string(
                types.get(self.column, pa.string())) and not pa.types.is_large_string(types.get(self.column, pa.string())):
            window = window or dg.TimeWindow(self.partitions_def.time_window_for_partition_key(keys[0]).start,
                                             self.partitions_def.time_window_for_partition_key(keys[-1]).end)
            return self._window(self.column, window, types[self.column])
        data_type = types.get(self.column, pa.string())
        values = [_value(key, self.column, data_type) for key in keys]
        if len(values) == 1:
            return f"`{self.column}` = {values[0]}"
        return f"`{self.column}` IN ({', '.join(values)})"

    # --- helpers -----------------------------------------------------------------------------

    def _dimension_columns(self) -> list[tuple[dg.PartitionsDefinition, str]]:
        if self.column is None:
            return []
        if isinstance(self.column, str):
            return [(self.partitions_def, self.column)]
        return [(dim.partitions_def, self.column[dim.name]) for dim in self.partitions_def.partitions_defs]

    def _one(self, dim: Any, column: str, key: str, types: Mapping[str, pa.DataType]) -> str:
        data_type = types.get(column, pa.string())
        if isinstance(dim.partitions_def, dg.TimeWindowPartitionsDefinition) and not pa.types.is_string(data_type):
            return self._window(column, dim.partitions_def.time_window_for_partition_key(key), data_type)
        return f"`{column}` = {_value(key, column, data_type)}"

    @staticmethod
    def _window(column: str, window: dg.TimeWindow, data_type: pa.DataType) -> str:
        return f"`{column}` >= {_instant(window.start, data_type)} AND `{column}` < {_instant(window.end, data_type)}"

    def _multi_key(self, key: str) -> dg.MultiPartitionKey:
        return self.partitions_def.get_partition_key_from_str(key) if isinstance(key, str) and not isinstance(
            key, dg.MultiPartitionKey) else key

    def _fields(self, key: str) -> dict[str, str]:
        if isinstance(self.partitions_def, dg.MultiPartitionsDefinition):
            by_dim = self._multi_key(key).keys_by_dimension
            return {"key": literal(key), **{name: literal(value) for name, value in by_dim.items()}}
        fields = {"key": literal(key)}
        if isinstance(self.partitions_def, dg.TimeWindowPartitionsDefinition):
            window = self.partitions_def.time_window_for_partition_key(key)
            fields |= {"start": _instant(window.start, pa.timestamp("us")), "end": _instant(window.end, pa.timestamp("us"))}
        return fields

    def _sample_fields(self) -> dict[str, str]:
        if isinstance(self.partitions_def, dg.MultiPartitionsDefinition):
            return {"key": "'k'", **{d.name: "'k'" for d in self.partitions_def.partitions_defs}}
        if isinstance(self.partitions_def, dg.TimeWindowPartitionsDefinition):
            return {"key": "'k'", "start": "TIMESTAMP 's'", "end": "TIMESTAMP 'e'"}
        return {"key": "'k'"}

    def _fill(self, fields: Mapping[str, str]) -> str:
        return (self.template or "").format(**fields)


def _type_problem(dimension: dg.PartitionsDefinition, data_type: pa.DataType) -> str | None:
    """Why a column of this type cannot name these partitions, or None."""
    text = pa.types.is_string(data_type) or pa.types.is_large_string(data_type)
    if isinstance(dimension, dg.TimeWindowPartitionsDefinition):
        if text or pa.types.is_timestamp(data_type):
            return None
        if pa.types.is_date(data_type):
            first = dimension.get_first_partition_key()
            window = dimension.time_window_for_partition_key(first) if first else None
            if window and (not _is_midnight(window.start) or window.end - window.start < datetime.timedelta(days=1)):
                return "a date cannot bound partitions shorter than a day or not starting at midnight; use a timestamp"
            return None
        return "time-window partitions need a date, timestamp or string column"
    if text or pa.types.is_integer(data_type):
        return None
    return "partition keys need a string column (or an integer column for numeric keys)"


def _key_problem(key: str, data_type: pa.DataType) -> str | None:
    """Why `key` cannot name rows of a column of this type, or None: an integer column takes an
    integer written as `str(int(key))` writes it, and no other spelling of it.

    >>> _key_problem("10", pa.int64()), _key_problem("-3", pa.int8()), _key_problem("+10", pa.string())
    (None, None, None)
    >>> _key_problem("1_0", pa.int64()), _key_problem("two", pa.int64())
    ("another spelling of 10, whose key is '10' (two keys would select the same rows)", 'not an integer')
    """
    if not pa.types.is_integer(data_type) or _INTEGER_KEY.fullmatch(key):
        return None
    try:
        canonical = str(int(key))
    except ValueError:
        return "not an integer"
    return f"another spelling of {canonical}, whose key is {canonical!r} (two keys would select the same rows)"


def _value(key: str, column: str, data_type: pa.DataType) -> str:
    """The key as a literal of its column's type; raises PartitionKeyError when it cannot be one
    (the same words as `Partitioning.problems`, which says it of static keys when definitions load)."""
    problem = _key_problem(key, data_type)
    if problem:
        raise PartitionKeyError(f"field 'partition_column': partition key {key!r} cannot be written as a filter on "
                                f"column {column!r} ({data_type}): {problem}")
    return key if pa.types.is_integer(data_type) else literal(key)


def partitioning_of(options: Any, label: str) -> Partitioning | None:
    """The Function's partitioning from its options (None when it has no partitions_def)."""
    if options.partitions_def is None:
        if options.partition_column is not None or options.partition_filter is not None:
            raise FunctionDefinitionError(f"{label}: field 'partition_column': given without partitions_def")
        return None
    column = options.partition_column
    partitioning = Partitioning(options.partitions_def, dict(column) if isinstance(column, Mapping) else column,
                                options.partition_filter)
    partitioning.check(label)
    return partitioning


def _timestamp(value: Any, partitions_def: dg.TimeWindowPartitionsDefinition) -> float:
    """A date or timestamp value as the instant the partitions definition reads it at: a date at
    midnight and a timestamp without a timezone as wall time in the partitions' timezone."""
    from zoneinfo import ZoneInfo  # noqa: PLC0415 - only time partitions need it

    zone = ZoneInfo(partitions_def.timezone or "UTC")
    if isinstance(value, datetime.datetime):
        return (value if value.tzinfo else value.replace(tzinfo=zone)).timestamp()
    return datetime.datetime.combine(value, datetime.time(), tzinfo=zone).timestamp()


def keys_of_values(partitioning: Partitioning, rows: Mapping[str, Sequence[Any]], known: Sequence[str]) -> list[str]:
    """The partition keys of rows given by their partition column values (column -> values, row-aligned),
    among the `known` keys, in the known keys' order. Pure; for a column-named partitioning only.

    >>> daily = Partitioning(dg.DailyPartitionsDefinition("2026-01-01"), "day")
    >>> keys_of_values(daily, {"day": [datetime.date(2026, 1, 3), datetime.date(2026, 1, 2)] * 2},
    ...                ["2026-01-01", "2026-01-02", "2026-01-03"])
    ['2026-01-02', '2026-01-03']
    """
    def key(partitions_def: dg.PartitionsDefinition, value: Any) -> str | None:
        if value is None:
            return None
        if isinstance(partitions_def, dg.TimeWindowPartitionsDefinition) and not isinstance(value, str):
            return partitions_def.get_partition_key_for_timestamp(_timestamp(value, partitions_def))
        return str(value)

    found: set[str] = set()
    dims = partitioning._dimension_columns()
    columns = [list(rows[name]) for _, name in dims]
    for values in zip(*columns, strict=True):
        keys = [key(dim, value) for (dim, _), value in zip(dims, values, strict=True)]
        if any(k is None for k in keys):
            continue
        if isinstance(partitioning.partitions_def, dg.MultiPartitionsDefinition):
            names = [d.name for d in partitioning.partitions_def.partitions_defs]
            found.add(str(dg.MultiPartitionKey(dict(zip(names, keys, strict=True)))))
        else:
            found.add(keys[0])
    return [k for k in known if k in found]
