"""The verbs that help write a job spec and touch no run: ``elfes init`` (a template and the ``train.py``
it runs), ``elfes schema`` and ``elfes validate``. Torch-free; only ``init`` writes files.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from ..rundir.lookup import UsageError
from ..spec import JobSpec, json_schema
from ..spec.overrides import load_spec_with
from ..submit import executors

TEMPLATES_PACKAGE = "elfes.launcher.templates"


@dataclass(frozen=True)
class Validated:
    spec: JobSpec
    source: Path
    executor: str  # what `auto` would choose here


def validate(spec_file: str | os.PathLike[str], *, executor: str = "auto", sets: Sequence[str] = ()) -> Validated:
    """Check a spec file with the ``--set`` texts ``sets`` applied (and that ``executor`` can run it).
    Creates nothing."""
    spec = load_spec_with(spec_file, sets)
    chosen = executors.choose_executor(executor)
    executors.check_executor(spec, chosen)
    return Validated(spec=spec, source=Path(spec_file), executor=chosen)


def schema() -> dict[str, Any]:
    """The JSON Schema of the job spec."""
    return json_schema()


def template_names() -> list[str]:
    """The templates ``elfes init`` can write (file stems of ``templates/*.yaml``)."""
    folder = resources.files(TEMPLATES_PACKAGE)
    return sorted(entry.name[: -len(".yaml")] for entry in folder.iterdir() if entry.name.endswith(".yaml"))


def template_text(name: str) -> str:
    names = template_names()
    if name not in names:
        raise UsageError(f"template {name!r} does not exist; choose one of: {', '.join(names)}")
    return resources.files(TEMPLATES_PACKAGE).joinpath(f"{name}.yaml").read_text(encoding="utf-8")


ENTRYPOINT_TEMPLATE = "train.py"  # what every template's `entrypoint: train:main` imports, from beside the spec


@dataclass(frozen=True)
class Initialized:
    spec: Path
    entrypoint: Path  # train.py beside the spec
    wrote_entrypoint: bool  # False: a train.py was there already and is kept


def entrypoint_text() -> str:
    """The runnable ``train.py`` that ``elfes init`` writes beside the spec (templates/train.py)."""
    return resources.files(TEMPLATES_PACKAGE).joinpath(ENTRYPOINT_TEMPLATE).read_text(encoding="utf-8")


def init(template: str = "local-debug", path: str | os.PathLike[str] = "job.yaml") -> Initialized:
    """Write template ``template`` to ``path`` and, unless one is there, the ``train.py`` its entrypoint
    names beside it (refusing to overwrite the spec)."""
    text = template_text(template)
    target = Path(path)
    if target.exists():
        raise UsageError(f"{target} already exists; give another path (elfes init {template} PATH) or remove it")
    if not target.parent.is_dir():
        raise UsageError(f"{target.parent} is not a folder; create it first or give another path")
    entrypoint = target.parent / ENTRYPOINT_TEMPLATE
    wrote_entrypoint = not entrypoint.exists()
    if wrote_entrypoint:
        with open(entrypoint, "x", encoding="utf-8") as stream:
            stream.write(entrypoint_text())
    with open(target, "x", encoding="utf-8") as stream:
        stream.write(text)
    return Initialized(spec=target, entrypoint=entrypoint, wrote_entrypoint=wrote_entrypoint)
