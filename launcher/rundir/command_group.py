"""A command job's processes as one: the command leads a session (and process group) of its own, so
what it starts (a wrapper's trainer) stays in its group; the task signals, watches and reaps the group.

Linux: ``/proc`` tells a process's group and signal handlers, and the task becomes a child subreaper
(``PR_SET_CHILD_SUBREAPER``) while the command runs, so a member whose parent died is re-parented to
the task (which reaps it and reads its exit code), not to pid 1. Torch-free.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True)
class ProcessStat:
    """What ``/proc/PID/stat`` says of a process: its state letter, parent, process group and session."""

    pid: int
    state: str
    parent: int
    group: int
    session: int

    @property
    def live(self) -> bool:
        return self.state not in ("Z", "X")  # a zombie has exited; only its parent's wait is left


def process_stat(pid: int) -> ProcessStat | None:
    """``/proc/PID/stat`` of ``pid``, or None when there is no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
        fields = text[text.rindex(")") + 2:].split()  # the command name in parentheses may hold spaces
        return ProcessStat(pid, fields[0], int(fields[1]), int(fields[2]), int(fields[3]))
    except (OSError, ValueError, IndexError):
        return None


def group_members(pgid: int) -> list[int]:
    """The live processes of this user in the session and process group ``pgid`` (a scan of ``/proc``)."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = process_stat(int(entry.name))
            if stat is not None and is_member(stat, pgid):
                members.append(stat.pid)
    return sorted(members)


def is_member(stat: ProcessStat, pgid: int) -> bool:
    """Whether a live process belongs to the command group ``pgid``: its session and group, and this user
    (a session id reused after the group ended belongs to someone else as a rule)."""
    if not stat.live or stat.group != pgid or stat.session != pgid:
        return False
    try:
        return Path(f"/proc/{stat.pid}").stat().st_uid == os.getuid()
    except OSError:
        return False


def group_exists(pgid: int) -> bool:
    """Whether any process (a zombie included) is still in process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # a member changed its user: it exists
    return True


def signal_group(pgid: int, signum: int) -> bool:
    """Send ``signum`` to every process of group ``pgid``; False when the group is gone."""
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True


@dataclass(frozen=True)
class Dispositions:
    """How the members of a group take each signal: the pids that catch it, and whether every member
    still takes its default action (no member has set the signal up yet: the command may be starting)."""

    members: tuple[int, ...]
    caught: dict[int, tuple[int, ...]]  # signal number -> pids with a handler
    untouched: dict[int, bool]  # signal number -> whether no member catches or ignores it

    def catches(self, signum: int) -> bool:
        return bool(self.caught.get(int(signum)))

    def untouched_by_all(self, signum: int) -> bool:
        return bool(self.members) and self.untouched.get(int(signum), False)


def dispositions(members: Iterable[int], signals: Iterable[int]) -> Dispositions:
    """What the ``members`` do with each of ``signals`` (``SigCgt``/``SigIgn`` of each)."""
    masks = {pid: found for pid in members if (found := signal_masks(pid)) is not None}
    caught, untouched = {}, {}
    for signum in map(int, signals):
        bit = 1 << (signum - 1)
        caught[signum] = tuple(pid for pid, (cgt, _) in masks.items() if cgt & bit)
        untouched[signum] = all(not (cgt | ign) & bit for cgt, ign in masks.values())
    return Dispositions(tuple(masks), caught, untouched)


class CommandGroup:
    """A command started as the leader of a new session; ``poll()`` reaps its members as they exit."""

    def __init__(self, argv: list[str], env: Mapping[str, str] | None = None) -> None:
        self.leader = subprocess.Popen(argv, cwd=os.getcwd(), env=env, start_new_session=True,
                                       preexec_fn=_dies_with_parent())
        self.pgid = self.leader.pid
        self.exit_codes: dict[int, int] = {}  # reaped member pid -> exit code (negative: killed by that signal)

    @property
    def leader_code(self) -> int | None:
        return self.exit_codes.get(self.pgid)

    def member_codes(self) -> list[int]:
        """The exit codes of the reaped members other than the leader, in the order they were reaped."""
        return [code for pid, code in self.exit_codes.items() if pid != self.pgid]

    def poll(self) -> bool:
        """Reap what exited; True while the leader or another member is alive."""
        while True:
            try:
                pid, status = os.waitpid(-self.pgid, os.WNOHANG)
            except ChildProcessError:
                break  # no child left in the group (a member that is not the task's child may be)
            if pid == 0:
                break
            self.exit_codes[pid] = os.waitstatus_to_exitcode(status)
            if pid == self.pgid:
                self.leader.returncode = self.exit_codes[pid]  # reaped here: Popen must not wait for it
        return self.leader_code is None or group_exists(self.pgid)

    def members(self) -> list[int]:
        return group_members(self.pgid)

    def signal(self, signum: int) -> bool:
        return signal_group(self.pgid, signum)


@contextmanager
def child_subreaper() -> Iterator[None]:
    """While the block runs, orphaned descendants of this process are re-parented to it (Linux)."""
    prctl = _prctl()
    if prctl is not None:
        prctl(_PR_SET_CHILD_SUBREAPER, 1)
    try:
        yield
    finally:
        if prctl is not None:
            prctl(_PR_SET_CHILD_SUBREAPER, 0)


def _prctl() -> Callable[..., int] | None:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _dies_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the command's leader get SIGTERM when this task dies (Linux
    ``PR_SET_PDEATHSIG``): a task killed by the local controller (or by hand) leaves no wrapper behind;
    what the wrapper started is still counted by the run's liveness (its process group) until it ends."""
    prctl = _prctl()  # resolved here: the forked child only calls it
    if prctl is None:
        return None
    parent = os.getpid()

    def set_parent_death_signal() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:  # the task died before the call
            os.kill(os.getpid(), signal.SIGTERM)

    return set_parent_death_signal


def signal_masks(pid: int) -> tuple[int, int] | None:
    """The signals process ``pid`` catches and those it ignores, as bit masks (bit ``n - 1`` for signal
    ``n``; ``/proc/PID/status`` ``SigCgt`` and ``SigIgn``); None when that cannot be read."""
    try:
        status = Path(f"/proc/{pid}/status").read_text(encoding="ascii")
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    try:
        return int(fields["SigCgt"], 16), int(fields["SigIgn"], 16)
    except (KeyError, ValueError):
        return None
