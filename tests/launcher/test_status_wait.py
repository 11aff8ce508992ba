"""`elfes status --wait`: it returns once runs reach the point asked for (training, a step, their end),
says why not when they end first or the timeout passes, and reads files only. Hand-built run
directories (a stand-in process keeps a run alive) and one real local job that is preempted mid-training."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest
from local_runs import Runs, state_of
from run_fixtures import make_run

from elfes.launcher.cli.main import main
from elfes.launcher.rundir.paths import RunPaths


@pytest.fixture
def live_run(tmp_path: Path) -> Iterator[RunPaths]:
    """A running run whose job is a live stand-in process (its command line names the run's submitit folder)."""
    paths = make_run(tmp_path, outcome=None, step=4)
    paths.submitit.mkdir()
    stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "submitit.core._submit",
                                 str(paths.submitit)])
    yield paths
    stand_in.kill()
    stand_in.wait()


def log_start(paths: RunPaths) -> None:
    """The trainer of the running attempt logs its start (as the engine does once its loop runs)."""
    started = json.loads(paths.events.read_text().splitlines()[0])
    started["time"] = datetime.now(timezone.utc).isoformat()
    with open(paths.events, "a") as stream:
        stream.write(json.dumps(started) + "\n")


def test_until_training_waits_for_the_running_attempt_to_log_its_start(live_run: RunPaths, capsys):
    recorded = {path: path.read_bytes() for path in (live_run.state, live_run.events)}
    # The records hold a start from before this attempt began: not training yet.
    assert main(["status", str(live_run.run_dir), "--until", "training", "--timeout-s", "1"]) == 3
    error = capsys.readouterr().err
    assert "still running at step 4, not yet training, when --timeout-s ran out" in error
    assert {path: path.read_bytes() for path in recorded} == recorded, "waiting writes nothing"
    log_start(live_run)
    assert main(["status", str(live_run.run_dir), "--until", "training", "--timeout-s", "60"]) == 0
    assert "running" in capsys.readouterr().out, "then the status table"


def test_until_a_step_returns_once_the_records_reach_it(live_run: RunPaths, capsys):
    assert main(["status", str(live_run.run_dir), "--until", "step=4", "--timeout-s", "60", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step"] == 4
    assert main(["status", str(live_run.run_dir), "--until", "step:5", "--timeout-s", "1"]) == 3
    assert "not yet step 5" in capsys.readouterr().err


@pytest.mark.parametrize(("outcome", "code"), [("finished", 0), ("failed", 4), ("stopped", 5), ("cancelled", 5)])
def test_wait_until_the_end_exits_as_the_run_ended(tmp_path: Path, capsys, outcome: str, code: int):
    paths = make_run(tmp_path, outcome=outcome)
    assert main(["status", str(paths.run_dir), "--wait"]) == code
    assert outcome in capsys.readouterr().out


@pytest.mark.parametrize(("outcome", "code"), [("finished", 3), ("failed", 4), ("stopped", 5)])
def test_a_run_that_ended_before_the_point_says_so(tmp_path: Path, capsys, outcome: str, code: int):
    paths = make_run(tmp_path / "my runs", outcome=outcome, step=4)
    assert main(["status", str(paths.run_dir), "--until", "step=40"]) == code
    error = capsys.readouterr().err
    assert f"the run ended {outcome} at step 4 before step 40" in error
    assert f"see elfes logs '{paths.run_dir}'" in error, "the path quoted for the shell"


def test_a_job_gone_without_its_end_is_not_waited_for(tmp_path: Path, capsys):
    paths = make_run(tmp_path, outcome=None)  # "running", but no process has the job's id
    assert main(["status", str(paths.run_dir), "--until", "training"]) == 4
    assert "ended failed" in capsys.readouterr().err


def test_a_path_that_is_no_run_directory_is_refused_before_waiting_for_the_others(live_run: RunPaths, tmp_path: Path,
                                                                                 capsys):
    missing = tmp_path / "no-such-run"
    assert main(["status", str(live_run.run_dir), str(missing), "--until", "ended", "--timeout-s", "5"]) == 2
    error = capsys.readouterr().err
    assert f"{missing}: no such run directory" in error
    assert "when --timeout-s ran out" not in error, "refused before waiting for the live run"


@pytest.mark.parametrize("argv", [["--until", "step"], ["--until", "trained"], ["--until", "step=x"],
                                  ["--wait", "--timeout-s", "0"]])
def test_bad_wait_arguments_exit_2_naming_the_forms(tmp_path: Path, capsys, argv: list[str]):
    paths = make_run(tmp_path)
    assert main(["status", str(paths.run_dir), *argv]) == 2
    error = capsys.readouterr().err
    assert ("training, step=N or ended" in error) or ("above 0" in error)


def test_preempt_after_waiting_for_training_lands_mid_training(tmp_path: Path, capsys):
    runs = Runs(tmp_path)
    try:
        run_dir = runs.submit("tour")
        assert main(["status", str(run_dir), "--until", "training", "--timeout-s", "150"]) == 0
        assert main(["preempt", str(run_dir)]) == 0
        assert main(["status", str(run_dir), "--until", "ended", "--timeout-s", "150"]) == 0
    finally:
        runs.kill_leftovers()
    first, second = state_of(run_dir).attempts
    assert (first.outcome, first.signal, second.launch, second.outcome) == ("requeued", "SIGUSR2", "requeue", "finished")
    assert first.step >= 1, "the stop came at an update boundary of a training loop, not during the engine import"
    events = [json.loads(line) for line in RunPaths(run_dir).events.read_text().splitlines()]
    assert [event["event"] for event in events if event["event"] in ("started", "resumed")] == ["started", "resumed"]
