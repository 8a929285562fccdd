"""DRA device selection as the scheduler's allocator reads it: CEL selectors parsed, and matched
against the devices ResourceSlices publish. Pure: it reads the objects it is given (as the API sends
them, JSON), never the cluster.

Two uses. At load, a class's selectors are parsed (`cel_problem`) so a broken expression is refused
naming its class and field, in every process that loads the class files (no cluster needed). The
apiserver compiles them again, type-checked against its DRA environment, when the launcher creates a
run's claim templates (and on `gpufn classes --cluster`'s server-side dry-run). On a tick, the
capacity watcher counts each DRA class's devices per node (`matching_devices`) to tell a run that
waits for a device from one that never fits, and to give the class's gauges their capacity.

The expressions see what the Kubernetes DRA CEL environment gives them: `device.driver`,
`device.attributes[domain].name`, `device.capacity[domain].name` (a quantity: `compareTo`,
`isGreaterThan`, `isLessThan`, `asInteger`, `asApproximateFloat`; `quantity("80Gi")`), and
`device.allowMultipleAllocations`. An attribute name without a domain is the driver's.

>>> problem = cel_problem('device.attributes["gpu.nvidia.com"].productName ==')
>>> problem.splitlines()[0]
'a CEL syntax error at line 1, column 49'
>>> slice_ = {"spec": {"driver": "gpu.nvidia.com", "nodeName": "n1", "devices": [
...     {"name": "gpu-0", "attributes": {"productName": {"string": "NVIDIA H100 80GB HBM3"}},
...      "capacity": {"memory": {"value": "80Gi"}}}]}}
>>> matching_devices(['device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0'], [slice_])
DeviceCount(by_node={'n1': 1}, unsure=0)
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from .k8s_syntax import parse_quantity

# celpy logs every evaluation error at INFO, and a device without an attribute is an ordinary miss.
logging.getLogger("celpy").setLevel(logging.WARNING)


@functools.lru_cache(maxsize=1)
def _environment() -> Any:
    import celpy  # imported when a class names DRA selectors: most processes never need it

    return celpy.Environment()


def cel_problem(expression: str) -> str | None:
    """Why `expression` is not a CEL expression (None: it parses). A syntax check: what an attribute
    is named and what type it has the apiserver checks, when a claim with it is created."""
    from celpy import CELParseError

    if not expression.strip():
        return "an empty expression"
    try:
        _compiled(expression)
    except CELParseError as err:
        line, column = getattr(err, "line", None), getattr(err, "column", None)
        where = f" at line {line}, column {column}" if line is not None else ""
        return f"a CEL syntax error{where}\n{err}"
    except RecursionError:
        return "a CEL expression nested too deeply"
    return None


@functools.lru_cache(maxsize=512)
def _compiled(expression: str) -> Any:
    return _environment().compile(expression)


class _Quantity:
    """A Kubernetes quantity in CEL (`device.capacity[...]...`, `quantity("80Gi")`)."""

    def __init__(self, text: str):
        self.value: Decimal = parse_quantity(str(text))


def _sign(a: Any, b: Any) -> int:
    from celpy import celtypes

    return celtypes.IntType((a.value > b.value) - (a.value < b.value))


def _functions() -> dict[str, Any]:
    from celpy import celtypes

    return {
        "quantity": lambda text: _Quantity(str(text)),
        "compareTo": _sign,
        "isGreaterThan": lambda a, b: celtypes.BoolType(a.value > b.value),
        "isLessThan": lambda a, b: celtypes.BoolType(a.value < b.value),
        "asInteger": lambda a: celtypes.IntType(int(a.value)),
        "asApproximateFloat": lambda a: celtypes.DoubleType(float(a.value)),
    }


@functools.lru_cache(maxsize=512)
def _program(expression: str) -> Any:
    return _environment().program(_compiled(expression), functions=_functions())


def _attribute_value(value: Mapping[str, Any]) -> Any:
    from celpy import celtypes

    for kind, cast in (("string", celtypes.StringType), ("int", celtypes.IntType), ("bool", celtypes.BoolType),
                       ("version", celtypes.StringType)):
        if kind in value:
            return cast(value[kind])
    return None


def _by_domain(items: Mapping[str, Any], driver: str, value: Any) -> Any:
    from celpy import celtypes

    domains: dict[str, dict[Any, Any]] = {}
    for name, item in (items or {}).items():
        domain, _, short = name.rpartition("/")
        domains.setdefault(domain or driver, {})[celtypes.StringType(short)] = value(item)
    return celtypes.MapType({celtypes.StringType(d): celtypes.MapType(v) for d, v in domains.items()})


def device_activation(driver: str, device: Mapping[str, Any]) -> dict[str, Any]:
    """The `device` variable a selector sees for one device of a ResourceSlice (JSON)."""
    from celpy import celtypes

    return {"device": celtypes.MapType({
        celtypes.StringType("driver"): celtypes.StringType(driver),
        celtypes.StringType("attributes"): _by_domain(device.get("attributes") or {}, driver, _attribute_value),
        celtypes.StringType("capacity"): _by_domain(device.get("capacity") or {}, driver,
                                                    lambda c: _Quantity(str((c or {}).get("value", "0")))),
        celtypes.StringType("allowMultipleAllocations"): celtypes.BoolType(bool(device.get("allowMultipleAllocations"))),
    })}


def matches(expressions: Sequence[str], activation: Mapping[str, Any]) -> bool | None:
    """Whether a device passes every selector; None when one could not be evaluated for it (an
    attribute it lacks, a function this reading does not know): the allocator would not pick it."""
    from celpy import CELEvalError

    for expression in expressions:
        try:
            result = _program(expression).evaluate(activation)
        except (CELEvalError, TypeError, ValueError, KeyError, ArithmeticError):
            return None
        if isinstance(result, CELEvalError):
            return None
        if not result:
            return False
    return True


@dataclass(frozen=True)
class DeviceCount:
    """Devices passing a class's selectors, per node (`by_node`); `unsure`: devices for which some
    selector could not be evaluated here (not counted: the allocator gives no such device either,
    but a count with any is not proof that a request never fits)."""

    by_node: Mapping[str, int] = field(default_factory=dict)
    unsure: int = 0

    def most_on_one_node(self, nodes: Iterable[str] | None = None) -> int:
        """The most matching devices one node has (of `nodes`, when given)."""
        wanted = None if nodes is None else set(nodes)
        return max((n for node, n in self.by_node.items() if wanted is None or node in wanted), default=0)

    def total(self, nodes: Iterable[str] | None = None) -> int:
        wanted = None if nodes is None else set(nodes)
        return sum(n for node, n in self.by_node.items() if wanted is None or node in wanted)


def slice_devices(slices: Iterable[Mapping[str, Any]]) -> Iterable[tuple[str, str, Mapping[str, Any]]]:
    """(node, driver, device) for every device of node-local ResourceSlices (`spec.nodeName`); slices
    of network-attached devices (no node name) hold no GPU a worker pod can use on its node."""
    for item in slices:
        spec = item.get("spec") or {}
        node = spec.get("nodeName")
        if not node:
            continue
        for device in spec.get("devices") or []:
            yield node, spec.get("driver", ""), device


def matching_devices(expressions: Sequence[str], slices: Iterable[Mapping[str, Any]]) -> DeviceCount:
    """How many devices of `slices` pass every selector in `expressions` (a device class's and a
    GPU class's together), per node.

    A pool of a thousand 8-GPU nodes is 8,000 devices, and CEL here costs about 0.4 ms a device: a
    verdict is kept per device content (driver, attributes, capacity -- not its name, so a pool of
    one GPU model is evaluated once) and per slice version (`metadata.uid` and `resourceVersion`,
    which the API server changes with every update), so a watcher tick re-evaluates only what changed.
    """
    key = tuple(expressions)
    by_node: dict[str, int] = {}
    unsure = 0
    for item in slices:
        node, found, doubtful = _slice_count(key, item)
        if node is not None:
            if found:
                by_node[node] = by_node.get(node, 0) + found
            unsure += doubtful
    return DeviceCount(by_node, unsure)


_SLICE_COUNTS: dict[tuple[Any, ...], tuple[str | None, int, int]] = {}
_VERDICTS: dict[tuple[Any, ...], bool | None] = {}
_KEPT = 65536  # entries of each memo: past it, it starts afresh (a memo, never a source of truth)


def _slice_count(expressions: tuple[str, ...], item: Mapping[str, Any]) -> tuple[str | None, int, int]:
    """(node, devices passing, devices unsure) of one ResourceSlice, memoized per slice version."""
    metadata = item.get("metadata") or {}
    version = (metadata.get("uid"), metadata.get("resourceVersion"))
    key = (expressions, *version) if all(version) else None
    if key is not None and key in _SLICE_COUNTS:
        return _SLICE_COUNTS[key]
    found = doubtful = 0
    node = None
    for node, driver, device in slice_devices([item]):
        verdict = _verdict(expressions, driver, device)
        if verdict is None:
            doubtful += 1
        elif verdict:
            found += 1
    counted = (node, found, doubtful)
    if key is not None:
        if len(_SLICE_COUNTS) >= _KEPT:
            _SLICE_COUNTS.clear()
        _SLICE_COUNTS[key] = counted
    return counted


def _verdict(expressions: tuple[str, ...], driver: str, device: Mapping[str, Any]) -> bool | None:
    """`matches` for one device, memoized by what the selectors can see of it (not its name)."""
    content = json.dumps([driver, device.get("attributes"), device.get("capacity"),
                          bool(device.get("allowMultipleAllocations"))], sort_keys=True)
    key = (expressions, content)
    if key not in _VERDICTS:
        if len(_VERDICTS) >= _KEPT:
            _VERDICTS.clear()
        _VERDICTS[key] = matches(expressions, device_activation(driver, device))
    return _VERDICTS[key]


def device_class_selectors(device_class: Mapping[str, Any] | None) -> list[str]:
    """The CEL selectors of a DeviceClass object (JSON)."""
    return [s["cel"]["expression"] for s in ((device_class or {}).get("spec") or {}).get("selectors") or []
            if (s.get("cel") or {}).get("expression")]
