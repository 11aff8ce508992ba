"""Which fields of a job spec may change when a run continues from its checkpoints: declared on each field
of the models (launcher/spec/models.py) and read from there by the rule (launcher/submit/continuation.py), by
the list in docs/job-spec.md (launcher/spec/reference.py) and by ``elfes schema`` (the ``x-elfes-on-resume``
key), so that the three cannot disagree.

A field declares ``json_schema_extra=MAY_CHANGE`` (how long, where and with what the run goes on) or
``FIXED`` (what it computes; both in launcher/spec/resume_markers.py); a section that declares one covers its fields, one that declares none leaves
it to each of them. ``config`` is fixed but for the keys :func:`fixed_but` names (the training budget).
A field without a declaration, on itself or its section, fails a test. Torch-free.

>>> may_change("resources.timeout_min"), may_change("config.lr"), may_change("config.epochs")
(True, False, True)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel

from .models import JobSpec
from .resume_markers import CHANGEABLE_KEYS, ON_RESUME
from .sections import section_model


def _declared(field: Any) -> dict[str, Any]:
    extra = field.json_schema_extra
    return extra if isinstance(extra, dict) and ON_RESUME in extra else {}


def rules(model: type[BaseModel] | None = None, prefix: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """(dotted path, declaration) of every field that declares its rule; a section's undeclared fields are
    listed under it. ValueError names a field that declares nothing (nor its section)."""
    for name, field in (model or JobSpec).model_fields.items():
        declared = _declared(field)
        section = section_model(field.annotation)
        if declared:
            yield f"{prefix}{name}", declared
        elif section is not None:
            yield from rules(section, f"{prefix}{name}.")
        else:
            raise ValueError(f"{prefix}{name} declares neither MAY_CHANGE nor FIXED (launcher/spec/resume_markers.py)")


def changeable() -> list[str]:
    """The fields (and ``config`` keys) that may change, as dotted paths: ``["config.epochs", ..., "slurm"]``."""
    found = []
    for path, declared in rules():
        if declared[ON_RESUME] == "may change":
            found.append(path)
        found += [f"{path}.{key}" for key in declared.get(CHANGEABLE_KEYS, ())]
    return found


def changeable_keys(path: str) -> tuple[str, ...]:
    """The keys of the free-form mapping ``path`` that may change (``changeable_keys("config")``)."""
    return tuple(dict(rules()).get(path, {}).get(CHANGEABLE_KEYS, ()))


def may_change(path: str) -> bool:
    """Whether the dotted ``path`` (as :meth:`JobSpec.differences` names it) may change in a continuing run;
    a path no field declares (an unknown one) may not."""
    for declared_path, declared in rules():
        if path == declared_path:
            return bool(declared[ON_RESUME] == "may change")
        if path.startswith(f"{declared_path}."):
            key = path[len(declared_path) + 1:]
            return declared[ON_RESUME] == "may change" or key in declared.get(CHANGEABLE_KEYS, ())
    return False


def reference_lists() -> str:
    """The two Markdown bullets of docs/job-spec.md's "When a run continues"."""
    allowed, fixed = [], []
    for path, declared in rules():
        keys = declared.get(CHANGEABLE_KEYS, ())
        if declared[ON_RESUME] == "may change":
            allowed.append(f"`{path}`" + (" (every field)" if _is_section(path) else ""))
        else:
            fixed.append(f"`{path}`" + (" (every other key)" if keys else ""))
        allowed += [f"`{path}.{key}`" for key in keys]
    return f"- **may change:** {', '.join(allowed)};\n- **may not change:** {', '.join(fixed)}."


def _is_section(path: str) -> bool:
    model: Any = JobSpec
    for part in path.split("."):
        model = section_model(model.model_fields[part].annotation)
        if model is None:
            return False
    return True
