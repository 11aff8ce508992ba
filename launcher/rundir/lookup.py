"""An existing run directory, opened from what a user typed: :func:`run_paths` says what the folder
is not when it is no run directory, :func:`recorded_spec` reads the spec recorded there (and
:func:`recorded_limits` only its time limits, for readers that look at many runs at once).
:class:`UsageError` is the verbs' error for bad input that is not a spec field.

Torch-free; reads files only. The spec's models (pydantic) are loaded only by the functions that read
a spec: ``elfes status`` of runs that need none starts without them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import EXIT_BAD_INPUT, ElfesError
from .paths import RunPaths, SweepPaths

if TYPE_CHECKING:
    from ..spec import JobSpec, Resources, Slurm


class UsageError(ElfesError, ValueError):
    """Bad input that is not a spec field: an unknown run directory, a template, a file in the way."""

    exit_code = EXIT_BAD_INPUT


def run_paths(run_dir: str | os.PathLike[str]) -> RunPaths:
    """The paths of an existing run directory, or UsageError saying what the folder is not."""
    paths = RunPaths(Path(os.path.abspath(run_dir)))
    if paths.run_dir.is_file() and paths.run_dir.suffix in (".yaml", ".yml"):
        raise UsageError(_spec_not_run_dir(run_dir))
    if not paths.run_dir.is_dir():
        raise UsageError(f"{run_dir}: no such run directory; give the run_dir of a submitted job "
                         "(its job.yaml names it)")
    if not paths.spec.is_file() and not paths.state.is_file():
        members = _members_without_sweep(paths.run_dir)
        if members:
            raise UsageError(
                f"{run_dir}: holds run directories ({', '.join(members[:3])}{', ...' if len(members) > 3 else ''}) "
                f"but no {SweepPaths(paths.run_dir).record.name}: an `elfes submit` of a sweep was interrupted while "
                "it created its members, before it handed any over; submit the sweep again (elfes submit SPEC, the "
                "same spec): it creates the sweep anew in this folder")
        raise UsageError(f"{run_dir}: not a run directory (no {paths.spec.name} or {paths.state.name}); give the "
                         "run_dir of a job submitted with `elfes submit`")
    return paths


def _members_without_sweep(folder: Path) -> list[str]:
    """The sub-folders of ``folder`` that hold nothing but a recorded spec, when ``folder`` has no ``sweep.json``:
    what `elfes submit` of a sweep leaves when it is killed before it wrote ``sweep.json`` (it writes the
    members' ``job.yaml`` first)."""
    if SweepPaths(folder).record.exists():
        return []
    try:
        return sorted(child.name for child in folder.iterdir()
                      if RunPaths(child).spec.is_file() and is_left_by_interrupted_creation(child))
    except OSError:
        return []


def is_left_by_interrupted_creation(member: Path) -> bool:
    """Whether the folder holds at most a ``job.yaml`` and a ``code.json`` (and the temporaries of their atomic
    writes): a sweep member created by an `elfes submit` killed before it wrote ``sweep.json``; nothing of it
    was handed over."""
    from elfes.files import is_temporary

    paths = RunPaths(member)
    created = (paths.spec, paths.code_record)
    try:
        return member.is_dir() and all(is_temporary(child) or child in created for child in member.iterdir()) and (
            paths.spec.is_file() or not paths.spec.exists())
    except OSError:
        return False


def recorded_spec(paths: RunPaths) -> JobSpec | None:
    """The spec recorded in the run directory (``job.yaml``), or None before the first submission."""
    from ..spec import load_spec

    if not paths.spec.is_file():
        return None
    return load_spec(paths.spec, check_files=False)


@dataclass(frozen=True)
class RecordedLimits:
    """The sections of a recorded spec that bound an attempt's time: ``resources`` (``timeout_min``) and
    ``slurm`` (``signal_delay_s``), each checked by its own model."""

    resources: Resources
    slurm: Slurm


def recorded_data(paths: RunPaths) -> dict[str, Any] | None:
    """The mapping in the run's recorded ``job.yaml``, read with the C safe loader when there is one (elfes
    wrote the file from a spec that passed every check, so neither the bounded loader nor the whole spec's
    validation is redone); None before the first submission. ValueError when it cannot be read."""
    import yaml

    try:
        text = paths.spec.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(str(error)) from None
    try:
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506 - a safe loader
    except yaml.YAMLError as error:
        raise ValueError(str(error)) from None
    if not isinstance(data, dict):
        raise ValueError(f"{paths.spec}: not a mapping of fields")
    return data


def recorded_limits(paths: RunPaths) -> RecordedLimits | None:
    """``resources`` and ``slurm`` of the recorded spec, without loading the rest of it: ``elfes status`` of a
    sweep asks this of every member whose job vanished. None before the first submission; SpecError when
    the file or those sections cannot be read."""
    from ..spec import Resources, Slurm, SpecError

    try:
        data = recorded_data(paths)
    except ValueError as error:
        raise SpecError(f"{paths.spec}: cannot be read ({error})") from None
    if data is None:
        return None
    try:
        return RecordedLimits(Resources.model_validate(data.get("resources", {})),
                              Slurm.model_validate(data.get("slurm", {})))
    except ValueError as error:  # pydantic's ValidationError is a ValueError
        raise SpecError(f"{paths.spec}: resources or slurm cannot be read ({error})") from None


def _spec_not_run_dir(spec_file: str | os.PathLike[str]) -> str:
    """What to say when a job spec is given where a run directory belongs: the run directory it names."""
    import shlex

    from ..spec import SpecError, load_spec

    try:
        named = load_spec(spec_file, check_files=False).run_dir
    except SpecError:
        return (f"{spec_file} is a job spec, not a run directory (and it does not load: check it with "
                f"elfes validate {shlex.quote(str(spec_file))}); give the run_dir it names")
    run_dir = shlex.quote(str(named))
    return f"{spec_file} is a job spec, not a run directory; its run directory is {run_dir}: elfes status {run_dir}" + (
        "" if named.is_dir() else f" (once submitted: elfes submit {shlex.quote(str(spec_file))})")
