"""``--set KEY=VALUE``: changes to a job spec given on the command line of ``submit``, ``resume`` and
``validate``. Torch-free.

``KEY`` is a dotted path into the spec (``resources.timeout_min``, ``config.epochs``,
``env.OMP_NUM_THREADS``); ``VALUE`` is one YAML scalar (``40``, ``0.5``, ``true``, ``null``, ``gpu``,
``'"01"'`` for a string of digits), read with the safe loader. The result is validated by the same
model as a spec file, with the same messages. A path that names no field is refused by name; under
the free-form mappings (``config``, ``env``, ``slurm.additional``) any key may be added. A relative
``workdir`` or ``run_dir`` given here is relative to the current directory, like any path typed on a
command line.

>>> spec = load_spec_with("job.yaml", ["config.epochs=40", "slurm.partition=long"])  # doctest: +SKIP
"""

from __future__ import annotations

import copy
import os
import re
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from .loading import read_spec_data, validate_spec_data
from .models import JobSpec, SpecError
from .sections import section_model

MAX_VALUE_CHARS = 4096
# Mappings whose keys the user chooses: --set may add keys there.
FREE_FORM = frozenset({("config",), ("env",), ("slurm", "additional")})
PATH_FIELDS = frozenset({("workdir",), ("run_dir",)})
_KEY_PART = re.compile(r"[A-Za-z0-9_-]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class Override:
    """One ``--set``: the dotted path, split, and the parsed value."""

    text: str
    path: tuple[str, ...]
    value: Any

    @property
    def key(self) -> str:
        return ".".join(self.path)


def parse_override(text: str) -> Override:
    """``"config.epochs=40"`` -> ``Override(path=("config", "epochs"), value=40)``; SpecError when malformed."""
    key, separator, raw = text.partition("=")
    if not separator:
        raise SpecError(f"--set {text!r}: no '='; write --set KEY=VALUE, e.g. --set config.epochs=40")
    path = tuple(key.strip().split("."))
    if not all(_KEY_PART.fullmatch(part) for part in path):
        raise SpecError(f"--set {text!r}: {key!r} is not a dotted field path (letters, digits, '_' and '-' between "
                        "dots); write e.g. --set resources.timeout_min=30")
    if len(raw) > MAX_VALUE_CHARS:
        raise SpecError(f"--set {key}: the value has {len(raw)} characters, more than {MAX_VALUE_CHARS}; "
                        "put long values in the spec file")
    if _CONTROL.search(raw):
        raise SpecError(f"--set {key}: the value contains a control character (a newline, tab or escape); "
                        "give a single-line value without them")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as error:
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise SpecError(f"--set {key}={raw}: not a YAML scalar ({problem}); quote a string: "
                        f"--set '{key}=\"...\"'") from None
    if isinstance(value, (dict, list)):
        raise SpecError(f"--set {key}={raw}: a {type(value).__name__}, not a single value; --set takes one scalar "
                        f"(a number, true/false, null or a string): {_instead_of_a_collection(path, value)}")
    if path in PATH_FIELDS and isinstance(value, str) and value.strip():
        value = os.path.abspath(os.path.expanduser(value))
    elif not isinstance(value, (str, int, float, bool, type(None))):
        value = raw  # a date or timestamp: kept as the text typed
    return Override(text=text, path=path, value=value)


def parse_overrides(texts: Sequence[str]) -> list[Override]:
    """Every ``--set`` in order; the same KEY twice is refused."""
    overrides = [parse_override(text) for text in texts]
    seen: dict[str, str] = {}
    for override in overrides:
        if override.key in seen:
            raise SpecError(f"--set {override.key} is given twice ({seen[override.key]!r} and {override.text!r}); "
                            "give it once")
        seen[override.key] = override.text
    return overrides


def _section_model(path: tuple[str, ...]) -> type[BaseModel] | None:
    """The model a path of sections leads to (``("resources",)`` -> Resources), or None."""
    model: type[BaseModel] = JobSpec
    for part in path:
        field = model.model_fields.get(part)
        section = section_model(field.annotation) if field is not None else None
        if section is None:
            return None
        model = section
    return model


def _instead_of_a_collection(path: tuple[str, ...], value: dict[str, Any] | list[Any]) -> str:
    """What to give for ``path`` instead of the list or mapping ``value``: what its field takes."""
    key = ".".join(path)
    section = _section_model(path)
    if section is not None:
        return (f"{key} is a section: set its fields one by one (--set {key}.FIELD=VALUE; its fields are: "
                f"{', '.join(section.model_fields)})")
    if any(path[:depth] in FREE_FORM for depth in range(1, len(path) + 1)):
        if isinstance(value, dict):
            return f"set its keys one by one (--set {key}.NAME=VALUE) or edit the spec file"
        return f"write a list under {key} in the spec file"
    parent = _section_model(path[:-1])
    field = parent.model_fields.get(path[-1]) if parent is not None else None
    if field is None:
        return "edit the spec file"
    if _holds_a_list(field.annotation):
        return f"{key} is a list: write it in the spec file"
    example = field.default if isinstance(field.default, (int, float, str)) else "VALUE"
    return f"{key} takes one value; give it alone, e.g. --set {key}={example}"


def _holds_a_list(annotation: Any) -> bool:
    """Whether a field's type is a list (or a list or None)."""
    return typing.get_origin(annotation) in (list, tuple) or any(
        typing.get_origin(member) in (list, tuple) for member in typing.get_args(annotation))


def _check_known(override: Override) -> None:
    """Refuse a path that names no field of the spec (free-form mappings take any key)."""
    path = override.path
    for depth in range(len(path)):
        if path[:depth] in FREE_FORM:
            return
        model = _section_model(path[:depth])
        if model is None:
            return  # below a plain field: the model reports the type
        if path[depth] not in model.model_fields:
            where = ".".join(path[:depth]) or "a job spec"
            raise SpecError(f"--set {override.key}: {where} has no field {path[depth]!r}; its fields are: "
                            f"{', '.join(model.model_fields)}")


def apply_overrides(data: Mapping[str, Any], overrides: Sequence[Override]) -> dict[str, Any]:
    """A copy of the spec mapping ``data`` with each override set at its path."""
    result = copy.deepcopy(dict(data))
    for override in overrides:
        _check_known(override)
        holder: dict[str, Any] = result
        for depth, part in enumerate(override.path[:-1]):
            child = holder.get(part)
            if child is None:
                child = holder[part] = {}
            if not isinstance(child, dict):
                where = ".".join(override.path[: depth + 1])
                raise SpecError(f"--set {override.key}: {where} is {child!r}, not a mapping; set {where} itself")
            holder = child
        holder[override.path[-1]] = override.value
    return result


def describe_source(source: Path | str, overrides: Sequence[Override]) -> str:
    """How messages name a spec changed by ``--set``: ``job.yaml (with --set config.epochs=40)``."""
    if not overrides:
        return str(source)
    return f"{source} (with {' '.join('--set ' + override.text for override in overrides)})"


def load_spec_with(path: str | os.PathLike[str], sets: Sequence[str] = (), *, check_files: bool = True) -> JobSpec:
    """``load_spec`` with ``--set`` texts applied before validation (SpecError naming the field)."""
    path = Path(path)
    overrides = parse_overrides(sets)
    data = apply_overrides(read_spec_data(path), overrides)
    return validate_spec_data(data, source=describe_source(path, overrides), base=path.absolute().parent,
                              check_files=check_files)
