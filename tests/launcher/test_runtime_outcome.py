"""The in-job runtime's decisions, without a job: the outcome of an attempt, a command's exit code,
and the flag-only handlers."""

from __future__ import annotations

import os
import signal

import pytest

from elfes.launcher.job.outcome import decide, stop_reason_from_exit_code
from elfes.launcher.job.signals import SignalFlags, catches_signal


def outcome(reason, *, cancel=False, used=0, limit=3):
    return decide(reason, requeue_signal_name="SIGUSR2", cancel_requested=cancel, requeues_used=used,
                  max_requeues=limit)


def test_outcomes_of_an_attempt():
    assert outcome(None).outcome == "finished"
    assert outcome("early_stopping").outcome == "finished"
    assert (outcome("SIGUSR2").outcome, outcome("SIGUSR2").signal) == ("requeued", "SIGUSR2")
    assert (outcome("SIGTERM").outcome, outcome("SIGTERM").signal) == ("stopped", "SIGTERM")
    assert (outcome("SIGINT", cancel=True).outcome, outcome("SIGINT", cancel=True).signal) == ("cancelled", "SIGINT")
    assert (outcome("max_time").outcome, outcome("max_time").signal) == ("stopped", None)
    # An agreed requeue goes ahead even if a cancel marker appeared: the relaunch sees the marker.
    assert outcome("SIGUSR2", cancel=True).outcome == "requeued"


def test_the_requeue_cap_stops_instead_and_says_how_to_continue():
    assert outcome("SIGUSR2", used=2, limit=3).requeue
    capped = outcome("SIGUSR2", used=3, limit=3)
    assert (capped.outcome, capped.signal, capped.requeue) == ("stopped", "SIGUSR2", False)
    assert "requeue limit reached (3 of requeue.max_requeues=3 used)" in capped.error
    assert "elfes resume" in capped.error
    assert outcome("SIGUSR2", used=0, limit=0).outcome == "stopped"


def test_a_commands_exit_code_as_a_stop_reason():
    names = ("SIGINT", "SIGTERM", "SIGUSR2")
    assert stop_reason_from_exit_code(0, stop_signal_names=names) is None
    assert stop_reason_from_exit_code(128 + signal.SIGUSR2, stop_signal_names=names) == "SIGUSR2"
    assert stop_reason_from_exit_code(128 + signal.SIGTERM, stop_signal_names=names) == "SIGTERM"
    with pytest.raises(RuntimeError, match="exited with code 1; 0 means finished"):
        stop_reason_from_exit_code(1, stop_signal_names=names)
    with pytest.raises(RuntimeError, match="exited with code 137"):  # 128 + SIGKILL: not a stop signal
        stop_reason_from_exit_code(137, stop_signal_names=names)
    with pytest.raises(RuntimeError, match="killed by SIGUSR2 without saving; a command job must catch"):
        stop_reason_from_exit_code(-signal.SIGUSR2, stop_signal_names=names)


def test_flag_only_handlers_record_and_catches_signal_reads_the_handler_table():
    previous = signal.getsignal(signal.SIGUSR1)
    try:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        assert catches_signal(os.getpid(), signal.SIGUSR1) is False
        flags = SignalFlags([signal.SIGUSR1]).install()
        assert catches_signal(os.getpid(), signal.SIGUSR1) is True
        os.kill(os.getpid(), signal.SIGUSR1)
        assert flags.names() == ["SIGUSR1"]
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert catches_signal(2**22 + 12345, signal.SIGUSR1) is None  # no such process
