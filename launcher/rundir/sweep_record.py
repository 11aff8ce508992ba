"""``sweep.json``: a sweep's members, the jobs that ran them and the members waiting for a local slot.
Torch-free; read by any process without a lock, changed only through :func:`update_sweep` (a
read-modify-write under ``.sweep.lock``, published atomically).

Each member's own state stays in its run directory (``state.json``): this file never repeats it.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elfes.files import exclusive_lock, write_text_atomically

from ..backends import RUN_EXECUTORS, Executor, backend_for
from ..errors import RunDamaged
from .json_fields import FieldError, read_record
from .paths import RunPaths, SweepPaths
from .state import now

FORMAT_VERSION = 1
_FIELD_CHOICES = {"executor": tuple(sorted(RUN_EXECUTORS)), "kind": ("submit", "resume")}


@dataclass(frozen=True)
class MemberRecord:
    index: int
    name: str  # the folder name, from the overrides
    run_dir: str  # absolute
    overrides: dict[str, Any]

    @property
    def label(self) -> str:
        """The overrides as typed: ``config.lr=0.001 config.seed=0``."""
        return " ".join(f"{key}={json.dumps(value)}" for key, value in self.overrides.items()) or self.name


@dataclass(frozen=True)
class SweepJob:
    """One hand-over of members to the executor: a SLURM job array (task k runs ``members[k]``)."""

    job_id: str
    kind: str  # "submit" or "resume"
    members: tuple[str, ...]
    at: str
    max_parallel: int


@dataclass(frozen=True)
class SweepRecord:
    name: str
    executor: Executor
    max_parallel: int
    members: tuple[MemberRecord, ...]
    queue: tuple[dict[str, str], ...] = ()  # local: {"name", "at"} of members to hand over, in order
    scheduler: dict[str, Any] | None = None  # local: the scheduler process that works the queue
    jobs: tuple[SweepJob, ...] = ()
    problems: dict[str, str] = field(default_factory=dict)  # member name -> why it could not be handed over
    created_at: str = field(default_factory=now)
    updated_at: str = field(default_factory=now)
    version: int = FORMAT_VERSION

    def member(self, name: str) -> MemberRecord:
        return next(member for member in self.members if member.name == name)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> SweepRecord:
        """The record in ``data`` (sweep.json's content); :class:`FieldError` names the field that does not fit."""
        if isinstance(data, dict) and data.get("version") != FORMAT_VERSION:
            raise FieldError(f"has format version {data.get('version')!r}; this elfes reads {FORMAT_VERSION}")
        record = read_record(cls, data, choices=_FIELD_CHOICES)
        if record.max_parallel < 1:
            raise FieldError(f"max_parallel is {record.max_parallel}, not an integer >= 1")
        names = [member.name for member in record.members]
        for index, member in enumerate(record.members):
            if member.name in names[:index]:
                raise FieldError(f"members[{index}].name {member.name!r} repeats an earlier member's")
            if not os.path.isabs(member.run_dir):
                raise FieldError(f"members[{index}].run_dir {member.run_dir!r} is not an absolute path")
        for index, entry in enumerate(record.queue):
            for key in ("name", "at"):
                if key not in entry:
                    raise FieldError(f"queue[{index}] has no {key!r}")
            if entry["name"] not in names:
                raise FieldError(f"queue[{index}].name {entry['name']!r} is not a member of the sweep")
        for index, job in enumerate(record.jobs):
            unknown = [name for name in job.members if name not in names]
            if unknown:
                raise FieldError(f"jobs[{index}].members names {unknown[0]!r}, not a member of the sweep")
        return record


def is_sweep_dir(folder: str | os.PathLike[str]) -> bool:
    return SweepPaths(folder).record.is_file()


def load_sweep(paths: SweepPaths) -> SweepRecord:
    """The sweep recorded in ``paths``; RunDamaged when it cannot be read."""
    try:
        return SweepRecord.from_json(json.loads(paths.record.read_text(encoding="utf-8")))
    except (OSError, ValueError) as error:  # FieldError and JSON's errors are ValueErrors
        raise RunDamaged(f"{paths.record} cannot be read ({error}); elfes writes it atomically, so it was edited or "
                         "damaged: restore it (each member's own run directory is intact: `elfes status "
                         "SWEEP_DIR/MEMBER` shows one)") from None


def save_sweep(paths: SweepPaths, record: SweepRecord) -> None:
    write_text_atomically(paths.record, json.dumps(record.to_json(), indent=2) + "\n")


def sweep_lock(paths: SweepPaths) -> AbstractContextManager[None]:
    """Serialises writers of ``sweep.json`` (and a member's hand-over by the local scheduler)."""
    return exclusive_lock(paths.lock)


def update_sweep(paths: SweepPaths, change: Callable[[SweepRecord], SweepRecord]) -> SweepRecord:
    """Load, change and save ``sweep.json`` under its lock; inside :func:`sweep_lock` use :func:`change_sweep`
    (a second flock on another descriptor would wait for the first)."""
    with sweep_lock(paths):
        return change_sweep(paths, change)


def change_sweep(paths: SweepPaths, change: Callable[[SweepRecord], SweepRecord]) -> SweepRecord:
    """Load, change and save ``sweep.json``; the caller holds :func:`sweep_lock`."""
    before = load_sweep(paths)
    after = change(before)
    if after is not before:
        save_sweep(paths, dataclasses.replace(after, updated_at=now()))
    return after


def scheduler_alive(paths: SweepPaths) -> bool:
    """Whether a local scheduler holds the sweep's scheduler lock now (an exclusive ``flock``: the kernel
    releases it when the scheduler dies, however it dies). Writes nothing: the lock is asked for shared, on a
    read-only descriptor, so that looks do not exclude each other and a user who may only read the sweep sees
    the truth; a scheduler starting meanwhile waits for the look to end (:func:`take_scheduler_lock`)."""
    try:
        descriptor = os.open(paths.scheduler_lock, os.O_RDONLY)
    except FileNotFoundError:
        return False  # no scheduler ever started
    except OSError:
        return True  # cannot be told from here: not called stalled on a guess
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(descriptor)
    return False


def take_scheduler_lock(paths: SweepPaths, *, patience_s: float = 2.0) -> int | None:
    """The scheduler lock, taken (its descriptor), or None when a scheduler holds it. A look at the sweep
    (:func:`scheduler_alive`) holds it shared for a moment: that is waited out for up to ``patience_s``,
    whereas a scheduler holds it for its whole life."""
    descriptor = os.open(paths.scheduler_lock, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + patience_s
    while True:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return descriptor
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(descriptor)
                return None
            time.sleep(0.01)


def stall(paths: SweepPaths, record: SweepRecord) -> str | None:
    """Why the sweep is stalled, or None: members wait for a local slot and no scheduler is alive to start
    them (it was killed, crashed, or never started). ``elfes resume SWEEP_DIR`` starts one."""
    if not backend_for(record.executor).runs_here or not record.queue or scheduler_alive(paths):
        return None
    last = record.scheduler
    gone = (f"its scheduler (pid {last.get('pid')} on {last.get('host')}) is gone" if last
            else "no scheduler was started for it")
    return (f"stalled: {len(record.queue)} member(s) wait for a slot and {gone}, so none will start (its log: "
            f"{paths.scheduler_log}); `elfes resume {paths.sweep_dir}` starts a scheduler")


def member_paths(record: SweepRecord) -> list[RunPaths]:
    return [RunPaths(Path(member.run_dir)) for member in record.members]
