"""The job spec's sections (``resources``, ``slurm``, ``requeue``, ``snapshot``) and the names and patterns their
fields follow; launcher/spec/models.py's ``JobSpec`` holds them. Torch-free."""

from __future__ import annotations

import re
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from .limits import control_character_problem
from .resume_markers import MAY_CHANGE

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


def one_line(value: _Value) -> _Value:
    if isinstance(value, str):
        problem = control_character_problem(value)
        if problem:
            raise PydanticCustomError("control_character", problem)
    return value


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Resources(Section):
    """What one attempt of the job gets from the cluster (or from this machine)."""

    # The world size may change when a run continues: the engine continues it when the job keeps its window of
    # microbatches per update, and refuses it before training otherwise.
    nodes: StrictInt = Field(
        1, ge=1, description="Number of nodes, an integer >= 1 (the local executor runs 1).",
        json_schema_extra=MAY_CHANGE,
    )
    tasks_per_node: StrictInt = Field(
        1, ge=1, description="Processes (ranks) per node, an integer >= 1; with GPUs, one per GPU (= gpus_per_node); "
        "the local executor starts at most 4 per CPU of this machine.",
        json_schema_extra=MAY_CHANGE,
    )
    gpus_per_node: StrictInt = Field(
        0, ge=0, description="GPUs per node, an integer >= 0; 0 trains on CPUs with gloo.", json_schema_extra=MAY_CHANGE,
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


class Slurm(Section):
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
        return one_line(value)

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
                errors.append(field_error((index,), line, "setup_line", problem))
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
                errors.append(field_error((key,), value, "sbatch_value",
                                     "must be a string, an integer, or true for a bare flag (omit the option instead "
                                     "of false)"))
            elif not re.fullmatch(r"[a-z][a-z0-9-]*", option):
                errors.append(field_error((key,), value, "sbatch_option", "not an sbatch option name; "
                                     "use the long name without dashes, e.g. mail-type"))
            elif option in MANAGED_SBATCH_OPTIONS:
                errors.append(field_error((key,), value, "managed_option",
                                     f"--{option} is set by {MANAGED_SBATCH_OPTIONS[option]}; remove it here"))
            elif isinstance(value, str) and (problem := control_character_problem(value)):
                errors.append(field_error((key,), value, "control_character", problem))
        if errors:
            raise ValidationError.from_exception_data("Slurm", errors)
        return additional


class Requeue(Section):
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


class Snapshot(Section):
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
                errors.append(field_error((index,), pattern, "snapshot_pattern", problem))
        if errors:
            raise ValidationError.from_exception_data("snapshot", errors)
        return patterns


def field_error(loc: tuple[str | int, ...], value: Any, kind: str, message: str) -> InitErrorDetails:
    # Without a context PydanticCustomError leaves its template as it is: braces stay literal.
    return InitErrorDetails(type=PydanticCustomError(kind, message), loc=loc, input=value)


def section_model(annotation: Any) -> type[BaseModel] | None:
    """The model of a section field's annotation: ``Resources``, and also one that may be off or absent
    (``Snapshot | Literal[False]``, ``Sweep | None``); None for any other field."""
    options = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else (
        annotation,)
    sections = [option for option in options if isinstance(option, type) and issubclass(option, BaseModel)]
    return sections[0] if len(sections) == 1 else None
