"""``elfes status --wait``: block until runs reach a point (training, a step, their end), reading their
files only, so that a script can act at the right moment (``elfes preempt`` once the loop runs).

Torch-free.
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..rundir import state as run_state
from ..rundir.lookup import UsageError
from .logs import watch

UNTIL_FORMS = "training, step=N or ended"


@dataclass(frozen=True)
class Until:
    """What to wait for: ``training`` (the latest attempt's training loop runs), ``step`` (the run's
    records reached optimizer step ``step``) or ``ended`` (the run finished, stopped, failed or was cancelled)."""

    kind: str
    step: int | None = None

    @classmethod
    def parse(cls, text: str) -> Until:
        """``training``, ``ended``, ``step=N`` (or ``step:N``); UsageError naming the forms otherwise."""
        kind, _, number = text.strip().replace(":", "=").partition("=")
        if kind in ("training", "ended") and not number:
            return cls(kind)
        if kind == "step" and number.strip().isdigit():
            return cls("step", int(number))
        raise UsageError(f"--until {text!r} is not a point to wait for; give one of {UNTIL_FORMS} "
                         "(e.g. --until step=40)")

    def __str__(self) -> str:
        return f"step {self.step}" if self.kind == "step" else self.kind


@dataclass(frozen=True)
class Waited:
    """How a wait for one run ended: ``reached``, or why not (``timed_out``, or the run ended first)."""

    run_dir: str
    until: Until
    reached: bool
    timed_out: bool
    status: str
    step: int | None

    def describe(self) -> str:
        run = shlex.quote(self.run_dir)
        at = "" if self.step is None else f" at step {self.step}"
        if self.reached:
            return f"{self.run_dir}: {self.until} reached ({self.status}{at})"
        if self.timed_out:
            return (f"{self.run_dir}: still {self.status}{at}, not yet {self.until}, when --timeout-s ran out; "
                    f"wait longer, or see elfes logs {run}")
        return (f"{self.run_dir}: the run ended {self.status}{at} before {self.until}; "
                f"see elfes logs {run}" + ("" if self.status == "finished" else f"; continue: elfes resume {run}"))


class _Progress:
    """What the run records said so far: the latest step and the time of the latest training start."""

    def __init__(self) -> None:
        self.step: int | None = None
        self.started_at: datetime | None = None

    def read(self, events: Iterable[Mapping[str, Any]]) -> None:
        for event in events:
            state = event.get("state")
            step = event.get("step", state.get("step") if isinstance(state, Mapping) else None)
            if isinstance(step, int):
                self.step = step
            if event.get("event") in ("started", "resumed"):
                self.started_at = _time(event.get("time"))


def _time(text: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None


def _reached(until: Until, state: run_state.RunState | None, ended: bool, progress: _Progress) -> bool:
    if until.kind == "ended":
        return ended
    if until.kind == "step":
        return progress.step is not None and progress.step >= until.step
    attempt = state.last_attempt if state is not None else None
    if state is None or state.status != "running" or attempt is None or attempt.ended:
        return False
    started = _time(attempt.started_at)
    # The loop of this attempt logged its start (and its StopRequest catches signals from then on).
    return progress.started_at is not None and started is not None and progress.started_at >= started


def wait_for(run_dir: str | os.PathLike[str], until: Until, *, deadline: float | None = None,
             interval_s: float = 0.5) -> Waited:
    """Wait until the run reaches ``until``, ends without reaching it, or ``time.monotonic()`` passes
    ``deadline``. Reads files (and asks SLURM, as ``elfes status`` does); writes nothing."""
    progress = _Progress()
    status = "unknown"
    for snapshot in watch(run_dir, from_start=True, interval_s=interval_s):
        progress.read(snapshot.events)
        status = snapshot.state.status if snapshot.state is not None else "unknown"
        reached = _reached(until, snapshot.state, snapshot.ended, progress)
        if reached or snapshot.ended or (deadline is not None and time.monotonic() >= deadline):
            return Waited(str(run_dir), until, reached, timed_out=not reached and not snapshot.ended,
                          status=status, step=progress.step)
    raise AssertionError("watch() ends with an ended snapshot")  # pragma: no cover
