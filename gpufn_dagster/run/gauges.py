"""Gauges per GPU class, for Prometheus and the operator: capacity, use, who waits and for how long.

Built from the same decisions the waits are reported from -- the embedded coordinator's
`pools.step_waits` over Dagster's pool state, read when asked, or a capacity watcher tick's
decisions on Kubernetes, which each tick stores in the instance's key-value store (`store_gauges`;
what `gpufn serve` reads, wherever it runs) -- and written in Prometheus' text exposition format
(`gpufn serve`'s `/metrics`). Embedded, the unit is a local slot; on Kubernetes, a GPU of the
class's resource. Pure but for those two small reads and writes of the instance.

Example:
    >>> from gpufn_dagster.run.pools import step_waits
    >>> waits = step_waits("l4", [("r2", "emb", 100.0, 0)], [("r1", "emb")])
    >>> (g,) = embedded_gauges({"l4": 1}, waits, {"l4": 1}, now=130.0)
    >>> (g.capacity, g.in_use, g.steps_waiting, g.runs_waiting, g.longest_wait_seconds)
    (1, 1, 1, 1, 30.0)
    >>> print(prometheus_text([g]).splitlines()[2])
    gpufn_gpu_class_capacity{gpu_class="l4",unit="slot"} 1
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

import dagster as dg

from ..tags import CLASS_GAUGES_KEY, CLASS_LABEL, CLASSES_ANNOTATION, COUNT_LABEL, GOT_CLASS_ANNOTATION
from .pools import StepWait


@dataclass(frozen=True)
class ClassGauges:
    """One class's gauges at one moment."""

    gpu_class: str
    unit: Literal["slot", "gpu"]  # embedded: local slots; Kubernetes: GPUs of the class's resource
    capacity: int  # slots, or allocatable GPUs over the class's nodes
    in_use: int  # slots claimed, or GPUs of the class's GPU run and shard pods placed on a node
    steps_waiting: int  # GPU steps waiting for a slot, or GPU run and shard pods not placed yet
    runs_waiting: int
    longest_wait_seconds: float


def embedded_gauges(slots: Mapping[str, int], waits: Iterable[StepWait], claimed: Mapping[str, int],
                    now: float) -> list[ClassGauges]:
    """Each class's gauges from its local slots, the waiting steps and the slots claimed now."""
    by_class: dict[str, list[StepWait]] = {name: [] for name in slots}
    for wait in waits:
        by_class.setdefault(wait.gpu_class, []).append(wait)
    return [ClassGauges(name, "slot", slots.get(name, 0), claimed.get(name, 0), len(line),
                        len({w.run_id for w in line}), max((now - w.since for w in line), default=0.0))
            for name, line in sorted(by_class.items())]


# Each family: its help text, and the figure of a class's gauges it reports.
_FAMILIES: dict[str, tuple[str, Callable[[ClassGauges], float]]] = {
    "capacity": ("Slots (embedded) or GPUs (Kubernetes) the GPU class has in all.", lambda g: g.capacity),
    "in_use": ("Slots claimed, or GPUs of the class's GPU run and shard pods placed on a node.", lambda g: g.in_use),
    "steps_waiting": ("GPU steps waiting for a slot, or GPU run and shard pods of the class not placed yet.",
                      lambda g: g.steps_waiting),
    "runs_waiting": ("Runs with a GPU step or pod waiting for the class.", lambda g: g.runs_waiting),
    "longest_wait_seconds": ("How long the longest waiter of the class has waited.",
                             lambda g: round(g.longest_wait_seconds, 3)),
}


def prometheus_text(gauges: Iterable[ClassGauges], age_seconds: float | None = None) -> str:
    """The gauges in Prometheus' text exposition format (version 0.0.4), one family per figure;
    `age_seconds`: how old a stored tick's gauges are (said as a gauge of its own)."""
    gauges = list(gauges)
    lines: list[str] = []
    for name, (text, value) in _FAMILIES.items():
        family = f"gpufn_gpu_class_{name}"
        lines += [f"# HELP {family} {text}", f"# TYPE {family} gauge"]
        lines += [f'{family}{{gpu_class="{_escape(g.gpu_class)}",unit="{g.unit}"}} {value(g)}' for g in gauges]
    if age_seconds is not None:
        lines += ["# HELP gpufn_gpu_class_gauges_age_seconds Seconds since the capacity tick that observed these gauges.",
                  "# TYPE gpufn_gpu_class_gauges_age_seconds gauge", f"gpufn_gpu_class_gauges_age_seconds {age_seconds:.1f}"]
    return "\n".join(lines) + "\n"


def store_gauges(instance: Any, gauges: Iterable[ClassGauges], now: float) -> None:
    """Keep a watcher tick's gauges where `/metrics` reads them (any process on the same instance)."""
    instance.run_storage.set_cursor_values({CLASS_GAUGES_KEY: json.dumps(
        {"observed_at": now, "classes": [asdict(g) for g in gauges]})})


def stored_gauges(instance: Any) -> tuple[list[ClassGauges], float] | None:
    """The last tick's gauges and when it observed them (None: no tick stored any yet)."""
    text = instance.run_storage.get_cursor_values({CLASS_GAUGES_KEY}).get(CLASS_GAUGES_KEY)
    if not text:
        return None
    data = json.loads(text)
    return [ClassGauges(**g) for g in data["classes"]], float(data["observed_at"])


def pod_counts(pods: Iterable[Any]) -> dict[str, tuple[int, int]]:
    """Per class, from the GPU pods of runs (a run's pod or a shard's, labelled with their class and
    GPU count): (GPUs of the pods placed on a node and not finished, pods not placed yet).

    >>> from types import SimpleNamespace as O
    >>> def pod(node, phase="Running", cls="l4", n="2"):
    ...     return O(metadata=O(labels={CLASS_LABEL: cls, COUNT_LABEL: n}, annotations=None), spec=O(node_name=node),
    ...              status=O(phase=phase))
    >>> pod_counts([pod("n1"), pod(None, "Pending"), pod("n2", "Succeeded"), pod(None, "Pending", "a100", "1")])
    {'l4': (2, 1), 'a100': (0, 1)}
    """
    counts: dict[str, list[int]] = {}
    for pod in pods:
        labels = pod.metadata.labels or {}
        if CLASS_LABEL not in labels or pod.status.phase in ("Succeeded", "Failed"):
            continue
        # a pod accepting several classes counts on their choice's line until the watcher noted the one it got
        annotations = pod.metadata.annotations or {}
        entry = counts.setdefault(annotations.get(GOT_CLASS_ANNOTATION) or annotations.get(CLASSES_ANNOTATION)
                                  or labels[CLASS_LABEL], [0, 0])
        if pod.spec.node_name:
            entry[0] += int(labels.get(COUNT_LABEL, "1"))
        else:
            entry[1] += 1
    return {name: (placed, waiting) for name, (placed, waiting) in counts.items()}


CAPACITY_SENSOR = "gpu_capacity"  # the capacity sensor's name (`watch.capacity_sensor`)
CAPACITY_GROUP = "gpu_capacity"  # the asset group (and key prefix) of the classes' capacity assets


def capacity_asset_key(gpu_class: str) -> dg.AssetKey:
    """The external asset whose observations carry the class's gauges: `gpu_capacity/<class>`."""
    return dg.AssetKey([CAPACITY_GROUP, gpu_class])


def capacity_specs(class_names: Iterable[str]) -> list[dg.AssetSpec]:
    """One external asset per class, so the capacity sensor's observations of it show (and plot)
    on its asset page."""
    return [dg.AssetSpec(capacity_asset_key(name), group_name=CAPACITY_GROUP, kinds={"gpu"},
                         description=f"GPU class {name!r}: its capacity, use and waits, observed by each gpu_capacity "
                                     "sensor tick.") for name in sorted(class_names)]


def observations(gauges: Iterable[ClassGauges]) -> list[dg.AssetObservation]:
    """A tick's gauges as asset observations, one per class (what the sensor's tick records).

    >>> g = ClassGauges("l4", "gpu", 8, 6, 3, 2, 41.5)
    >>> sorted(observations([g])[0].metadata)
    ['capacity', 'in_use', 'longest_wait_seconds', 'runs_waiting', 'steps_waiting', 'unit']
    """
    return [dg.AssetObservation(capacity_asset_key(g.gpu_class), metadata={
        "unit": g.unit, "capacity": dg.IntMetadataValue(g.capacity), "in_use": dg.IntMetadataValue(g.in_use),
        "steps_waiting": dg.IntMetadataValue(g.steps_waiting), "runs_waiting": dg.IntMetadataValue(g.runs_waiting),
        "longest_wait_seconds": dg.FloatMetadataValue(round(g.longest_wait_seconds, 1))}) for g in gauges]


def _escape(label: str) -> str:
    return label.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
