"""The job spec's Pydantic models: the fields of a job, their defaults and units, and the rules
between fields. Torch-free (login-node commands import it).

The field names are a contract: they appear in users' YAML files, in the recorded ``job.yaml`` of
every run directory and in ``elfes schema``. Reading a spec file is launcher/spec/loading.py's job (use
``load_spec``); turning a validation error into sentences is launcher/spec/messages.py's.
"""

from __future__ import annotations

import os
import re
import string
from pathlib import Path
from typing import Any, Literal, cast

import yaml
from pydantic import (
    Field,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from elfes.records.tracking import TrackingSettings

from ..errors import EXIT_BAD_INPUT, ElfesError
from .file_checks import entrypoint_problem, run_dir_problem
from .limits import control_character_problem
from .resume_markers import FIXED, MAY_CHANGE, fixed_but
from .sections import (
    COMMAND_PLACEHOLDERS,
    ENTRYPOINT_PATTERN,
    ENV_NAME_PATTERN,
    NAME_PATTERN,
    RESERVED_ENV_NAMES,
    RESERVED_ENV_PREFIXES,
    Requeue,
    Resources,
    Section,
    Slurm,
    Snapshot,
    field_error,
    one_line,
)
from .sweep_model import Sweep


class SpecError(ElfesError, ValueError):
    """A job spec that cannot be used: the message names the file, the field, the value and the fix."""

    exit_code = EXIT_BAD_INPUT


class JobSpec(Section):
    """One training job: code, configuration, resources, cluster options and requeue policy."""

    name: StrictStr = Field(
        ..., pattern=NAME_PATTERN, description="Job name (the SLURM job name): 1-128 letters, digits, '.', '_' or '-'.",
        json_schema_extra=FIXED,
    )
    entrypoint: StrictStr | None = Field(
        None,
        pattern=ENTRYPOINT_PATTERN,
        description="'module:function' importable from workdir, called as function(job) in every task.",
        json_schema_extra=FIXED,
    )
    command: list[StrictStr] | None = Field(
        None,
        min_length=1,
        description="A program and its arguments run in every task instead of an entrypoint, e.g. "
        '[python, train.py, --run-dir, "{run_dir}"]; placeholders: ' + ", ".join(f"{{{k}}}" for k in COMMAND_PLACEHOLDERS)
        + ". A bare program name is looked up on PATH with the folder of the job's Python interpreter first (its "
        "python, torchrun, elfes). Exit code 0 is finished, 128 + a stop signal's number paused, anything else failed.",
        json_schema_extra=FIXED,
    )
    workdir: Path = Field(
        Path("."), validate_default=True, description="Folder of the job's code, relative to the spec file; the job runs in (and imports the entrypoint from) "
        "its snapshot (see snapshot), or in it with snapshot: false.",
        json_schema_extra=FIXED,
    )
    run_dir: Path = Field(
        ..., description="Folder of every file of the run; relative to the spec file.",
        json_schema_extra=FIXED,
    )
    config: dict[str, Any] = Field(
        default_factory=dict, description="Free-form mapping handed to the entrypoint as job.config (a plain dict).",
        json_schema_extra=fixed_but("epochs", "max_steps"),
    )
    resources: Resources = Field(default_factory=Resources, description=Resources.__doc__)
    slurm: Slurm = Field(default_factory=Slurm, description=Slurm.__doc__, json_schema_extra=MAY_CHANGE)
    requeue: Requeue = Field(default_factory=Requeue, description=Requeue.__doc__, json_schema_extra=MAY_CHANGE)
    env: dict[str, StrictStr] = Field(
        default_factory=dict,
        description='Environment variables exported before the tasks start, e.g. {OMP_NUM_THREADS: "1"}; '
        "values are strings (quote numbers).",
        json_schema_extra=MAY_CHANGE,
    )
    snapshot: Snapshot | Literal[False] = Field(
        default_factory=Snapshot,
        description=(Snapshot.__doc__ or "") + " false: no copy, every attempt imports from workdir as it is then.",
        json_schema_extra=MAY_CHANGE,
    )
    tracking: TrackingSettings = Field(
        default_factory=TrackingSettings, description=TrackingSettings.__doc__, json_schema_extra=MAY_CHANGE,
    )
    sweep: Sweep | None = Field(
        None, description=Sweep.__doc__,
        json_schema_extra=FIXED,
    )  # expanded by launcher/spec/sweep.py

    @field_validator("snapshot", mode="wrap")
    @classmethod
    def _snapshot_section(cls, value: Any, handler: Any) -> Any:
        """``true`` is the default section, ``false`` none, a mapping the section: validated as the section alone,
        so that its problems are reported once, as ``snapshot.exclude[0]``, not once per member of the union."""
        if value is True:
            value = {}
        if value is False or isinstance(value, Snapshot):
            return handler(value)
        if not isinstance(value, dict):
            raise PydanticCustomError("snapshot_type", "must be true (the default snapshot), false (no snapshot) or a "
                                      "mapping")
        return Snapshot.model_validate(value)

    @field_validator("workdir", "run_dir", mode="before")
    @classmethod
    def _path_text(cls, value: Any) -> Any:
        if not isinstance(value, (str, os.PathLike)):
            raise PydanticCustomError("path_type", "must be a path (a string)")
        if not str(value).strip():
            raise PydanticCustomError("path_empty", "must not be empty")
        one_line(str(value))
        return value

    @field_validator("workdir", "run_dir")
    @classmethod
    def _absolute(cls, value: Path, info: ValidationInfo) -> Path:
        base = Path((info.context or {}).get("base", "."))
        return Path(os.path.abspath(base / value.expanduser()))

    @field_validator("command")
    @classmethod
    def _placeholders(cls, command: list[str] | None) -> list[str] | None:
        errors = []
        for index, part in enumerate(command or ()):
            if "\x00" in part:  # the command is an argument list (no shell): only NUL cannot be passed
                errors.append(field_error((index,), part, "command_nul", "contains a NUL character, which no program "
                                     "argument can hold; remove it"))
                continue
            try:
                fields = [field for _, field, _, _ in string.Formatter().parse(part) if field is not None]
            except ValueError as error:
                errors.append(field_error((index,), part, "command_braces", f"{error}; write {{{{ and }}}} for literal braces"))
                continue
            unknown = [field for field in fields if field not in COMMAND_PLACEHOLDERS]
            if unknown:
                errors.append(field_error((index,), part, "command_placeholder",
                                     f"unknown placeholder {{{unknown[0]}}}; use one of "
                                     + ", ".join(f"{{{k}}}" for k in COMMAND_PLACEHOLDERS)))
        if errors:
            raise ValidationError.from_exception_data("command", errors)
        return command

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        errors = []
        for name, value in env.items():
            if not re.fullmatch(ENV_NAME_PATTERN, name):
                errors.append(field_error((name,), value, "env_name", "not a variable name (letters, digits, _)"))
            elif name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES):
                errors.append(field_error((name,), value, "env_reserved",
                                     "set by the launcher in the job; remove it from env"))
            elif problem := control_character_problem(value):
                errors.append(field_error((name,), value, "control_character", problem))
        if errors:
            raise ValidationError.from_exception_data("env", errors)
        return env

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> JobSpec:
        errors = []
        if (self.entrypoint is None) == (self.command is None):
            given = "both" if self.entrypoint is not None else "neither"
            errors.append(field_error(("entrypoint",), self.entrypoint, "entrypoint_or_command",
                                 f"give exactly one of entrypoint ('module:function') and command (a list); "
                                 f"this spec gives {given}"))
        if self.command is not None and self.requeue.hang_timeout_s is not None:
            errors.append(field_error(("requeue", "hang_timeout_s"), self.requeue.hang_timeout_s, "hang_timeout_command",
                                 "the hang watchdog reads an entrypoint's trainer heartbeat, which a command job "
                                 "does not have; remove requeue.hang_timeout_s or run the training as an "
                                 "entrypoint ('module:function')"))
        limit_s = self.resources.timeout_min * 60
        if self.slurm.signal_delay_s >= limit_s:
            errors.append(field_error(("slurm", "signal_delay_s"), self.slurm.signal_delay_s, "signal_delay",
                                 f"must be below resources.timeout_min * 60 = {limit_s} s, or the job is signalled "
                                 "before it starts"))
        resources = self.resources
        if resources.gpus_per_node > 0 and resources.tasks_per_node != resources.gpus_per_node:
            errors.append(field_error(("resources", "tasks_per_node"), resources.tasks_per_node, "task_per_gpu",
                                 f"with gpus_per_node: {resources.gpus_per_node} every task drives one GPU; "
                                 f"set tasks_per_node: {resources.gpus_per_node}"))
        if not errors and (info.context or {}).get("check_files"):
            errors = self._file_errors()
        if errors:
            raise ValidationError.from_exception_data("JobSpec", errors)
        return self

    def _file_errors(self) -> list[InitErrorDetails]:
        """Checks against this machine's files: workdir exists, the entrypoint module is found (not
        imported), the run directory can be created. Nothing is created."""
        if not self.workdir.is_dir():
            what = "is not a folder" if self.workdir.exists() else "does not exist"
            return [field_error(("workdir",), str(self.workdir), "workdir", f"{what}; give the folder holding the code")]
        errors = []
        if self.entrypoint is not None:
            problem = entrypoint_problem(self.entrypoint, self.workdir)
            if problem:
                errors.append(field_error(("entrypoint",), self.entrypoint, "entrypoint_not_found", problem))
        problem = run_dir_problem(self.run_dir)
        if problem:
            errors.append(field_error(("run_dir",), str(self.run_dir), "run_dir", problem))
        return errors

    # -- what the executors and the runtime need -------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.resources.nodes * self.resources.tasks_per_node

    @property
    def entrypoint_module(self) -> str:
        """``"examples.quickstart.job"`` of ``"examples.quickstart.job:main"``."""
        if self.entrypoint is None:
            raise ValueError(f"job {self.name} runs a command, not an entrypoint")
        return self.entrypoint.partition(":")[0]

    @property
    def entrypoint_function(self) -> str:
        """``"main"`` of ``"examples.quickstart.job:main"``."""
        if self.entrypoint is None:
            raise ValueError(f"job {self.name} runs a command, not an entrypoint")
        return self.entrypoint.partition(":")[2]

    def render_command(self, *, python: str) -> list[str]:
        """The ``command`` with its placeholders filled (``python``: the job's interpreter)."""
        if self.command is None:
            raise ValueError(f"job {self.name} runs an entrypoint, not a command")
        values = {
            "python": python,
            "run_dir": str(self.run_dir),
            "checkpoint_dir": str(self.run_dir / "checkpoints"),
            "workdir": str(self.workdir),
        }
        return [part.format(**values) for part in self.command]

    def to_yaml(self) -> str:
        """The spec as recorded in the run directory (absolute paths, every default written out)."""
        data = self.model_dump(mode="json", exclude={"sweep"} if self.sweep is None else None)
        return cast(str, yaml.safe_dump(data, sort_keys=False, allow_unicode=True))

    def differences(self, other: JobSpec) -> list[str]:
        """Dotted paths of the fields whose values differ between two specs (``["resources.nodes"]``)."""
        return _differences(self.model_dump(mode="json"), other.model_dump(mode="json"), "")


def _differences(left: Any, right: Any, prefix: str) -> list[str]:
    if isinstance(left, dict) and isinstance(right, dict):
        out = []
        for key in list(left) + [key for key in right if key not in left]:
            out += _differences(left.get(key), right.get(key), f"{prefix}.{key}" if prefix else str(key))
        return out
    return [] if left == right else [prefix]


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a job spec (``elfes schema``), for editors."""
    schema = JobSpec.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "ELFES job spec"
    return schema
