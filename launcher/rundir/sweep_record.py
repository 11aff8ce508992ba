"""``sweep.json``: a sweep's members, the jobs that ran them and the members waiting for a local slot.
Torch-free; read by any process without a lock, changed only through :func:`update_sweep` (a
read-modify-write under ``.sweep.lock``, published atomically).

Each member's own state stays in its run directory (``state.json``): this file never repeats it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elfes.files import exclusive_lock, write_text_atomically

from .paths import RunPaths, SweepPaths
from .state import StateError, now

FORMAT_VERSION = 1


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
    executor: str
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
    def from_json(cls, data: dict[str, Any]) -> SweepRecord:
        if data.get("version") != FORMAT_VERSION:
            raise StateError(f"sweep.json has format version {data.get('version')!r}; this elfes reads {FORMAT_VERSION}")
        data = dict(data)
        data["members"] = tuple(MemberRecord(**member) for member in data["members"])
        data["jobs"] = tuple(SweepJob(**{**job, "members": tuple(job["members"])}) for job in data.get("jobs", ()))
        data["queue"] = tuple(data.get("queue", ()))
        return cls(**data)


def is_sweep_dir(folder: str | os.PathLike[str]) -> bool:
    return SweepPaths(folder).record.is_file()


def load_sweep(paths: SweepPaths) -> SweepRecord:
    """The sweep recorded in ``paths``; StateError when it cannot be read."""
    try:
        return SweepRecord.from_json(json.loads(paths.record.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError, KeyError) as error:
        raise StateError(f"{paths.record} cannot be read ({error}); it is written atomically, so it was edited or "
                         "removed; restore it") from None


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


def member_paths(record: SweepRecord) -> list[RunPaths]:
    return [RunPaths(Path(member.run_dir)) for member in record.members]
