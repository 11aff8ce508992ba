"""A ``command:`` job inside the task: the command runs as the leader of a process group of its own
(launcher/rundir/command_group.py) and owns its ``StopRequest``; the task forwards the stop signals to the
whole group, reaps it, and reads the exit code (0 finished, 128 + a stop signal's number paused,
anything else failed; see :func:`~launcher.job.outcome.command_stop_reason`).

What the group catches decides each delivery (``SigCgt`` of every member, since a wrapper's trainer
is the one that catches):

* a signal some member catches is sent at once;
* the requeue signal, when no member catches it but one catches SIGTERM (``StopRequest().catch_signals()``
  catches SIGINT and SIGTERM), is sent as SIGTERM, and an exit 128 + SIGTERM is the requeue asked for;
* a signal that no member catches or ignores yet (the command may be importing torch, when the default
  action would end it) is held, saying so at once (the run's log, ``elfes status``), for at most
  FORWARD_HOLD_S after the command started; then it is sent anyway. A cancel (``elfes cancel``'s
  SIGTERM) is never held: the command ends now, cancelled, even when its default action kills it.

A SIGTERM or SIGINT stop that the group outlives by ``kill_wait_s`` ends in SIGKILL on the local
executor (SLURM escalates by itself, after its KillWait). Members left running after the leader ended
by itself get SIGTERM, then SIGKILL after ``kill_wait_s``: no process of an attempt outlives it.
Torch-free.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from elfes.contract import TERMINATING_SIGNALS, EventKind

from ..backends import Executor, backend_for
from ..rundir.command_group import (
    CommandGroup,
    Dispositions,
    child_subreaper,
    dispositions,
    group_members,
    signal_group,
)
from ..rundir.paths import RunPaths
from ..rundir.task_files import command_records, remove_command_record, write_command_record
from ..submit.scripts import requeue_signal
from .outcome import Delivery, command_stop_reason
from .signals import SignalFlags

# A command job's group gets a stop signal once a member catches it (it may be importing torch, when
# the default action would kill it), or after this long anyway.
FORWARD_HOLD_S = 60.0
# How often the waiting loop looks at its flags and reaps.
POLL_S = 0.05
# How often a held signal looks at the group's members again (a scan of /proc).
RESCAN_S = 0.25

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CommandEnd:
    """How a command ended: the stop reason (as ``decide`` takes it), the step the run's records say it
    saved, and a note for the attempt's record (why a stop ended as it did), if any."""

    stop_reason: str | None
    step: int | None
    note: str | None = None


def run_command(
    argv: list[str],
    *,
    paths: RunPaths,
    flags: SignalFlags,
    executor: Executor,
    started_at: str,
    rank: int,
    attempt: int,
    kill_wait_s: int,
    watching: Callable[[Callable[[], str | None]], AbstractContextManager[object]],
    cancelling: Callable[[], bool] = lambda: False,
) -> CommandEnd:
    """Run ``argv`` to the end of its whole process group, forwarding stop signals.

    ``watching(probe)``: a context that marks the run "stopping" once ``probe`` names a signal (rank 0).
    ``cancelling()``: whether ``elfes cancel`` asked for this stop; a cancel's SIGTERM is never held.
    """
    end_leftover_group(paths, rank, kill_wait_s)
    with child_subreaper():
        group = CommandGroup(argv, env=command_environment())
        record = {"pgid": group.pgid, "host": socket.gethostname(), "attempt": attempt}
        write_command_record(paths, rank, record)
        forwarding = _Forwarding(group, flags, executor=executor, kill_wait_s=kill_wait_s,
                                 announce=lambda notice: write_command_record(paths, rank, {**record, "notice": notice}),
                                 cancelling=cancelling)
        try:
            with watching(lambda: flags.received[0].name if flags.received else None):
                while group.poll():
                    forwarding.step()
                    time.sleep(POLL_S)
        finally:
            if group.poll():  # an exception in this loop: no member outlives the task
                group.signal(signal.SIGKILL)
                while group.poll():
                    time.sleep(POLL_S)
            remove_command_record(paths, rank)
    ending = ending_from_events(paths, started_at)
    reason, note = command_stop_reason(
        forwarding.exit_code(), stop_signal_names=[signum.name for signum in flags.signals],
        delivered=forwarding.delivered, held=[signum.name for signum in forwarding.pending],
        records_finished=ending is not None and ending[0] == EventKind.FINISHED,
        kill_wait_s=kill_wait_s if forwarding.killed_a_stop else None)
    if note:
        _say(note)
    return CommandEnd(reason, ending[1] if ending is not None else None, note)


def command_environment() -> dict[str, str]:
    """The task's environment with the job's interpreter's folder first on PATH: a command's bare ``python``
    or ``torchrun`` is the job's own, also where its virtual environment was never activated."""
    path = os.environ.get("PATH", os.defpath)
    return {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), path])}


class _Forwarding:
    """The stop signals this task received, on their way to the command's group; the kill deadline."""

    def __init__(self, group: CommandGroup, flags: SignalFlags, *, executor: Executor, kill_wait_s: int,
                 announce: Callable[[str | None], None], cancelling: Callable[[], bool] = lambda: False) -> None:
        self.group, self.flags, self.backend, self.kill_wait_s = group, flags, backend_for(executor), kill_wait_s
        self.announce, self.cancelling = announce, cancelling
        self.requeue = requeue_signal()
        self.started = time.monotonic()
        self.seen = 0
        self.pending: list[signal.Signals] = []
        self.delivered: list[Delivery] = []
        self.sent: set[int] = set()
        self.kill_at: float | None = None  # when the group gets SIGKILL
        self.kill_ends_a_stop = False  # whether that kill ends a stop the command outlived (not leftovers)
        self.killed_a_stop = False
        self.leader_handled = False
        self.notice: str | None = None
        self.next_scan = 0.0

    def step(self) -> None:
        self.pending += self.flags.received[self.seen:]
        self.seen = len(self.flags.received)
        if self.pending and time.monotonic() >= self.next_scan:
            view = dispositions(self.group.members(), self.flags.signals)
            self.pending = [signum for signum in self.pending if not self._deliver(signum, view)]
            self.next_scan = time.monotonic() + (RESCAN_S if self.pending else 0.0)
            self._announce(self.pending, view)
        if self.group.leader_code is not None and not self.leader_handled:
            self.leader_handled = True
            self._leader_ended()
        if self.kill_at is not None and time.monotonic() >= self.kill_at:
            self.kill_at = None
            members = self.group.members()
            if members and self.group.signal(signal.SIGKILL):
                self.killed_a_stop = self.kill_ends_a_stop
                if self.killed_a_stop:
                    self.sent.add(int(signal.SIGKILL))
                _say(f"the command's processes {members} are still running {self.kill_wait_s} s after SIGTERM "
                     "(resources.kill_wait_s): sent SIGKILL")

    def _ended_by_itself(self) -> bool:
        """Whether the leader exited other than of a signal sent to the group (it ended by itself)."""
        code = self.group.leader_code
        return code is not None and -code not in self.sent

    def _deliver(self, requested: signal.Signals, view: Dispositions) -> bool:
        """Send ``requested`` (or its stand-in) to the group if it is time; True once it is handled."""
        if requested == signal.SIGINT and self.backend.signals_every_process:
            return True  # SLURM signals every process of the step; a second SIGINT would interrupt the save
        if self._ended_by_itself():
            return True  # the command is over; what it left running is being ended
        sent = requested
        if view.members and not view.catches(requested):
            if requested == self.requeue and view.catches(signal.SIGTERM):
                sent = signal.SIGTERM
                _say(f"the command catches SIGTERM but not {requested.name} (StopRequest().catch_signals() catches "
                     f"SIGINT and SIGTERM): sent SIGTERM for {requested.name}; when the command exits "
                     f"{128 + signal.SIGTERM} (128 + SIGTERM) after saving `last`, the requeue that "
                     f"{requested.name} asked for goes ahead")
            elif view.untouched_by_all(requested) and requested.name in TERMINATING_SIGNALS and self.cancelling():
                _say(f"{requested.name} (elfes cancel): no process of the command catches it; sent at once, as a "
                     "cancel is not held (its default action ends the command without saving)")
            elif view.untouched_by_all(requested) and time.monotonic() - self.started < FORWARD_HOLD_S:
                return False
            elif view.untouched_by_all(requested):
                _say(f"{requested.name}: no process of the command caught it within {FORWARD_HOLD_S:.0f} s of its "
                     f"start; sent anyway (its default action ends the command without saving)")
        self.group.signal(sent)
        self.delivered.append(Delivery(requested.name, sent.name))
        self.sent.add(int(sent))
        if requested.name in TERMINATING_SIGNALS and not self.backend.kills_stragglers and self.kill_at is None:
            self.kill_at, self.kill_ends_a_stop = time.monotonic() + self.kill_wait_s, True
            _say(f"sent {sent.name} to the command's process group {self.group.pgid}; SIGKILL follows in "
                 f"{self.kill_wait_s} s (resources.kill_wait_s) unless it has exited by then")
        return True

    def _announce(self, held: list[signal.Signals], view: Dispositions) -> None:
        """Say at once (the log, and the command record that ``elfes status`` reads) what is held and why."""
        notice = None
        if held:
            names = " nor ".join(dict.fromkeys(
                [held[0].name, *(["SIGTERM"] if held[0] == self.requeue else [])]))
            notice = (f"{held[0].name} is held: no process of the command (pids {list(view.members)}) catches "
                      f"{names} yet (it may still be starting); it is sent once one does, or "
                      f"{FORWARD_HOLD_S:.0f} s after the command started, when its default action ends the command "
                      "without saving. A command job catches SIGTERM and the requeue signal, e.g. "
                      "StopRequest().catch_signals(signals=(signal.SIGINT, signal.SIGTERM, signal.SIGUSR2))")
        if notice != self.notice:
            self.notice = notice
            self.announce(notice)
            if notice is not None:
                _say(notice)

    def _leader_ended(self) -> None:
        """The leader exited: members it leaves behind finish a stop it died of, or are ended."""
        members = self.group.members()
        if not members:
            return
        if not self._ended_by_itself():
            return  # a wrapper ended by the signal the trainer catches: the trainer saves and exits
        self.group.signal(signal.SIGTERM)
        self.kill_at, self.kill_ends_a_stop = time.monotonic() + self.kill_wait_s, False
        _say(f"the command (pid {self.group.pgid}) ended with code {self.group.leader_code}, leaving processes "
             f"{members} of its group running: sent SIGTERM, SIGKILL follows in {self.kill_wait_s} s "
             "(resources.kill_wait_s)")

    def exit_code(self) -> int:
        """The command's exit code: its leader's, or, when the leader (a wrapper) died of a signal sent
        to the group, the protocol exit of the member that caught it (0 or 128 + a stop signal)."""
        code = self.group.leader_code
        assert code is not None
        if self._ended_by_itself():
            return code
        stop_codes = {128 + int(signum) for signum in self.flags.signals}
        members = self.group.member_codes()
        for wanted in (stop_codes, {0}):
            found = [member for member in members if member in wanted]
            if found:
                return found[-1]
        return -signal.SIGKILL if self.killed_a_stop else code


def end_leftover_group(paths: RunPaths, rank: int, kill_wait_s: int) -> None:
    """End what an earlier task of this rank left running (it was killed before reaping its command), so
    that two trainers never write one run: SIGTERM, then SIGKILL after ``kill_wait_s``."""
    for record in command_records(paths, host=socket.gethostname()):
        if record.get("rank") != rank or not group_members(record["pgid"]):
            continue
        pgid = record["pgid"]
        _say(f"processes {group_members(pgid)} of the command of attempt {record.get('attempt')} (process group "
             f"{pgid}) are still running: sent SIGTERM, SIGKILL follows in {kill_wait_s} s")
        signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + kill_wait_s
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(RESCAN_S)
        if group_members(pgid):
            signal_group(pgid, signal.SIGKILL)
        while group_members(pgid):
            time.sleep(POLL_S)


def ending_from_events(paths: RunPaths, since: str) -> tuple[str, int | None] | None:
    """The latest ``stopped``/``finished`` record written after ``since`` (by the command's own
    trainer), as (the event, its step), or None."""
    try:
        lines = paths.events.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return None
    for line in reversed(lines):
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a line torn by a kill
        if event.get("event") in (EventKind.STOPPED, EventKind.FINISHED) and str(event.get("time", "")) >= since:
            return event["event"], (event.get("state") or {}).get("step")
    return None


def saved_step_from_events(paths: RunPaths, since: str) -> int | None:
    """The step of the latest ``stopped``/``finished`` record written after ``since``, or None."""
    ending = ending_from_events(paths, since)
    return ending[1] if ending is not None else None


def _say(message: str) -> None:
    log.warning(f"elfes: {message}")
