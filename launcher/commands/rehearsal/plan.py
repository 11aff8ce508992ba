"""Planning the moments of ``elfes rehearse``: how long the job really is (from what every run has:
``state.json``, the checkpoint files, and ``events.jsonl`` where the job keeps one), and at which steps
the interruptions go, with slack before the last update; earlier ones when a pass is retried.
Torch-free.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from elfes.contract import CheckpointName, EventKind, Pointer, SaveReason

from ...errors import EXIT_RUN_FAILED, ElfesError
from ...rundir import state as run_state
from ...rundir.paths import RunPaths

# The slack kept after the latest planned moment: a follower on a loaded machine sees a step late.
SLACK_FRACTION = 0.25
MIN_SLACK_UPDATES = 2


class RehearsalFailed(ElfesError, RuntimeError):
    """A run of the rehearsal did not finish (it failed, or a phase timed out): no verdict."""

    exit_code = EXIT_RUN_FAILED


@dataclass(frozen=True)
class PlannedInterruption:
    kind: str
    step: int  # interrupt once the run has reached this step...
    fraction: float  # ...and this fraction of one update's time later (mid-window)


@dataclass(frozen=True)
class RunLength:
    """What the first straight run shows of the job's length and pace."""

    final_step: int
    update_time_s: float  # seconds per optimizer update
    startup_s: float  # seconds from an attempt's start to its first update (used without records)
    checkpoint_steps: tuple[int, ...]  # the interval and best checkpoints it wrote (a kill aims at their writes)
    records: bool  # it logged train records: a follower sees the steps as they come


def candidate_steps(final_step: int, retry: int = 0) -> range:
    """The steps an interruption may aim at: 1 up to the last one that leaves the slack before
    ``final_step``; each retry halves that span, so its moments come earlier."""
    slack = max(MIN_SLACK_UPDATES, math.ceil(final_step * SLACK_FRACTION))
    return range(1, max(1, (final_step - slack) // (2 ** retry)) + 1)


def plan_interruptions(count: int, kinds: Sequence[str], steps: Sequence[int], seed: int) -> list[PlannedInterruption]:
    """``count`` interruptions spread over ``steps`` (see :func:`candidate_steps`), one per equal segment
    at a seeded random step in it and a random moment within the next update; the kinds cycled so that
    each one occurs."""
    rng = random.Random(seed)
    order = [kinds[i % len(kinds)] for i in range(count)]
    rng.shuffle(order)
    steps = sorted(set(steps)) or [1]
    planned = []
    for index, kind in enumerate(order):
        low = (len(steps) * index) // count
        high = max(low, (len(steps) * (index + 1)) // count - 1)
        planned.append(PlannedInterruption(kind, steps[rng.randint(low, high)], round(rng.random(), 3)))
    return planned


def measure_length(run_dir: Path) -> RunLength:
    """The :class:`RunLength` of a finished straight run; :class:`RehearsalFailed` when nothing it left says
    how many updates it made."""
    paths = RunPaths(run_dir)
    state = run_state.load_state(paths)
    attempt = state.last_attempt if state is not None else None
    events = read_events_if_any(paths)
    train = [(int(e["step"]), timestamp(e["time"])) for e in events if e.get("event") == EventKind.TRAIN]
    files = checkpoint_files(paths)
    final = next((step for step in (attempt.step if attempt else None,
                                    max((s for s, _ in files), default=None),
                                    max((s for s, _ in train), default=None)) if step), None)
    if final is None:
        raise RehearsalFailed(f"{run_dir} finished without saying how far it trained: no step in state.json, no "
                              "checkpoint file and no train record; a rehearsal needs the job to checkpoint with the "
                              "engine (Trainer.train(checkpoint_dir=job.checkpoint_dir)) or to log with RunLogger")
    started = timestamp(attempt.started_at) if attempt else None
    ended = timestamp(attempt.ended_at) if attempt and attempt.ended_at else None
    if len(train) >= 2 and train[-1][0] > train[0][0]:
        update_time = (train[-1][1] - train[0][1]) / (train[-1][0] - train[0][0])
    elif len(files) >= 2 and files[-1][0] > files[0][0]:
        update_time = (files[-1][1] - files[0][1]) / (files[-1][0] - files[0][0])
    elif started is not None and ended is not None:
        update_time = (ended - started) / final
    else:
        update_time = 0.05
    first = files[0] if files else None
    startup = (first[1] - started - first[0] * update_time) if first and started is not None else 0.0
    written = [int(e["step"]) for e in events if e.get("event") == EventKind.CHECKPOINT and e.get("reason") in (SaveReason.INTERVAL, SaveReason.BEST)]
    if not events:
        written = [step for step, _ in files if step < final]
    return RunLength(final, max(0.0, update_time), max(0.0, startup), tuple(written), records=bool(train))


def read_events_if_any(paths: RunPaths) -> list[dict[str, Any]]:
    """The run's records, or none where the job keeps no ``events.jsonl`` (no RunLogger)."""
    from elfes.records import read_events

    return read_events(paths.run_dir) if paths.events.is_file() else []


def checkpoint_files(paths: RunPaths) -> list[tuple[int, float]]:
    """(step, modification time) of each published checkpoint file, oldest step first."""
    found = []
    try:
        entries = list(paths.checkpoints.iterdir())
    except OSError:
        return []
    for entry in entries:
        name = CheckpointName.parse(entry.name)
        if name is not None:
            try:
                found.append((name.step, entry.stat().st_mtime))
            except OSError:
                continue  # removed by retention meanwhile
    return sorted(found)


def pointer_step(paths: RunPaths, pointer: Pointer = Pointer.LAST) -> int | None:
    """The step of the checkpoint a pointer (``last``) names, or None where there is none."""
    try:
        name = CheckpointName.parse(Path((paths.checkpoints / pointer).readlink()).name)
    except OSError:
        return None
    return name.step if name is not None else None


def timestamp(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()
