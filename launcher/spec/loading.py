"""The job spec: one YAML file that describes a training job, checked by Pydantic.

Torch-free (login-node commands import it). The field names are a contract: they appear in users'
YAML files, in the recorded ``job.yaml`` of every run directory and in ``elfes schema``.

>>> spec = load_spec("examples/quickstart/job.yaml")     # raises SpecError naming file, field, value  # doctest: +SKIP
>>> spec.run_dir                                          # absolute: run_dir ../../runs/quickstart-job  # doctest: +SKIP
PosixPath('/home/me/elfes/runs/quickstart-job')           # resolved against the spec file's folder

Paths (``workdir``, ``run_dir``) are resolved once, when the spec is loaded, relative to the folder
of the spec file, and kept absolute from then on: the copy recorded in the run directory reloads to
the same spec.

This module reads spec files (YAML, safe loader, merge keys, no key given twice, bounded in size,
depth and alias expansion by launcher/spec/limits.py before any object is built) and validates them;
the models live in launcher/spec/models.py, the messages in launcher/spec/messages.py and the checks
against this machine's files in launcher/spec/file_checks.py. The package (``launcher/spec/__init__.py``)
names the public API.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import yaml
from pydantic import ValidationError

from .limits import LIMITS_TEXT, MAX_SPEC_BYTES, MAX_SPEC_DEPTH, CyclicSpec, data_size, measure, size_problem
from .messages import format_errors
from .models import JobSpec, SpecError

MERGE_TAG = "tag:yaml.org,2002:merge"


class _SpecLoader(yaml.SafeLoader):  # type: ignore[misc]  # yaml has no type stubs here: SafeLoader is Any
    """``yaml.SafeLoader`` (no Python tags; merge keys ``<<: *base`` work) that refuses a key given twice
    in one mapping and mappings or lists nested deeper than ``MAX_SPEC_DEPTH`` while it composes."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        nests = self.check_event(yaml.MappingStartEvent, yaml.SequenceStartEvent)
        if nests and self._depth >= MAX_SPEC_DEPTH:
            raise yaml.composer.ComposerError(
                None, None, f"mappings and lists nested deeper than {MAX_SPEC_DEPTH} levels (the limit of a job "
                "spec); flatten this part", self.peek_event().start_mark)
        self._depth += nests
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= nests

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        try:
            return cast(int, super().construct_yaml_int(node))
        except ValueError as error:  # more digits than Python converts (sys.get_int_max_str_digits)
            raise yaml.constructor.ConstructorError(
                None, None, f"an integer too long to read ({error}); write it as a string", node.start_mark
            ) from None


def _construct_unique_mapping(loader: _SpecLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: dict[Any, yaml.Mark] = {}
    for key_node, _ in node.value:
        if key_node.tag == MERGE_TAG:
            continue  # merged keys may be given again: the mapping's own value wins
        key = loader.construct_object(key_node, deep=deep)
        if isinstance(key, str) and key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} is given twice (first on line {seen[key].line + 1})", key_node.start_mark
            )
        if isinstance(key, str):
            seen[key] = key_node.start_mark
    return cast("dict[Any, Any]", yaml.SafeLoader.construct_mapping(loader, node, deep=deep))


_SpecLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)
_SpecLoader.add_constructor("tag:yaml.org,2002:int", _SpecLoader.construct_yaml_int)


def _node_children(node: yaml.Node) -> list[yaml.Node] | None:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return cast("list[yaml.Node]", node.value)
    return None


def _read_text(path: Path) -> str:
    """The file's text, reading at most one byte past ``MAX_SPEC_BYTES`` (whatever the file is)."""
    try:
        with path.open("rb") as stream:
            raw = stream.read(MAX_SPEC_BYTES + 1)
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file; give the path of a job spec (YAML), e.g. one from `elfes init`") from None
    except IsADirectoryError:
        raise SpecError(f"{path}: is a folder; give the path of a job spec file (YAML)") from None
    except OSError as error:
        raise SpecError(f"{path}: cannot be read ({error}); give a readable UTF-8 YAML file") from None
    if len(raw) > MAX_SPEC_BYTES:
        raise SpecError(f"{path}: larger than {MAX_SPEC_BYTES:,} bytes, the limit of a job spec file; keep large "
                        "data in files the job reads and give their paths in config")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise SpecError(f"{path}: cannot be read ({error}); give a readable UTF-8 YAML file") from None


def _parse(text: str, path: Path) -> Any:
    """The YAML document in ``text``, refused before any object is built when it passes a bound."""
    loader = _SpecLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        try:
            problem = size_problem(measure(node, _node_children, lambda scalar: len(scalar.value)))
        except CyclicSpec as error:
            raise SpecError(f"{path}: line {error.part.start_mark.line + 1}: {error}; YAML specs cannot be "
                            "recursive, remove that alias") from None
        if problem:
            raise SpecError(f"{path}: {problem} ({LIMITS_TEXT}); an alias (*name) repeats all of its anchor: "
                            "repeat less, or keep large data in files the job reads")
        return loader.construct_document(node)
    finally:
        loader.dispose()


def read_spec_data(path: Path) -> dict[str, Any]:
    """The mapping in the YAML file ``path`` (safe loader only, bounded), or SpecError naming the line."""
    path = Path(path)
    text = _read_text(path)
    try:
        data = _parse(text, path)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = error.problem or str(error)
        if isinstance(error, yaml.constructor.ConstructorError) and "could not determine a constructor" in problem:
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
        problem = size_problem(data_size(data))
    except CyclicSpec as error:
        problem = str(error)
    if problem:
        raise SpecError(f"{source}: {problem} ({LIMITS_TEXT}); make the spec smaller, or keep large data in "
                        "files the job reads")
    try:
        spec = JobSpec.model_validate(data, context={"base": str(base), "check_files": check_files})
    except ValidationError as error:
        raise SpecError(format_errors(error, source)) from None
    recorded = len(spec.to_yaml().encode("utf-8"))
    if recorded > MAX_SPEC_BYTES:
        raise SpecError(f"{source}: recorded in the run directory (every alias expanded, every default written out) "
                        f"this spec takes {recorded:,} bytes, above the limit of {MAX_SPEC_BYTES:,}; make config "
                        "smaller, or keep large data in files the job reads")
    return spec
