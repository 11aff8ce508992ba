"""The job spec: one YAML file that describes a training job, checked by Pydantic.

Torch-free (login-node commands import it). The field names are a contract: they appear in users'
YAML files, in the recorded ``job.yaml`` of every run directory and in ``elfes schema``.

>>> spec = load_spec("examples/quickstart/job.yaml")     # raises SpecError naming file, field, value
>>> spec.run_dir                                          # absolute: run_dir ../../runs/quickstart-job
PosixPath('/home/me/elfes/runs/quickstart-job')           # resolved against the spec file's folder

Paths (``workdir``, ``run_dir``) are resolved once, when the spec is loaded, relative to the folder
of the spec file, and kept absolute from then on: the copy recorded in the run directory reloads to
the same spec.

This module reads spec files (YAML, safe loader, no key given twice) and validates them; the models
live in launcher/spec/models.py, the messages in launcher/spec/messages.py and the checks against
this machine's files in launcher/spec/file_checks.py. The package (``launcher/spec/__init__.py``) names the public API.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from .messages import format_errors
from .models import JobSpec, SpecError


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` (no Python tags) that refuses a key given twice in one mapping."""


def _construct_unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, yaml.Mark] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if isinstance(key, str) and key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} is given twice (first on line {seen[key].line + 1})", key_node.start_mark
            )
        if isinstance(key, str):
            seen[key] = key_node.start_mark
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)


def read_spec_data(path: Path) -> dict[str, Any]:
    """The mapping in the YAML file ``path`` (safe loader only), or SpecError naming the line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file; give the path of a job spec (YAML), e.g. one from `elfes init`") from None
    except IsADirectoryError:
        raise SpecError(f"{path}: is a folder; give the path of a job spec file (YAML)") from None
    except (OSError, UnicodeDecodeError) as error:
        raise SpecError(f"{path}: cannot be read ({error}); give a readable UTF-8 YAML file") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = error.problem or str(error)
        if isinstance(error, yaml.constructor.ConstructorError) and "tag" in problem:
            problem += " (specs are plain YAML: Python tags such as !!python/object are refused)"
        raise SpecError(f"{path}:{where}: {problem}; fix the YAML there") from None
    except yaml.YAMLError as error:
        raise SpecError(f"{path}: not valid YAML ({error}); fix the file") from None
    if not isinstance(data, dict):
        found = "an empty file" if data is None else f"a {type(data).__name__}"
        raise SpecError(f"{path}: a job spec is a mapping of fields (name, entrypoint, run_dir, ...), found {found}; "
                        "start from `elfes init`")
    return data


def load_spec(path: str | os.PathLike[str], *, check_files: bool = True) -> JobSpec:
    """Read and check the job spec at ``path``. Any process; imports nothing of the job.

    Relative ``workdir`` and ``run_dir`` are resolved against the spec file's folder. With
    ``check_files`` (the default) the workdir must exist, the entrypoint module must be found there
    (not imported) and the run directory must be creatable; nothing is created.
    Raises :class:`SpecError` naming the file, each wrong field by its dotted path, its value and what
    is allowed.
    """
    path = Path(path)
    data = read_spec_data(path)
    return validate_spec_data(data, source=path, base=path.absolute().parent, check_files=check_files)


def validate_spec_data(data: Mapping[str, Any], *, source: Path | str, base: Path, check_files: bool = True) -> JobSpec:
    """Validate a spec mapping (``source`` names it in messages; relative paths resolve against ``base``)."""
    try:
        return JobSpec.model_validate(data, context={"base": str(base), "check_files": check_files})
    except ValidationError as error:
        raise SpecError(format_errors(error, source)) from None
