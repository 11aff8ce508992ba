"""Messages of a spec that does not validate: one line per problem naming the file, the field by its
dotted path, the value given, what is allowed there (from the schema's descriptions) and the fix.

Torch-free. launcher/spec/loading.py raises them as :class:`~launcher.spec.models.SpecError`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from .models import JobSpec
from .sections import ENTRYPOINT_PATTERN, NAME_PATTERN, section_model

_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+")


def field_path(loc: Sequence[str | int]) -> str:
    """``("resources", "gpus_per_node")`` -> ``"resources.gpus_per_node"``; list items as ``command[2]``,
    keys that are not plain words quoted (``slurm.additional["mail type"]``)."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif not _PLAIN_KEY.fullmatch(str(part)):
            text += f"[{json.dumps(str(part))}]" if text else json.dumps(str(part))
        else:
            text += f".{part}" if text else str(part)
    return text or "(the whole spec)"


def _show(value: Any) -> str:
    try:
        text = json.dumps(value, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _declared(loc: Sequence[str | int]) -> tuple[tuple[str | int, ...], Any, type[BaseModel] | None]:
    """The longest prefix of ``loc`` that names a declared field, that field's FieldInfo, and the
    model that the whole prefix leads to (None when it is not a section)."""
    model: type[BaseModel] | None = JobSpec
    found: tuple[str | int, ...] = ()
    field = None
    for index, part in enumerate(loc):
        if model is None or not isinstance(part, str) or part not in model.model_fields:
            break
        field = model.model_fields[part]
        found = tuple(loc[: index + 1])
        # An optional section (``sweep: Sweep | None``) or one that may be off (``snapshot: Snapshot | False``)
        # is described as the section.
        model = section_model(field.annotation)
    return found, field, (model if len(found) == len(loc) else None)


def _describe(loc: Sequence[str | int]) -> str:
    """What is allowed at ``loc``, from the schema's field descriptions."""
    found, field, model = _declared(loc)
    if field is None:
        return ""
    if model is not None:
        return f"{field_path(found)} is a mapping with the fields {', '.join(model.model_fields)}."
    return f"Allowed in {field_path(found)}: {field.description}" if field.description else ""


def _message(error: Mapping[str, Any]) -> str:
    loc = tuple(error["loc"])
    where = field_path(loc)
    kind = error["type"]
    if kind == "missing":
        return f"{where} is missing. {_describe(loc)} Add it."
    if kind == "extra_forbidden":
        parent = loc[:-1]
        _, _, holder = _declared(parent)
        allowed = ", ".join((holder or JobSpec).model_fields)
        section = f"of {field_path(parent)} " if parent else ""
        return (f"{where} = {_show(error['input'])}: unknown field. The fields {section}are: {allowed}. "
                "Rename or remove it.")
    message = error["msg"]
    if kind == "string_pattern_mismatch":
        pattern = error.get("ctx", {}).get("pattern")
        message = {NAME_PATTERN: "must be 1-128 letters, digits, '.', '_' or '-'",
                   ENTRYPOINT_PATTERN: "must be 'module:function', e.g. examples.quickstart.job:main"}.get(pattern, message)
    described = _describe(loc)
    if described and not described.endswith("."):
        described += "."
    sentences = " ".join(part for part in (f"{message}.", described, "Fix this field.") if part)
    return f"{where} = {_show(error['input'])}: {sentences}"


def format_errors(error: ValidationError, source: Path | str) -> str:
    """One line per problem: ``FILE: resources.gpus_per_node = -1: ... Allowed: ... Fix this field.``"""
    problems = error.errors(include_url=False)
    lines = [f"{source}: {_message(problem)}" for problem in problems]
    if len(lines) > 1:
        lines.insert(0, f"{source} is not a valid job spec ({len(lines)} problems):")
    return "\n".join(lines)
