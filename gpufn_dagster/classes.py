"""GPU classes: the operator's named pools of GPU nodes, as models (pure). Their files are read by
`class_files`; what a Function's request of them accepts is `class_requests.accept`.

A class describes hardware and placement (what a worker may ask for and where it may run), never
live availability. Everything downstream -- Function validation, pod specs, local slots, capacity
waits -- reads these models, so they are strict: an unknown field, a bad toleration or a bad
quantity is refused naming the field (`class_files` adds the file and class).
"""

from __future__ import annotations

import difflib
import re
from datetime import timedelta
from typing import Annotated, Any, Literal

from pydantic import (AliasChoices, BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, field_validator,
                      model_validator)

from .device_cel import cel_problem
from .k8s_syntax import (dns_subdomain_problem, extended_resource_problem, label_value_problem, parse_quantity,
                         qualified_name_problem, quantity_problem)

DEFAULT_CLASS = "default"

# Class names go into labels and Dagster tags: a DNS label-like name (fullmatch: no trailing newline).
_CLASS_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?")
_DURATION = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(s|m|h|d)\s*$")
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_bytes(value: Any) -> Any:
    """Accept byte counts as integers or as '80GiB', '80Gi', '80GB', '512MiB' (Kubernetes units)."""
    if isinstance(value, str):
        text = value.strip()
        if text.endswith("B"):
            text = text[:-1]
        if problem := quantity_problem(text):
            raise ValueError(f"not a byte size: {value[:40]!r}: {problem} (use e.g. 80GiB or 85899345920)")
        try:
            quantity = parse_quantity(text)
        except (ValueError, ArithmeticError) as err:  # ArithmeticError: a Decimal out of range
            raise ValueError(f"not a byte size: {value!r} (use e.g. 80GiB or 85899345920)") from err
        if not quantity.is_finite() or quantity > 2**63 - 1:
            raise ValueError(f"not a byte size: {value!r} is larger than Kubernetes can count")
        return int(quantity)
    return value


def parse_duration(value: Any) -> Any:
    """Accept durations as seconds, ISO 8601, or '90s' / '30m' / '2h' / '1d'."""
    if isinstance(value, str) and (match := _DURATION.match(value)):
        try:
            return timedelta(seconds=float(match.group(1)) * _DURATION_UNITS[match.group(2)])
        except OverflowError as err:
            raise ValueError(f"{value!r} is longer than a duration can be (at most 999999999 days)") from err
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return timedelta(seconds=value)
        except (OverflowError, ValueError) as err:
            raise ValueError(f"{value!r} seconds is not a duration this can hold") from err
    return value


Bytes = Annotated[int, BeforeValidator(parse_bytes), Field(gt=0)]
Duration = Annotated[timedelta, BeforeValidator(parse_duration)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Toleration(_Strict):
    """A Kubernetes toleration, written out explicitly on every worker pod of the class."""

    key: str | None = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(
        default=None, ge=-(2**63), le=2**63 - 1,  # Kubernetes stores it as an int64
        validation_alias=AliasChoices("toleration_seconds", "tolerationSeconds")
    )

    @model_validator(mode="after")
    def _operator_value(self) -> Toleration:
        if self.operator == "Exists" and self.value:
            raise ValueError("operator Exists takes no value")
        if self.operator == "Equal" and not self.key:
            raise ValueError("operator Equal needs a key (only Exists may leave it empty, to tolerate every taint)")
        if self.key and (problem := qualified_name_problem(self.key)):
            raise ValueError(f"key {self.key!r}: {problem}")
        if self.value and (problem := label_value_problem(self.value)):
            raise ValueError(f"value {self.value!r}: {problem}")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("toleration_seconds applies only to effect NoExecute")
        return self

    def to_k8s(self) -> dict[str, Any]:
        """The toleration as dagster-k8s config and the Kubernetes client's models spell it (snake_case,
        no empty fields): the one converter, used for pods, step pods and fake nodes alike."""
        return self.model_dump(exclude_none=True)


class NodeSelectorRequirement(_Strict):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _values_match_operator(self) -> NodeSelectorRequirement:
        if problem := qualified_name_problem(self.key):
            raise ValueError(f"key {self.key!r}: {problem}")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no values")
        if self.operator not in ("Exists", "DoesNotExist") and not self.values:
            raise ValueError(f"operator {self.operator} needs values")
        if self.operator in ("Gt", "Lt") and (len(self.values) != 1 or not re.fullmatch(r"-?\d{1,18}", self.values[0])):
            raise ValueError(f"operator {self.operator} takes exactly one integer value")
        for value in self.values if self.operator in ("In", "NotIn") else ():
            if problem := label_value_problem(value):
                raise ValueError(f"value {value!r}: {problem}")
        return self


class NodeSelectorTerm(_Strict):
    """One required node-affinity term; a node must match every expression of some term."""

    match_expressions: list[NodeSelectorRequirement] = Field(
        min_length=1, validation_alias=AliasChoices("match_expressions", "matchExpressions")
    )


class WarmInstances(_Strict):
    """Embedded mode: how long a slot keeps a Function's loaded instance (its model on the slot's
    device) for the next step of the same Function version, and how much it may keep.

    `idle` is how long an instance no step used is kept (0 keeps none: every step loads anew);
    `memory` the most resident memory the slot's kept instances take together, and `instances`
    how many it keeps at most: the least recently used go first when a new one loads.

    >>> WarmInstances(idle="10m", memory="8GiB").idle.total_seconds(), WarmInstances().instances
    (600.0, 2)
    """

    idle: Duration = timedelta(minutes=10)
    memory: Bytes | None = None
    instances: int = Field(default=2, ge=1)

    @field_validator("idle")
    @classmethod
    def _not_negative(cls, value: timedelta) -> timedelta:
        if value.total_seconds() < 0:
            raise ValueError("must not be negative (0 keeps no instance)")
        return value


class LocalSlots(_Strict):
    """The embedded mode's capacity: how many GPU steps of this class may run at once here (the
    limit of the class's Dagster pool), the device each slot's step sees (`devices[slot % len]`
    as CUDA_VISIBLE_DEVICES; none set when empty), and how long a slot keeps loaded instances
    warm for the next step (`warm`)."""

    slots: int = Field(default=1, ge=0)
    devices: list[str] = Field(default_factory=list)
    warm: WarmInstances = Field(default_factory=WarmInstances)


def _kueue_name_problem(name: str) -> str | None:
    """Why `name` cannot name a Kueue object in a Job's label (None: it can)."""
    return label_value_problem(name) or ("empty" if not name else None)


class KueueQueue(_Strict):
    """Kueue mode: the class's run and step Jobs go to Kueue's `local_queue` (a LocalQueue in the
    Jobs' namespace), which suspends each Job until its ClusterQueue admits it.

    `priority_class` is the WorkloadPriorityClass of a run that sets no `dagster/priority` (0);
    `priority_classes` maps a `dagster/priority` threshold to a WorkloadPriorityClass: a run takes
    the class of the highest threshold at or below its priority, so Dagster's priority decides
    Kueue's (which orders the ClusterQueue and lets a higher class preempt a lower one).

    >>> q = KueueQueue(local_queue="gpu-l4", priority_class="gpu-normal",
    ...                priority_classes={10: "gpu-high", -10: "gpu-low"})
    >>> q.priority_class_for(0), q.priority_class_for(12), q.priority_class_for(-50)
    ('gpu-normal', 'gpu-high', 'gpu-low')
    """

    local_queue: str
    priority_class: str | None = None
    priority_classes: dict[int, str] = Field(default_factory=dict)
    # A DRA class's: the quota resource Kueue's `deviceClassMappings` counts its DeviceClass's devices as.
    device_resource: str | None = None

    @field_validator("device_resource")
    @classmethod
    def _device_resource(cls, value: str | None) -> str | None:
        if value is not None and (problem := qualified_name_problem(value)):
            raise ValueError(f"{value!r} is not a name Kueue's deviceClassMappings can give a quota resource: {problem}")
        return value

    @field_validator("local_queue", "priority_class")
    @classmethod
    def _object_name(cls, value: str | None) -> str | None:
        if value is not None and (problem := _kueue_name_problem(value)):
            raise ValueError(f"{value!r} is not a Kueue object name usable as a label value: {problem}")
        return value

    @field_validator("priority_classes")
    @classmethod
    def _priority_names(cls, value: dict[int, str]) -> dict[int, str]:
        for threshold, name in value.items():
            if problem := _kueue_name_problem(name):
                raise ValueError(f"priority {threshold}: {name!r} is not a WorkloadPriorityClass name: {problem}")
        return value

    def priority_class_for(self, run_priority: int) -> str | None:
        """The WorkloadPriorityClass of a run of `dagster/priority` `run_priority` (None: Kueue's default).

        `priority_class` counts as the class of threshold 0; a priority below every threshold
        takes the lowest one's class.
        """
        table = dict(self.priority_classes)
        if self.priority_class is not None:
            table.setdefault(0, self.priority_class)
        if not table:
            return None
        at_or_below = [t for t in table if t <= run_priority]
        return table[max(at_or_below) if at_or_below else min(table)]


class DraDevices(_Strict):
    """A class whose workers get their GPUs through Dynamic Resource Allocation: each GPU pod gets a
    ResourceClaim (from a template made with its run) for `count_per_gpu` devices per GPU of
    `device_class` that pass every CEL expression in `selectors` (with the DeviceClass's own).

    `extended_resource: true` says the device class has an `extendedResourceName` (KEP-5004) equal
    to the class's `resource_name`: pods keep asking for that resource, and the scheduler allocates
    the devices behind it. The selectors then belong on the DeviceClass, not here.

    >>> DraDevices(device_class="gpu.nvidia.com",
    ...            selectors=['device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3"']).count_per_gpu
    1
    """

    device_class: str
    selectors: list[str] = Field(default_factory=list, max_length=32)
    count_per_gpu: int = Field(default=1, ge=1, le=64)
    extended_resource: bool = False

    @field_validator("device_class")
    @classmethod
    def _device_class(cls, value: str) -> str:
        if problem := dns_subdomain_problem(value):
            raise ValueError(f"{value!r} is not a DeviceClass name: {problem}")
        return value

    @field_validator("selectors")
    @classmethod
    def _selectors(cls, value: list[str]) -> list[str]:
        for index, expression in enumerate(value):
            if len(expression) > 10 * 1024:  # the apiserver's limit on one selector
                raise ValueError(f"selector {index} is {len(expression)} characters; at most 10240")
            if problem := cel_problem(expression):
                raise ValueError(f"selector {index} {expression[:200]!r} is not CEL (parsed as the apiserver's CEL "
                                 f"grammar; the apiserver type-checks it when a claim is created): {problem}")
        return value

    @model_validator(mode="after")
    def _extended(self) -> DraDevices:
        if self.extended_resource and (self.selectors or self.count_per_gpu != 1):
            raise ValueError("extended_resource: true asks for the class's resource_name, which the DeviceClass "
                             "backs: selectors and count_per_gpu belong on the DeviceClass then, not here")
        return self


class GpuClass(_Strict):
    """A named pool of GPU nodes: where its workers run and what one worker may ask for."""

    name: str
    resource_name: str = "nvidia.com/gpu"
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    node_affinity: list[NodeSelectorTerm] = Field(default_factory=list)
    gpu_model: str
    gpu_memory_bytes: Bytes = Field(le=2**63 - 1, validation_alias=AliasChoices("gpu_memory_bytes", "gpu_memory"))
    max_gpu_count_per_worker: int = Field(ge=1, le=64)
    cpu: str | None = None
    memory: str | None = None
    price_per_gpu_hour: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    max_wait: Duration | None = None
    max_gpus_per_refresh: int | None = Field(default=None, ge=1)  # the most GPUs one refresh holds at once
    local: LocalSlots = Field(default_factory=LocalSlots)
    dra: DraDevices | None = None  # GPUs through a DRA claim instead of the extended resource
    kueue: KueueQueue | None = None  # Kueue mode: Jobs go to this LocalQueue and wait for its admission
    description: str | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _CLASS_NAME.fullmatch(value):
            raise ValueError("must be lowercase letters, digits, '-' or '.', at most 63 characters")
        return value

    @field_validator("resource_name")
    @classmethod
    def _resource_name(cls, value: str) -> str:
        if problem := extended_resource_problem(value):
            raise ValueError(f"{value!r} is not a Kubernetes extended resource name: {problem}")
        return value

    @field_validator("node_selector")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        for key, label in value.items():
            if problem := qualified_name_problem(key):
                raise ValueError(f"label key {key!r}: {problem}")
            if problem := label_value_problem(label):
                raise ValueError(f"label value {label!r} of {key!r}: {problem}")
        return value

    @field_validator("cpu", "memory")
    @classmethod
    def _quantity(cls, value: str | None) -> str | None:
        if value is not None and (problem := quantity_problem(value)):
            raise ValueError(f"{value!r}: {problem}")
        return value

    @field_validator("max_wait")
    @classmethod
    def _positive_wait(cls, value: timedelta | None) -> timedelta | None:
        if value is not None and value.total_seconds() <= 0:
            raise ValueError("must be positive")
        return value

    @field_validator("kueue")
    @classmethod
    def _kueue_counts_devices(cls, value: KueueQueue | None, info: ValidationInfo) -> KueueQueue | None:
        dra = info.data.get("dra")
        claims = dra is not None and not dra.extended_resource
        if value is not None and claims and value.device_resource is None:
            raise ValueError("device_resource is needed with a DRA claim: the quota resource that Kueue's "
                             "deviceClassMappings (in Kueue's Configuration) names this class's DeviceClass "
                             f"{dra.device_class!r} as -- its ClusterQueue gets quota of that resource, in devices")
        if value is not None and value.device_resource is not None and not claims:
            raise ValueError("device_resource is for a class that claims DRA devices (dra without "
                             "extended_resource); Kueue counts this class's resource_name")
        return value

    @property
    def claims_devices(self) -> bool:
        """Whether its GPU pods get their devices through a ResourceClaim (DRA), not a resource limit."""
        return self.dra is not None and not self.dra.extended_resource

    @property
    def requested_as(self) -> str:
        """What its pods ask for, in words: the extended resource, or the DRA device class claimed.

        >>> GpuClass(name="l4", gpu_model="L4", gpu_memory="24GiB", max_gpu_count_per_worker=2).requested_as
        'nvidia.com/gpu'
        """
        if self.dra is None:
            return self.resource_name
        if self.dra.extended_resource:
            return f"{self.resource_name} (backed by DRA device class {self.dra.device_class})"
        per_gpu = f", {self.dra.count_per_gpu} devices per GPU" if self.dra.count_per_gpu > 1 else ""
        return f"DRA device class {self.dra.device_class}{per_gpu}"

    def summary(self) -> dict[str, Any]:
        """The listing view: the attributes LanceDB's GPU-class documentation uses, plus placement."""
        return {
            "name": self.name,
            "resource_name": None if self.claims_devices else self.resource_name,
            "requested_as": self.requested_as,
            "gpu_model": self.gpu_model,
            "gpu_memory_bytes": self.gpu_memory_bytes,
            "max_gpu_count_per_worker": self.max_gpu_count_per_worker,
            "node_selector": dict(self.node_selector),
            "price_per_gpu_hour": self.price_per_gpu_hour,
            "max_wait_seconds": self.max_wait.total_seconds() if self.max_wait else None,
            "max_gpus_per_refresh": self.max_gpus_per_refresh,
            "local_slots": self.local.slots,
            "kueue_local_queue": self.kueue.local_queue if self.kueue else None,
            "dra": self.dra.model_dump() if self.dra else None,
        }


def suggestion(word: str, choices: list[str]) -> str:
    """' (did you mean 'x'?)' for the closest of `choices`, or '' when none is close.

    >>> suggestion("gpu_memroy", ["gpu_model", "gpu_memory", "cpu"])
    " (did you mean 'gpu_memory'?)"
    >>> suggestion("zzz", ["gpu_model"])
    ''
    """
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
