"""`elfes logs --attempt N` names an attempt the run has, or says which it has (exit 2), never prints nothing."""

from __future__ import annotations

from pathlib import Path

from elfes.launcher.cli.main import main as elfes
from elfes.launcher.rundir import state as run_state
from elfes.launcher.rundir.paths import RunPaths


def a_run_with_two_attempts(run_dir: Path) -> RunPaths:
    paths = RunPaths(run_dir)
    run_state.update_state(paths, lambda s: run_state.record_submission(s, executor="local", kind="submit",
                                                                          max_requeues=3, run_dir=str(paths.run_dir)))
    run_state.update_state(paths, lambda s: run_state.mark_pending(s, job_id="11"))
    for number, token in enumerate(("11:0/1", "11:1/1"), start=1):
        run_state.update_state(paths, lambda s, token=token, number=number: run_state.begin_attempt(
            s, token=token, job_id="11", launch="submit" if number == 1 else "requeue", hosts=["here"], world_size=1))
        paths.attempt_logs(number).mkdir(parents=True)
        paths.rank_log(number, 0).write_text(f"attempt {number} says hello\n")
        run_state.update_state(paths, lambda s, token=token, number=number: run_state.end_attempt(
            s, token=token, outcome="requeued" if number == 1 else "finished"))
    return paths


def test_an_attempt_the_run_does_not_have_is_refused_naming_those_it_has(tmp_path, capsys):
    paths = a_run_with_two_attempts(tmp_path / "run")
    assert elfes(["logs", str(paths.run_dir), "--attempt", "9"]) == 2
    error = capsys.readouterr().err
    assert "--attempt 9" in error and "has attempts 1-2" in error
    assert elfes(["logs", str(paths.run_dir), "--attempt", "0"]) == 2
    assert elfes(["logs", str(paths.run_dir), "--attempt", "1"]) == 0
    assert "attempt 1 says hello" in capsys.readouterr().out
    assert elfes(["logs", str(paths.run_dir)]) == 0
    assert "attempt 2 says hello" in capsys.readouterr().out
