"""The job spec's reference, generated from its Pydantic models: every field by its dotted path, its
type, its default and its meaning, and which fields may change when a run continues (each field's own
declaration, launcher/spec/continuing.py). ``docs/job-spec.md`` holds both between markers, and a test
keeps them identical to the models (regenerate: ``python -m elfes.launcher.spec.reference docs/job-spec.md``).
Torch-free.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from .continuing import reference_lists
from .models import JobSpec

BEGIN, END = "<!-- spec-fields:begin -->", "<!-- spec-fields:end -->"
CONTINUING_BEGIN, CONTINUING_END = "<!-- spec-continuing:begin -->", "<!-- spec-continuing:end -->"


def _type_name(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) if not getattr(annotation, "__args__", None) else None
    text = text or str(annotation)
    text = re.sub(r"typing\.|pathlib\.|<class '([^']*)'>|Annotated\[(\w+), [^\]]*\]", lambda m: m[1] or m[2] or "", text)
    text = text.replace("StrictStr", "str").replace("StrictInt", "int").replace("NoneType", "null")
    text = re.sub(r"Optional\[(.*)\]", r"\1 | None", text)
    return text.replace(" | None", " or null").replace(" | ", " or ")


def _default(field: Any) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "required"
    value = field.default_factory() if field.default_factory is not None else field.default
    if isinstance(value, BaseModel):
        return "(section)"
    return json.dumps(str(value) if isinstance(value, Path) else value)


def fields(model: type[BaseModel] = JobSpec, prefix: str = "") -> Iterator[tuple[str, str, str, str]]:
    """(dotted path, type, default, meaning) of every field, sections followed by their own fields."""
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        annotation = field.annotation
        # A section that may also be turned off (`snapshot: false`) is a section with its fields listed.
        options = [option for option in getattr(annotation, "__args__", ()) if option is not type(None)]
        switchable = next((option for option in options if isinstance(option, type) and issubclass(option, BaseModel)),
                          None) if len(options) == 2 else None
        if switchable is not None:
            annotation = switchable
        section = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
        kind = ("section or false" if switchable is not None else "section") if section else _type_name(annotation)
        yield path, kind, _default(field), " ".join((field.description or "").split())
        if section:
            yield from fields(section, f"{path}.")


def reference_table() -> str:
    """The Markdown table of every field."""
    rows = ["| field | type | default | meaning |", "| --- | --- | --- | --- |"]
    for path, kind, default, meaning in fields():
        rows.append(f"| `{path}` | {kind} | `{default}` | {meaning.replace('|', '&#124;')} |")
    return "\n".join(rows)


def _between(text: str, begin: str, end: str, content: str) -> str:
    start, stop = text.index(begin) + len(begin), text.index(end)
    return f"{text[:start]}\n{content}\n{text[stop:]}"


def update_document(document: Path) -> bool:
    """Rewrite the field table and the continuing lists between the markers of ``document``; True when it changed."""
    text = document.read_text(encoding="utf-8")
    updated = _between(text, BEGIN, END, reference_table())
    updated = _between(updated, CONTINUING_BEGIN, CONTINUING_END, reference_lists())
    if updated != text:
        document.write_text(updated, encoding="utf-8")
    return updated != text


if __name__ == "__main__":
    print("updated" if update_document(Path(sys.argv[1])) else "unchanged")
