"""A command's process group (launcher/rundir/command_group.py) and what its exit means
(launcher/job/outcome.py ``command_stop_reason``): real processes, no job."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest
from waiting import wait_until

from elfes.launcher.job.outcome import Delivery, command_stop_reason
from elfes.launcher.rundir.command_group import CommandGroup, child_subreaper, dispositions, group_members, process_stat

WRAPPER = str(Path(__file__).resolve().parent / "forwarding_nothing.sh")
NAMES = ("SIGINT", "SIGTERM", "SIGUSR2")
# A trainer that catches SIGTERM (exit 143 once it arrives) and ignores SIGUSR2; it says when it is ready.
TRAINER = ("import signal, sys, time\n"
           "signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))\n"
           "signal.signal(signal.SIGUSR2, signal.SIG_IGN)\n"
           "print('ready', flush=True)\n"
           "time.sleep(120)\n")


def test_a_wrappers_trainer_stays_in_the_group_and_is_reaped_with_its_code(tmp_path: Path) -> None:
    """The wrapper is SIGKILLed: its trainer is re-parented to this process (a subreaper), is still a
    member of the group, takes the group's SIGTERM, and its exit code is read here."""
    ready = tmp_path / "ready"
    with child_subreaper():
        group = CommandGroup(["sh", "-c", f'"$@" > {ready}; echo done', "sh", sys.executable, "-c", TRAINER])
        wait_until(lambda: ready.exists() and ready.read_text().strip() == "ready", "the trainer to be ready")
        members = wait_until(lambda: len(group.members()) == 2 and group.members(), "two members")
        trainer = next(pid for pid in members if pid != group.pgid)
        view = dispositions(members, (signal.SIGTERM, signal.SIGUSR2, signal.SIGINT))
        assert view.caught[signal.SIGTERM] == (trainer,) and view.catches(signal.SIGTERM)
        assert not view.catches(signal.SIGUSR2) and not view.untouched_by_all(signal.SIGUSR2)  # ignored by one
        assert view.untouched_by_all(signal.SIGINT) is False  # python catches SIGINT from its start

        group.leader.kill()
        wait_until(lambda: not group.poll() or group.leader_code is not None, "the wrapper to be reaped")
        assert group.leader_code == -signal.SIGKILL
        assert group_members(group.pgid) == [trainer] and process_stat(trainer).parent != group.pgid
        assert group.signal(signal.SIGTERM)
        wait_until(lambda: not group.poll(), "the group to end")
    assert group.member_codes() == [143]
    assert group.leader.returncode == -signal.SIGKILL  # Popen knows, and waits for nothing


def test_a_group_with_no_members_is_not_signalled() -> None:
    group = CommandGroup([sys.executable, "-c", "pass"])
    wait_until(lambda: not group.poll(), "the command to end")
    assert group.leader_code == 0 and group.members() == [] and group.signal(signal.SIGTERM) is False


@pytest.mark.parametrize("exit_code, delivered, finished, expected", [
    (143, [Delivery("SIGUSR2", "SIGTERM")], False, ("SIGUSR2", None)),  # SIGTERM stood in for the requeue
    (143, [Delivery("SIGUSR2", "SIGTERM"), Delivery("SIGTERM", "SIGTERM")], False, ("SIGTERM", None)),
    (140, [Delivery("SIGUSR2", "SIGUSR2")], False, ("SIGUSR2", None)),
    (0, [], False, (None, None)),
    (0, [Delivery("SIGTERM", "SIGTERM")], True, (None, None)),  # the records say it finished
])
def test_command_stop_reason(exit_code, delivered, finished, expected) -> None:
    assert command_stop_reason(exit_code, stop_signal_names=NAMES, delivered=delivered,
                               records_finished=finished) == expected


def test_an_exit_zero_after_a_stop_is_the_stop_with_a_note() -> None:
    reason, note = command_stop_reason(0, stop_signal_names=NAMES, delivered=[Delivery("SIGTERM", "SIGTERM")])
    assert reason == "SIGTERM" and "exits 128 + the signal's number (143 for SIGTERM)" in note
    reason, note = command_stop_reason(0, stop_signal_names=NAMES, delivered=[Delivery("SIGUSR2", "SIGTERM")])
    assert reason == "SIGUSR2" and "after SIGTERM" in note


def test_a_kill_after_kill_wait_is_the_stop_and_other_kills_fail() -> None:
    reason, note = command_stop_reason(-9, stop_signal_names=NAMES, delivered=[Delivery("SIGTERM", "SIGTERM")],
                                       kill_wait_s=5)
    assert reason == "SIGTERM" and "resources.kill_wait_s=5 s" in note
    with pytest.raises(RuntimeError, match="killed by SIGKILL without saving"):
        command_stop_reason(-9, stop_signal_names=NAMES, delivered=[Delivery("SIGTERM", "SIGTERM")])


def test_a_held_signal_is_named_when_the_command_finishes_first() -> None:
    reason, note = command_stop_reason(0, stop_signal_names=NAMES, held=["SIGUSR2"])
    assert reason is None and "SIGUSR2 was never delivered" in note
