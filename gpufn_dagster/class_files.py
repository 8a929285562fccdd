"""The operator's GPU class directory: one YAML file per class, loaded strictly, cached per change.

Loading is strict: an unknown field, a bad toleration or a duplicate name rejects the whole
directory with a message naming file, class and field, and nothing is half-loaded. A file is read
within bounds (size, aliases, depth, integer digits), so a hostile file is an error, never a hang.
"""

from __future__ import annotations

import functools
import os
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import AliasChoices, BaseModel, ValidationError

from .classes import DEFAULT_CLASS, GpuClass, suggestion
from .errors import GpuClassError

CLASSES_DIR_ENV = "GPUFN_CLASSES_DIR"
# Bounds on what one class file may be: a class is a few dozen lines, so anything past these is
# a mistake or an attack (a YAML alias bomb expands 1 KB into gigabytes).
MAX_FILE_BYTES = 64 * 1024
MAX_ALIASES = 64
MAX_DEPTH = 32

ClassesDir = str | os.PathLike[str] | None


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


def _format_error(file: Path, class_name: str, err: ValidationError) -> list[str]:
    lines = []
    for item in err.errors():
        loc = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in item["loc"]).replace(".[", "[")
        message = item["msg"].removeprefix("Value error, ")  # pydantic's words for a validator's ValueError
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
