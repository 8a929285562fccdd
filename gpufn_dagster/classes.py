"""GPU classes: the operator's named pools of GPU nodes, loaded from one YAML file per class.

A class describes hardware and placement (what a worker may ask for and where it may run), never
live availability. Everything downstream -- Function validation, pod specs, local slots, capacity
waits -- reads these models, so loading is strict: an unknown field, a bad toleration or a
duplicate name rejects the whole directory with a message naming file, class and field, and
nothing is half-loaded.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
import typing
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from .errors import ClassRequestError, GpuClassError
from .tags import choice_request, class_choice
from .k8s_syntax import (extended_resource_problem, label_value_problem, parse_quantity, qualified_name_problem,
                         quantity_problem)

DEFAULT_CLASS = "default"
CLASSES_DIR_ENV = "GPUFN_CLASSES_DIR"
# Bounds on what one class file may be: a class is a few dozen lines, so anything past these is
# a mistake or an attack (a YAML alias bomb expands 1 KB into gigabytes).
MAX_FILE_BYTES = 64 * 1024
MAX_ALIASES = 64
MAX_DEPTH = 32

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

    def summary(self) -> dict[str, Any]:
        """The listing view: the attributes LanceDB's GPU-class documentation uses, plus placement."""
        return {
            "name": self.name,
            "resource_name": self.resource_name,
            "gpu_model": self.gpu_model,
            "gpu_memory_bytes": self.gpu_memory_bytes,
            "max_gpu_count_per_worker": self.max_gpu_count_per_worker,
            "node_selector": dict(self.node_selector),
            "price_per_gpu_hour": self.price_per_gpu_hour,
            "max_wait_seconds": self.max_wait.total_seconds() if self.max_wait else None,
            "max_gpus_per_refresh": self.max_gpus_per_refresh,
            "local_slots": self.local.slots,
            "kueue_local_queue": self.kueue.local_queue if self.kueue else None,
        }


ClassesDir = str | os.PathLike[str] | None
# A Function's GPU classes, first choice first, as the class files are when it is called (empty: a
# CPU Function). Steps read them when they run, so a class file edited after the code loaded
# governs the next run.
ClassNow = Callable[[], "tuple[GpuClass, ...]"]


def accept(request: str | Sequence[str], count: int | None, classes: Mapping[str, GpuClass], *,
           lenient: bool = False) -> tuple[GpuClass, ...]:
    """The classes a GPU request accepts, first choice first: the one rule of what a Function may ask
    for, which its load, its steps and the launcher all apply.

    `request` is class names in order of preference, or their request text (`tags.choice_request`: a
    tag, a pool, an annotation). Refused with a `ClassRequestError` naming the field: no class, a
    class named twice, an unknown class, a `count` below 1 or above a class's
    `max_gpu_count_per_worker`, classes naming different GPU resources (one pod asks for one
    resource whichever pool it lands on), and classes in Kueue mode mixed with classes not (Kueue
    admits a Job on one ClusterQueue's flavors, or the scheduler places it, never both).

    `lenient` reads back a request made earlier (a run's tag, a pod's annotation), when the classes
    may have changed since: () when one of its classes is not a class now, and no other check.

    >>> l4 = GpuClass(name="l4", gpu_model="L4", gpu_memory="24GiB", max_gpu_count_per_worker=1)
    >>> [c.name for c in accept("l4", 1, {"l4": l4})], accept("l4|t4", None, {"l4": l4}, lenient=True)
    (['l4'], ())
    >>> accept(["l4"], 2, {"l4": l4})
    Traceback (most recent call last):
    ...
    gpufn_dagster.errors.ClassRequestError: field 'gpu_count': 2 GPUs exceeds class 'l4''s max_gpu_count_per_worker of 1
    """
    names = class_choice(request) if isinstance(request, str) else tuple(request)
    if lenient:
        found = tuple(classes.get(name) for name in names)
        return found if names and all(found) else ()
    if not names:
        raise ClassRequestError("gpu_class", "no GPU class named")
    if len(set(names)) < len(names):
        raise ClassRequestError("gpu_class", f"{list(names)} names a class twice")
    accepted: list[GpuClass] = []
    for name in names:
        if name not in classes:
            raise ClassRequestError("gpu_class", f"unknown GPU class {name!r}{suggestion(name, sorted(classes))}; "
                                                 f"configured classes: {', '.join(sorted(classes))}")
        gpu_class = classes[name]
        if count is not None and count > gpu_class.max_gpu_count_per_worker:
            raise ClassRequestError("gpu_count", f"{count} GPUs exceeds class {name!r}'s max_gpu_count_per_worker of "
                                                 f"{gpu_class.max_gpu_count_per_worker}")
        if accepted and gpu_class.resource_name != accepted[0].resource_name:
            raise ClassRequestError("gpu_class", f"classes {accepted[0].name!r} ({accepted[0].resource_name}) and "
                                                 f"{name!r} ({gpu_class.resource_name}) name different GPU resources; "
                                                 "the classes accepted together must share one, since their pod asks "
                                                 "for one whichever pool it lands on")
        accepted.append(gpu_class)
    if count is not None and count < 1:
        raise ClassRequestError("gpu_count", f"GPU count must be at least 1, got {count}")
    if len({c.kueue is None for c in accepted}) > 1:
        raise ClassRequestError("gpu_class", f"of the classes accepted together, "
                                             f"{', '.join(repr(c.name) for c in accepted if c.kueue)} are in Kueue mode "
                                             f"and {', '.join(repr(c.name) for c in accepted if not c.kueue)} not; "
                                             "accept classes all in Kueue mode (Kueue admits the Job on the first "
                                             "with quota) or none")
    return tuple(accepted)


def choice_view(accepted: tuple[GpuClass, ...]) -> GpuClass:
    """Classes a Function accepts in order, seen as the one line its steps and pods wait in: named
    by their request (`tags.choice_request`), their local slots together, everything else the first
    class's (its max_wait, its resource). One class is itself.

    >>> l4 = GpuClass(name="l4", gpu_model="L4", gpu_memory="24GiB", max_gpu_count_per_worker=1, local={"slots": 2})
    >>> t4 = GpuClass(name="t4", gpu_model="T4", gpu_memory="16GiB", max_gpu_count_per_worker=1, local={"slots": 1})
    >>> view = choice_view((t4, l4))
    >>> view.name, view.local.slots, choice_view((l4,)) is l4
    ('t4|l4', 3, True)
    """
    if len(accepted) == 1:
        return accepted[0]
    first = accepted[0]
    return first.model_copy(update={"name": choice_request([c.name for c in accepted]), "local": first.local.model_copy(
        update={"slots": sum(c.local.slots for c in accepted)})})


def resolve_classes_dir(classes_dir: ClassesDir = None) -> Path:
    """Where class files live: the argument, else $GPUFN_CLASSES_DIR, else ./classes.

    >>> str(resolve_classes_dir("/opt/gpufn/classes"))
    '/opt/gpufn/classes'
    """
    return Path(classes_dir or os.environ.get(CLASSES_DIR_ENV) or "classes")


def _field_names(model: type[BaseModel]) -> list[str]:
    """The names a model's fields may be written as (their names and aliases)."""
    names = []
    for name, info in model.model_fields.items():
        names.append(name)
        alias = info.validation_alias
        names += [a for a in alias.choices if isinstance(a, str)] if isinstance(alias, AliasChoices) else []
    return list(dict.fromkeys(names))


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model whose field an error location names (GpuClass, or a nested one such as Toleration)."""
    model: Any = GpuClass
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        info = model.model_fields.get(part) if isinstance(model, type) and issubclass(model, BaseModel) else None
        if info is None:
            return None
        model = next((arg for arg in [info.annotation, *typing.get_args(info.annotation)]
                      if isinstance(arg, type) and issubclass(arg, BaseModel)), None)
        if model is None:
            return None
    return model


def suggestion(word: str, choices: list[str]) -> str:
    """' (did you mean 'x'?)' for the closest of `choices`, or '' when none is close.

    >>> suggestion("gpu_memroy", ["gpu_model", "gpu_memory", "cpu"])
    " (did you mean 'gpu_memory'?)"
    >>> suggestion("zzz", ["gpu_model"])
    ''
    """
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _format_error(file: Path, class_name: str, err: ValidationError) -> list[str]:
    lines = []
    for item in err.errors():
        loc = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in item["loc"]).replace(".[", "[")
        message = item["msg"]
        if item["type"] == "extra_forbidden" and (model := _model_at(item["loc"])) is not None:
            message = f"unknown field{suggestion(str(item['loc'][-1]), _field_names(model))}; fields: " \
                      f"{', '.join(model.model_fields)}"
        lines.append(f"{file}: class {class_name!r}: field {loc or '(class)'!r}: {message}")
    return lines


class _HugeInteger:
    """An integer literal with more digits than Python converts (sys.int_info's 4300): no class field
    takes one, so loading keeps it as this marker and names its field instead of failing the file."""

    def __init__(self, digits: int):
        self.digits = digits


def _huge_integers(value: Any, path: str = "") -> list[tuple[str, int]]:
    """(field path, digits) of every `_HugeInteger` in the parsed YAML."""
    if isinstance(value, _HugeInteger):
        return [(path or "(class)", value.digits)]
    if isinstance(value, dict):
        return [hit for key, item in value.items() for hit in _huge_integers(item, f"{path}.{key}" if path else str(key))]
    if isinstance(value, list):
        return [hit for i, item in enumerate(value) for hit in _huge_integers(item, f"{path}[{i}]")]
    return []


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing alias expansion and nesting past small bounds."""

    def construct_yaml_int(self, node: yaml.ScalarNode) -> Any:
        try:
            return super().construct_yaml_int(node)
        except ValueError:  # more digits than Python converts to an int
            return _HugeInteger(sum(c.isdigit() for c in node.value))

    def __init__(self, stream: str):
        super().__init__(stream)
        self._aliases = 0
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise yaml.YAMLError(f"more than {MAX_ALIASES} aliases (*name): refused, a class needs few or none")
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.YAMLError(f"nested deeper than {MAX_DEPTH} levels: refused")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)


def class_files(classes_dir: Path) -> list[Path]:
    """The class files of a directory: `*.yaml` and `*.yml`, hidden ones (editor lock files) left out."""
    return sorted(f for f in [*classes_dir.glob("*.yaml"), *classes_dir.glob("*.yml")] if not f.name.startswith("."))


def _read(file: Path) -> tuple[Any, str | None]:
    """The parsed YAML of one class file, or why it cannot be read (never an exception)."""
    if not file.is_file():
        return None, "not a readable file (a directory, or a symbolic link to nothing)"
    try:
        size = file.stat().st_size
        if size > MAX_FILE_BYTES:
            return None, f"{size:,} bytes; a class file may hold at most {MAX_FILE_BYTES:,}"
        data = file.read_bytes()
    except OSError as err:
        return None, f"cannot be read: {err.strerror or err}"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        return None, f"not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start})"
    try:
        loader = _BoundedLoader(text)
        try:
            return loader.get_single_data(), None
        finally:
            loader.dispose()
    except yaml.YAMLError as err:
        return None, f"not valid YAML: {err}"
    except (ValueError, RecursionError, OverflowError) as err:
        return None, f"not valid YAML: {str(err)[:200]}"


def _name_of(raw: dict, file: Path) -> str:
    name = raw.get("name", file.stem)
    return name if isinstance(name, str) and len(name) <= 100 else file.stem


def load_gpu_classes(classes_dir: ClassesDir = None) -> dict[str, GpuClass]:
    """Load and validate every class file in the directory, or raise GpuClassError listing all problems.

    Args:
        classes_dir: the directory of class files (default `$GPUFN_CLASSES_DIR`, else `./classes`).
    """
    directory = resolve_classes_dir(classes_dir)
    if not directory.is_dir():
        raise GpuClassError(f"{directory}: GPU class directory not found (set {CLASSES_DIR_ENV})")
    problems: list[str] = []
    loaded: dict[str, tuple[Path, GpuClass]] = {}
    for file in class_files(directory):
        raw, problem = _read(file)
        if problem is not None:
            problems.append(f"{file}: {problem}")
            continue
        if not isinstance(raw, dict):
            problems.append(f"{file}: expected one class as a mapping of fields, got {type(raw).__name__}")
            continue
        class_name = _name_of(raw, file)
        if huge := _huge_integers(raw):
            problems.extend(f"{file}: class {class_name!r}: field {path!r}: an integer of {digits:,} digits, larger "
                            "than any value a class field takes" for path, digits in huge)
            continue
        try:
            gpu_class = GpuClass.model_validate(raw)
        except ValidationError as err:
            problems.extend(_format_error(file, class_name, err))
            continue
        if gpu_class.name in loaded:
            problems.append(
                f"{file}: class {gpu_class.name!r}: field 'name': duplicate, also defined in {loaded[gpu_class.name][0]}"
            )
            continue
        loaded[gpu_class.name] = (file, gpu_class)
    if not problems and DEFAULT_CLASS not in loaded:
        problems.append(f"{directory}: no class named {DEFAULT_CLASS!r}; Functions that name no class need one")
    if problems:
        raise GpuClassError("invalid GPU classes:\n  " + "\n  ".join(problems))
    return {name: gpu_class for name, (_, gpu_class) in loaded.items()}


def _directory_stamp(classes_dir: Path) -> tuple:
    stamps = []
    for f in class_files(classes_dir):
        try:
            stat = f.stat()
            stamps.append((f.name, stat.st_mtime_ns, stat.st_size))
        except OSError:  # a symbolic link to nothing: loading reports it
            stamps.append((f.name, 0, -1))
    return tuple(stamps)


@functools.lru_cache(maxsize=16)
def _cached(classes_dir: str, _stamp: tuple) -> dict[str, GpuClass]:
    return load_gpu_classes(classes_dir)


def cached_gpu_classes(classes_dir: ClassesDir = None) -> dict[str, GpuClass]:
    """load_gpu_classes, re-read only when a class file changed (launchers call this per run)."""
    directory = resolve_classes_dir(classes_dir)
    if not directory.is_dir():
        return load_gpu_classes(directory)  # raises the not-found error
    return _cached(str(directory.resolve()), _directory_stamp(directory))


def list_gpu_classes(classes_dir: ClassesDir = None) -> list[GpuClass]:
    """The configured GPU classes, sorted by name.

    Args:
        classes_dir: the directory of class files (default `$GPUFN_CLASSES_DIR`, else `./classes`).
    """
    return sorted(load_gpu_classes(classes_dir).values(), key=lambda c: c.name)
