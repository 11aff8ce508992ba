"""An existing run directory, opened from what a user typed: :func:`run_paths` says what the folder
is not when it is no run directory, :func:`recorded_spec` reads the spec recorded there.
:class:`UsageError` is the verbs' error for bad input that is not a spec field.

Torch-free; reads files only.
"""

from __future__ import annotations

import os
from pathlib import Path

from .paths import RunPaths
from .spec import JobSpec, load_spec


class UsageError(ValueError):
    """Bad input that is not a spec field: an unknown run directory, a template, a file in the way."""


def run_paths(run_dir: str | os.PathLike[str]) -> RunPaths:
    """The paths of an existing run directory, or UsageError saying what the folder is not."""
    paths = RunPaths(Path(os.path.abspath(run_dir)))
    if not paths.run_dir.is_dir():
        raise UsageError(f"{run_dir}: no such run directory; give the run_dir of a submitted job "
                         "(its job.yaml names it)")
    if not paths.spec.is_file() and not paths.state.is_file():
        raise UsageError(f"{run_dir}: not a run directory (no {paths.spec.name} or {paths.state.name}); give the "
                         "run_dir of a job submitted with `elfes submit`")
    return paths


def recorded_spec(paths: RunPaths) -> JobSpec | None:
    """The spec recorded in the run directory (``job.yaml``), or None before the first submission."""
    if not paths.spec.is_file():
        return None
    return load_spec(paths.spec, check_files=False)
