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

from elfes.contract import START_EVENTS

from ..backends import backend_for
from ..rundir import state as run_state
from ..rundir.lookup import UsageError
from ..rundir.state import RunStatus
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
                f"see elfes logs {run}" + ("" if self.status == RunStatus.FINISHED else f"; continue: elfes resume {run}"))


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
            if event.get("event") in START_EVENTS:
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
        return progress.step is not None and until.step is not None and progress.step >= until.step
    attempt = state.last_attempt if state is not None else None
    if state is None or state.status != RunStatus.RUNNING or attempt is None or attempt.ended:
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


@dataclass(frozen=True)
class SweepWaited:
    """How a wait for a sweep ended: every member ``reached`` the point, or why not (``timed_out``, a member
    that ended before it, one whose state cannot be read, or a ``stalled`` sweep: waiting members and no
    scheduler to start them)."""

    sweep_dir: str
    until: Until
    reached: bool
    timed_out: bool
    counts: dict[str, int]
    why: str | None = None  # what stopped the wait before every member reached the point
    stalled: bool = False
    unreadable: bool = False

    def describe(self) -> str:
        counts = ", ".join(f"{status} {count}" for status, count in self.counts.items() if status != "total")
        if self.reached:
            return f"{self.sweep_dir}: every member reached {self.until} ({counts})"
        if self.timed_out:
            return (f"{self.sweep_dir}: not every member is at {self.until} when --timeout-s ran out ({counts}); "
                    f"wait longer, or see elfes status {shlex.quote(self.sweep_dir)}")
        return f"{self.sweep_dir}: {self.why}"


def _member_reached(until: Until, member: Any) -> bool | None:
    """Whether a member (a sweep_status.MemberStatus) is at ``until``: True, False (not yet), None (it never
    will be: it ended, or was left out, short of it)."""
    from ..rundir.sweep_status import NOT_STARTED

    over = member.status in run_state.ENDED or member.status == NOT_STARTED
    if until.kind == "ended":
        return over
    if until.kind == "step":
        if member.step is not None and member.step >= until.step:
            return True
        return None if over else False
    trained = member.step is not None or member.status in (RunStatus.RUNNING, RunStatus.STOPPING)
    return True if trained else (None if over else False)


def wait_for_sweep(sweep_dir: str | os.PathLike[str], until: Until, *, deadline: float | None = None,
                   interval_s: float | None = None) -> SweepWaited:
    """Wait until every member of the sweep reaches ``until`` (``ended``: finished, stopped, failed, cancelled,
    or left out; ``step=N``: its records reached step N; ``training``: it trains or has trained), or a member
    ends short of it, cannot be read, the sweep stalls, or ``time.monotonic()`` passes ``deadline``. Reads
    files (one squeue per look for a SLURM sweep, every 5 s); writes nothing."""
    from ..rundir.sweep_status import UNREADABLE, sweep_status

    while True:
        status = sweep_status(sweep_dir)
        counts = status.counts
        found = {member.name: _member_reached(until, member) for member in status.members}
        if all(found.values()):
            return SweepWaited(str(sweep_dir), until, True, False, counts)
        unreadable = [member for member in status.members if member.status == UNREADABLE]
        if unreadable:
            return SweepWaited(str(sweep_dir), until, False, False, counts, unreadable=True,
                               why=f"member {unreadable[0].name} is unreadable ({unreadable[0].error}), so the "
                               "wait cannot tell where it is")
        short = [name for name, reached in found.items() if reached is None]
        if short:
            member = next(member for member in status.members if member.name == short[0])
            return SweepWaited(str(sweep_dir), until, False, False, counts,
                               why=f"member {member.name} ended {member.status} before {until}")
        if status.stalled:
            return SweepWaited(str(sweep_dir), until, False, False, counts, stalled=True, why=status.stalled)
        if deadline is not None and time.monotonic() >= deadline:
            return SweepWaited(str(sweep_dir), until, False, True, counts)
        time.sleep(interval_s if interval_s is not None else backend_for(status.executor).status_poll_s)
