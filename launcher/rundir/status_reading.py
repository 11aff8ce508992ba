"""Reading many runs' status fast: one /proc scan for all of them (:class:`ProcessTable`), liveness asked
only of runs that have not ended (:func:`run_liveness`), and the run records summarised from the head
and the tail of ``events.jsonl`` only (:func:`summary_from_ends`), never the whole log.

Torch-free; reads files (and asks SLURM for runs that have not ended), writes nothing.
"""

from __future__ import annotations

import json
import os
import socket
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any, TypeGuard

from ..backends import backend_for
from ..slurm import SlurmQueue
from . import state as run_state
from .liveness import CONTROLLER_MODULES, TASK_MODULE, Liveness, liveness
from .paths import RunPaths
from .state import RunStatus
from .task_files import command_records

HEAD_BYTES = 64 * 1024  # the start event (name, budget) is at the top
TAIL_BYTES = 256 * 1024  # the latest progress, evaluation, checkpoint and start events

_MODULES = {**dict.fromkeys(CONTROLLER_MODULES, "controller"), TASK_MODULE: "task"}


class ProcessTable:
    """submitit's local controllers and tasks on this machine, by the real path of their folder: /proc is
    scanned once, on the first question (never when no run needs it)."""

    def __init__(self) -> None:
        self._by_folder: dict[str, dict[str, list[int]]] | None = None

    @classmethod
    def snapshot(cls) -> ProcessTable:
        return cls()

    def _scan(self) -> dict[str, dict[str, list[int]]]:
        found: dict[str, dict[str, list[int]]] = defaultdict(lambda: {"controller": [], "task": []})
        try:
            entries = os.listdir("/proc")
        except OSError:
            entries = []
        for entry in entries:
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as stream:
                    raw = stream.read()
            except OSError:
                continue
            if b"submit" not in raw:  # in the name of every module above
                continue
            parts = [part.decode(errors="replace") for part in raw.split(b"\0") if part]
            kind = next((kind for module, kind in _MODULES.items() if module in parts), None)
            if kind is None or _zombie(entry):
                continue
            found[os.path.realpath(parts[-1])][kind].append(int(entry))
        return dict(found)

    def of(self, paths: RunPaths) -> dict[str, list[int]]:
        if self._by_folder is None:
            self._by_folder = self._scan()
        return self._by_folder.get(os.path.realpath(paths.submitit), {"controller": [], "task": []})

    def alive(self, paths: RunPaths) -> bool:
        processes = self.of(paths)
        return bool(processes["controller"] or processes["task"])


def _zombie(pid: str) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2:].startswith(("Z", "X"))


def needs_liveness(state: run_state.RunState | None) -> TypeGuard[run_state.RunState]:
    """Whether the run's job may still be queued or alive: not for a run that ended, except a SLURM run that
    stopped (it waits for SLURM to end it, which may requeue it) or was cancelled (a cancel can race SLURM's
    requeue of the job: ``squeue`` and ``sacct`` tell whether it is gone)."""
    if state is None or state.job_id is None:
        return False
    lingers = backend_for(state.executor).outlives_its_end and state.status in (RunStatus.STOPPED, RunStatus.CANCELLED)
    return state.status not in run_state.ENDED or lingers


def run_liveness(paths: RunPaths, state: run_state.RunState | None, processes: ProcessTable | None,
                 queue: SlurmQueue | None = None) -> Liveness:
    """:func:`launcher.rundir.liveness.liveness`, but nothing asked for a run that ended, a local run looked up
    in ``processes`` (one /proc scan for many runs) and a SLURM run in ``queue`` (one squeue) when given."""
    here = state is not None and backend_for(state.executor).runs_here
    commands = here and bool(command_records(paths, host=socket.gethostname()))
    if commands:
        return liveness(paths, state)  # a command's process group may outlive its task: look for its members
    if not needs_liveness(state):
        return Liveness(None, None)
    if here and processes is not None:
        alive = processes.alive(paths)
        return Liveness(alive, "RUNNING" if alive else "GONE")
    return liveness(paths, state, None if here else queue)


def _lines(data: bytes, *, drop_first: bool, drop_last: bool) -> list[dict[str, Any]]:
    lines = data.split(b"\n")
    if drop_first:
        lines = lines[1:]  # cut mid-line by the read's start
    if drop_last:
        lines = lines[:-1]
    events = []
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue  # empty, or torn by a kill
        if isinstance(event, dict) and "event" in event:
            events.append(event)
    return events


def end_events(file: Path) -> list[dict[str, Any]]:
    """The events in the first ``HEAD_BYTES`` and the last ``TAIL_BYTES`` of ``file`` (all of a small file),
    oldest first; [] when it does not exist."""
    try:
        with open(file, "rb") as stream:
            size = os.fstat(stream.fileno()).st_size
            if size <= HEAD_BYTES + TAIL_BYTES:
                return _lines(stream.read(), drop_first=False, drop_last=False)
            head = stream.read(HEAD_BYTES)
            stream.seek(size - TAIL_BYTES)
            tail = stream.read(TAIL_BYTES)
    except OSError:
        return []
    return _lines(head, drop_first=False, drop_last=True) + _lines(tail, drop_first=True, drop_last=False)


def summary_from_ends(paths: RunPaths) -> Any:
    """``elfes.records.summarize`` of the head and tail events: the latest progress, budget, best metric,
    monitor and checkpoint (counts over the whole run are not kept); None before the first event."""
    from elfes.records import summarize

    events = end_events(paths.events)
    if not events:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return summarize(events)


def recorded_name(paths: RunPaths) -> str | None:
    """The job name in the run's recorded ``job.yaml`` (:func:`launcher.rundir.lookup.recorded_data`: the C safe
    loader, without validating the whole spec); None without a recorded spec. ValueError when it cannot be read."""
    from .lookup import recorded_data

    data = recorded_data(paths)
    if data is None:
        return None
    name = data.get("name")
    if not isinstance(name, str):
        raise ValueError("no name")
    return name
