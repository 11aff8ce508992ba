"""The quickstart example: its exit status tells a pause from a finish, and it refuses bad arguments."""

from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys
import time
import warnings

import pytest
from launching import REPOSITORY, launch_environment

from elfes.records import EventsFileWarning, epoch_number, events_path, read_events

SCRIPT = REPOSITORY / "examples" / "quickstart" / "train.py"


def load_example():
    spec = importlib.util.spec_from_file_location("quickstart_train", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wait_for_train_event(run_dir, process: subprocess.Popen, timeout_s: float = 120) -> None:
    """Return once the run has logged a train event (its signal handlers are in place by then)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, f"the example exited early: {process.communicate()[1][-3000:]}"
        if events_path(run_dir).exists():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", EventsFileWarning)  # a line being written right now
                if any(event["event"] == "train" for event in read_events(run_dir)):
                    return
        time.sleep(0.05)  # polling interval of the condition, not a stand-in for it
    pytest.fail(f"no train event in {events_path(run_dir)} after {timeout_s} s")


@pytest.mark.parametrize(
    ("signum", "status"),
    [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGUSR2, 140)],
    ids=["SIGTERM", "SIGINT", "SIGUSR2"],
)
def test_a_signal_pauses_the_example_and_its_exit_status_is_128_plus_the_signal_number(tmp_path, signum, status):
    run_dir = tmp_path / "run"
    example = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--run-dir", str(run_dir), "--epochs", "1000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=launch_environment(OMP_NUM_THREADS="1"),
    )
    try:
        wait_for_train_event(run_dir, example)
        example.send_signal(signum)
        stdout, stderr = example.communicate(timeout=120)
    finally:
        example.kill()
    assert example.returncode == status, stderr[-3000:]
    stopped = read_events(run_dir)[-1]
    assert stopped["event"] == "stopped" and stopped["reason"] == signum.name
    # The signal lands wherever a loaded machine has got to: the last line names that same position.
    epoch = epoch_number(stopped["state"]["epoch"], stopped["state"]["next_batch"])
    assert f"stopped ({signum.name}) at epoch {epoch}/1000, step {stopped['state']['step']};" in stdout
    assert (run_dir / "checkpoints" / "last").is_symlink()


@pytest.mark.parametrize("epochs", ["0", "-3", "three"])
def test_the_example_refuses_an_epoch_count_below_one_with_a_usage_error(tmp_path, capsys, epochs):
    example = load_example()
    with pytest.raises(SystemExit) as exit_info:
        example.main(["--run-dir", str(tmp_path / "run"), "--epochs", epochs])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "argument --epochs:" in error and ("must be 1 or more" in error or "whole number" in error)
    assert not (tmp_path / "run").exists()
