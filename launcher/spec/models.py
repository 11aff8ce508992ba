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
from typing import Any, Literal, TypeVar, cast

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from ..errors import EXIT_BAD_INPUT, ElfesError
from .file_checks import entrypoint_problem, run_dir_problem
from .limits import control_character_problem
from .resume_markers import FIXED, MAY_CHANGE, fixed_but
from .sweep_model import Sweep

NAME_PATTERN = r"^[A-Za-z0-9._-]{1,128}$"
_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
ENTRYPOINT_PATTERN = rf"^{_IDENTIFIER}(\.{_IDENTIFIER})*:{_IDENTIFIER}$"
ENV_NAME_PATTERN = rf"^{_IDENTIFIER}$"

COMMAND_PLACEHOLDERS: dict[str, str] = {
    "python": "the job's Python interpreter (the one that runs the launcher in the job)",
    "run_dir": "the run directory (absolute)",
    "checkpoint_dir": "the run's checkpoint folder, RUN_DIR/checkpoints",
    "workdir": "the job's working directory (absolute)",
}
"""Placeholders a ``command`` may use, as ``{run_dir}``; ``{{`` and ``}}`` stand for braces."""

# Variables the launcher or the executor set in the job: a spec may not override them.
RESERVED_ENV_NAMES = frozenset(
    {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES"}
)
RESERVED_ENV_PREFIXES = ("SLURM_", "SUBMITIT_")

# sbatch options the launcher derives from other fields; slurm.additional may not set them.
MANAGED_SBATCH_OPTIONS: dict[str, str] = {
    "job-name": "name",
    "time": "resources.timeout_min",
    "nodes": "resources.nodes",
    "ntasks-per-node": "resources.tasks_per_node",
    "gpus-per-node": "resources.gpus_per_node",
    "cpus-per-task": "resources.cpus_per_task",
    "mem": "resources.mem_gb",
    "partition": "slurm.partition",
    "account": "slurm.account",
    "qos": "slurm.qos",
    "constraint": "slurm.constraint",
    "signal": "slurm.signal_delay_s",
    "requeue": "the launcher (jobs are always submitted with --requeue)",
    "no-requeue": "the launcher (jobs are always submitted with --requeue)",
    "open-mode": "the launcher (logs are appended across requeues)",
    "output": "the launcher (logs live in the run directory)",
    "error": "the launcher (logs live in the run directory)",
    "chdir": "workdir",
    "array": "the launcher (one job per run directory)",
}


_Value = TypeVar("_Value")


def _one_line(value: _Value) -> _Value:
    if isinstance(value, str):
        problem = control_character_problem(value)
        if problem:
            raise PydanticCustomError("control_character", problem)
    return value


class SpecError(ElfesError, ValueError):
    """A job spec that cannot be used: the message names the file, the field, the value and the fix."""

    exit_code = EXIT_BAD_INPUT


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Resources(_Section):
    """What one attempt of the job gets from the cluster (or from this machine)."""

    nodes: StrictInt = Field(
        1, ge=1, description="Number of nodes, an integer >= 1 (the local executor runs 1).",
        json_schema_extra=FIXED,
    )
    tasks_per_node: StrictInt = Field(
        1, ge=1, description="Processes (ranks) per node, an integer >= 1; with GPUs, one per GPU (= gpus_per_node).",
        json_schema_extra=FIXED,
    )
    gpus_per_node: StrictInt = Field(
        0, ge=0, description="GPUs per node, an integer >= 0; 0 trains on CPUs with gloo.", json_schema_extra=FIXED,
    )
    cpus_per_task: StrictInt = Field(
        1, ge=1, description="CPU cores per process, an integer >= 1.",
        json_schema_extra=MAY_CHANGE,
    )
    mem_gb: float = Field(
        4, gt=0, strict=True, description="Memory per node in GB, a number > 0.",
        json_schema_extra=MAY_CHANGE,
    )
    timeout_min: StrictInt = Field(
        60, ge=1, description="Wall-clock limit of one attempt in minutes, an integer >= 1 (SLURM --time).",
        json_schema_extra=MAY_CHANGE,
    )
    kill_wait_s: StrictInt = Field(
        30,
        ge=1,
        description="Seconds a command job's processes get to exit after SIGTERM (elfes cancel) before SIGKILL on "
        "the local executor, as SLURM's KillWait (which SLURM applies itself); an integer >= 1.",
        json_schema_extra=MAY_CHANGE,
    )


class Slurm(_Section):
    """SLURM options. Ignored by the local executor, except ``signal_delay_s``."""

    partition: StrictStr | None = Field(None, min_length=1, description="SLURM partition, or null for the default.")
    account: StrictStr | None = Field(None, min_length=1, description="SLURM account, or null.")
    qos: StrictStr | None = Field(None, min_length=1, description="SLURM quality of service, or null.")
    constraint: StrictStr | None = Field(None, min_length=1, description="SLURM node constraint, or null.")
    signal_delay_s: StrictInt = Field(
        120,
        ge=1,
        description="Seconds before the time limit at which the job gets the requeue signal (USR2) to save and "
        "requeue, an integer >= 1 and below resources.timeout_min * 60.",
    )
    setup: list[StrictStr] = Field(
        default_factory=list, description='Shell lines run in the batch script before the tasks, e.g. ["module load cuda"].'
    )
    additional: dict[str, str | int | bool] = Field(
        default_factory=dict,
        description="Other sbatch options, e.g. {exclusive: true, mail-type: END}: a string, an integer or true "
        "(a bare flag). Options the launcher derives from other fields are refused.",
    )

    @field_validator("partition", "account", "qos", "constraint")
    @classmethod
    def _one_line_option(cls, value: str | None) -> str | None:
        return _one_line(value)

    @field_validator("setup")
    @classmethod
    def _setup_lines(cls, lines: list[str]) -> list[str]:
        errors = []
        for index, line in enumerate(lines):
            problem = control_character_problem(line)
            if problem is None and line.lstrip().upper().startswith("#SBATCH"):
                problem = ("sbatch would read this comment as a directive (the script's commands start later); "
                           "give sbatch options in slurm.additional")
            if problem:
                errors.append(_error((index,), line, "setup_line", problem))
        if errors:
            raise ValidationError.from_exception_data("setup", errors)
        return lines

    @field_validator("additional", mode="before")
    @classmethod
    def _sbatch_options(cls, additional: Any) -> Any:
        if not isinstance(additional, dict):
            return additional  # the type check reports it
        errors = []
        for key, value in additional.items():
            option = str(key).replace("_", "-")
            if value is not True and (isinstance(value, bool) or not isinstance(value, (str, int))):
                errors.append(_error((key,), value, "sbatch_value",
                                     "must be a string, an integer, or true for a bare flag (omit the option instead "
                                     "of false)"))
            elif not re.fullmatch(r"[a-z][a-z0-9-]*", option):
                errors.append(_error((key,), value, "sbatch_option", "not an sbatch option name; "
                                     "use the long name without dashes, e.g. mail-type"))
            elif option in MANAGED_SBATCH_OPTIONS:
                errors.append(_error((key,), value, "managed_option",
                                     f"--{option} is set by {MANAGED_SBATCH_OPTIONS[option]}; remove it here"))
            elif isinstance(value, str) and (problem := control_character_problem(value)):
                errors.append(_error((key,), value, "control_character", problem))
        if errors:
            raise ValidationError.from_exception_data("Slurm", errors)
        return additional


class Requeue(_Section):
    """How often a preempted, timed-out, failed or hung job comes back."""

    max_requeues: StrictInt = Field(
        20,
        ge=0,
        description="Most requeues of one run (preemptions, time limits, node failures, elfes preempt), "
        "counted in the run directory; an integer >= 0.",
    )
    max_failures: StrictInt = Field(
        3,
        ge=0,
        description="Most failed attempts of one run (an exception, a nonzero exit, a rank lost, a hang) that are "
        "retried from `last`, counted apart from max_requeues; an integer >= 0 (0: a failure ends the run). A "
        "failure that repeats (the same error at the same step, or two crashes in a row before the first update) "
        "is never retried.",
    )
    hang_timeout_s: StrictInt | None = Field(
        None,
        ge=1,
        description="Seconds a rank may go without a sign of progress (a window's start or end, an evaluation "
        "batch, a checkpoint write) after its first update boundary; past it the attempt is a hang: every rank's "
        "Python stacks go to its log, the attempt is killed and retried like a failure (unless a beat comes in the "
        "10 s that follow). 5 times as long for the first window of each epoch, the first batch of each evaluation "
        "loader and a checkpoint write; before the first update boundary startup_timeout_s applies instead; after "
        "train() returns the job is not watched. An integer >= 1, or null (no watchdog). Entrypoint jobs only: a "
        "command job is refused with it.",
    )
    startup_timeout_s: StrictInt | None = Field(
        1800,
        ge=1,
        description="With hang_timeout_s: seconds a rank may go without a sign of progress before its first update "
        "boundary of the attempt (importing, the process group forming, loading data, a restore, compiling, the "
        "first window), whatever hang_timeout_s is. An integer >= 1, or null (no limit before the first update).",
    )
    exclude_failed_nodes: bool = Field(
        True,
        strict=True,
        description="SLURM: leave the node where a rank died or hung out of the run's later jobs (ExcNodeList of "
        "the requeued job, --exclude of a resubmission); recorded in state.json, shown by elfes status; `elfes "
        "resume --include-nodes` allows them again. A requeue that the exclusions leave no room for ends the run "
        "failed, saying so. false: no node is excluded.",
    )


class Snapshot(_Section):
    """The copy of workdir that every attempt runs (RUN_DIR/code/<N>/, taken at submission): a git work tree's
    tracked files plus its untracked files that are not ignored, else the whole folder."""

    exclude: list[StrictStr] = Field(
        default_factory=list,
        description='Patterns of files or folders under workdir left out of the snapshot, e.g. ["data", "*.ckpt"] '
        "(shell-style, matched against the path relative to workdir and each of its parent folders).",
    )
    include: list[StrictStr] = Field(
        default_factory=list,
        description='Patterns of files under workdir copied although git ignores them, e.g. ["build/*.so"] '
        "(glob patterns relative to workdir; ** spans folders).",
    )
    max_mb: float = Field(
        100, gt=0, strict=True,
        description="Largest snapshot in MB (10**6 bytes), a number > 0; a bigger one is refused before anything is "
        "created, naming the largest files.",
    )

    @field_validator("exclude", "include")
    @classmethod
    def _patterns(cls, patterns: list[str]) -> list[str]:
        errors = []
        for index, pattern in enumerate(patterns):
            problem = control_character_problem(pattern)
            if problem is None and (not pattern.strip() or pattern.startswith("/") or ".." in Path(pattern).parts):
                problem = "must be a non-empty pattern relative to workdir, without a leading / or .."
            if problem:
                errors.append(_error((index,), pattern, "snapshot_pattern", problem))
        if errors:
            raise ValidationError.from_exception_data("snapshot", errors)
        return patterns


class JobSpec(_Section):
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
        _one_line(str(value))
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
                errors.append(_error((index,), part, "command_nul", "contains a NUL character, which no program "
                                     "argument can hold; remove it"))
                continue
            try:
                fields = [field for _, field, _, _ in string.Formatter().parse(part) if field is not None]
            except ValueError as error:
                errors.append(_error((index,), part, "command_braces", f"{error}; write {{{{ and }}}} for literal braces"))
                continue
            unknown = [field for field in fields if field not in COMMAND_PLACEHOLDERS]
            if unknown:
                errors.append(_error((index,), part, "command_placeholder",
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
                errors.append(_error((name,), value, "env_name", "not a variable name (letters, digits, _)"))
            elif name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES):
                errors.append(_error((name,), value, "env_reserved",
                                     "set by the launcher in the job; remove it from env"))
            elif problem := control_character_problem(value):
                errors.append(_error((name,), value, "control_character", problem))
        if errors:
            raise ValidationError.from_exception_data("env", errors)
        return env

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> JobSpec:
        errors = []
        if (self.entrypoint is None) == (self.command is None):
            given = "both" if self.entrypoint is not None else "neither"
            errors.append(_error(("entrypoint",), self.entrypoint, "entrypoint_or_command",
                                 f"give exactly one of entrypoint ('module:function') and command (a list); "
                                 f"this spec gives {given}"))
        if self.command is not None and self.requeue.hang_timeout_s is not None:
            errors.append(_error(("requeue", "hang_timeout_s"), self.requeue.hang_timeout_s, "hang_timeout_command",
                                 "the hang watchdog reads an entrypoint's trainer heartbeat, which a command job "
                                 "does not have; remove requeue.hang_timeout_s or run the training as an "
                                 "entrypoint ('module:function')"))
        limit_s = self.resources.timeout_min * 60
        if self.slurm.signal_delay_s >= limit_s:
            errors.append(_error(("slurm", "signal_delay_s"), self.slurm.signal_delay_s, "signal_delay",
                                 f"must be below resources.timeout_min * 60 = {limit_s} s, or the job is signalled "
                                 "before it starts"))
        resources = self.resources
        if resources.gpus_per_node > 0 and resources.tasks_per_node != resources.gpus_per_node:
            errors.append(_error(("resources", "tasks_per_node"), resources.tasks_per_node, "task_per_gpu",
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
            return [_error(("workdir",), str(self.workdir), "workdir", f"{what}; give the folder holding the code")]
        errors = []
        if self.entrypoint is not None:
            problem = entrypoint_problem(self.entrypoint, self.workdir)
            if problem:
                errors.append(_error(("entrypoint",), self.entrypoint, "entrypoint_not_found", problem))
        problem = run_dir_problem(self.run_dir)
        if problem:
            errors.append(_error(("run_dir",), str(self.run_dir), "run_dir", problem))
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


def _error(loc: tuple[str | int, ...], value: Any, kind: str, message: str) -> InitErrorDetails:
    # Without a context PydanticCustomError leaves its template as it is: braces stay literal.
    return InitErrorDetails(type=PydanticCustomError(kind, message), loc=loc, input=value)


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a job spec (``elfes schema``), for editors."""
    schema = JobSpec.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "ELFES job spec"
    return schema
