"""An existing run directory, opened from what a user typed: :func:`run_paths` says what the folder
is not when it is no run directory, :func:`recorded_spec` reads the spec recorded there.
:class:`UsageError` is the verbs' error for bad input that is not a spec field.

Torch-free; reads files only.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..spec import JobSpec, load_spec
from .paths import RunPaths, SweepPaths


class UsageError(ValueError):
    """Bad input that is not a spec field: an unknown run directory, a template, a file in the way."""


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
    """Whether the folder holds at most a ``job.yaml`` (and the temporary of its atomic write): a sweep member
    created by an `elfes submit` killed before it wrote ``sweep.json``; nothing of it was handed over."""
    from elfes.files import is_temporary

    spec = RunPaths(member).spec
    try:
        return member.is_dir() and all(is_temporary(child) or child == spec for child in member.iterdir()) and (
            spec.is_file() or not spec.exists())
    except OSError:
        return False


def recorded_spec(paths: RunPaths) -> JobSpec | None:
    """The spec recorded in the run directory (``job.yaml``), or None before the first submission."""
    if not paths.spec.is_file():
        return None
    return load_spec(paths.spec, check_files=False)


def _spec_not_run_dir(spec_file: str | os.PathLike[str]) -> str:
    """What to say when a job spec is given where a run directory belongs: the run directory it names."""
    import shlex

    from ..spec import SpecError

    try:
        named = load_spec(spec_file, check_files=False).run_dir
    except SpecError:
        return (f"{spec_file} is a job spec, not a run directory (and it does not load: check it with "
                f"elfes validate {shlex.quote(str(spec_file))}); give the run_dir it names")
    run_dir = shlex.quote(str(named))
    return f"{spec_file} is a job spec, not a run directory; its run directory is {run_dir}: elfes status {run_dir}" + (
        "" if named.is_dir() else f" (once submitted: elfes submit {shlex.quote(str(spec_file))})")
