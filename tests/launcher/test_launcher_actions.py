"""The login-node verbs on hand-built run directories: status, logs, preempt and cancel refusals,
a different spec refused, lost jobs seen without writing. Real files and processes, no job runs."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
from pathlib import Path

import pytest
from run_fixtures import GONE_JOB_ID, make_run, write_project

from elfes.files import write_text_atomically
from elfes.launcher.cli.main import main
from elfes.launcher.submit import executors


def run_json(capsys, *argv: str):
    assert main(["status", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_status_json_reports_state_attempts_requeues_progress_and_best(tmp_path: Path, capsys):
    paths = make_run(tmp_path, outcome="stopped", step=4)
    report = run_json(capsys, str(paths.run_dir))
    assert report["status"] == "stopped" and report["executor"] == "local" and report["job_id"] == GONE_JOB_ID
    (attempt,) = report["attempts"]
    assert (attempt["number"], attempt["outcome"], attempt["signal"], attempt["step"]) == (1, "stopped", "SIGTERM", 4)
    assert attempt["hosts"] == ["node-a"] and attempt["started_at"] and attempt["ended_at"]
    assert (report["requeues_used"], report["requeues_left"], report["max_requeues"]) == (0, 3, 3)
    assert (report["step"], report["planned_steps"]) == (4, 10)
    assert (report["monitor"], report["best_metric"], report["best_step"]) == ("validation/loss", 0.5, 4)
    assert report["error"] is None


def test_status_of_a_failed_attempt_carries_its_error(tmp_path: Path, capsys):
    paths = make_run(tmp_path, outcome="failed")
    report = run_json(capsys, str(paths.run_dir))
    assert report["status"] == "failed" and report["error"] == "RuntimeError: boom"


def test_status_of_several_runs_is_one_table_with_a_row_each(tmp_path: Path, capsys):
    first = make_run(tmp_path / "a", name="first", outcome="finished")
    second = make_run(tmp_path / "b", name="second", outcome="cancelled")
    assert main(["status", str(first.run_dir), str(second.run_dir)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "first" in line or "second" in line]
    assert len(rows) == 2 and "finished" in rows[0] and "cancelled" in rows[1]
    reports = run_json(capsys, str(first.run_dir), str(second.run_dir))
    assert [report["status"] for report in reports] == ["finished", "cancelled"]


def test_a_job_gone_without_an_outcome_shows_failed_or_cancelled_and_nothing_is_written(tmp_path: Path, capsys):
    paths = make_run(tmp_path, outcome=None)  # "running", but no process has the job's id
    recorded = paths.state.read_bytes()
    report = run_json(capsys, str(paths.run_dir))
    assert report["status"] == "failed" and report["queue_state"] == "GONE"
    assert report["attempts"][0]["outcome"] == "lost" and "without recording" in report["error"]
    assert any("gone without recording its end" in note for note in report["notes"])
    write_text_atomically(paths.cancel_marker, "{}\n")  # `elfes cancel` was there first
    assert run_json(capsys, str(paths.run_dir))["status"] == "cancelled"
    assert paths.state.read_bytes() == recorded  # status reads files only


@pytest.mark.parametrize("verb", ["status", "logs", "preempt", "cancel", "resume"])
def test_a_folder_that_is_not_a_run_directory_exits_2(tmp_path: Path, capsys, verb):
    assert main([verb, str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().err
    assert main([verb, str(tmp_path / "missing")]) == 2
    assert "no such run directory" in capsys.readouterr().err


def test_submitting_a_spec_that_changes_the_math_of_a_run_with_checkpoints_is_refused_naming_the_fields(
        tmp_path: Path, capsys):
    paths = make_run(tmp_path)
    paths.checkpoints.mkdir()
    (paths.checkpoints / "step-00000004.pt").write_bytes(b"a checkpoint")
    spec = tmp_path / "demo.yaml"
    spec.write_text(spec.read_text().replace("epochs: 1", "epochs: 5, lr: 0.1"))
    recorded = {path: path.read_bytes() for path in (paths.spec, paths.state)}
    for argv in (["submit", str(spec), "--executor", "local"], ["submit", str(spec), "--executor", "local", "--dry-run"],
                 ["resume", str(paths.run_dir), "--set", "config.lr=0.1", "--set", "config.epochs=5"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert ("holds a different job (fields that may not change when a run continues from its checkpoints: "
                "config.lr)") in err  # config.epochs, the budget, may change
        assert "another run_dir (e.g. --set run_dir=NEW_FOLDER)" in err
    assert {path: path.read_bytes() for path in recorded} == recorded


def test_logs_print_a_rank_of_the_latest_attempt(tmp_path: Path, capsys):
    paths = make_run(tmp_path)
    assert main(["logs", str(paths.run_dir), "--rank", "1"]) == 0
    out = capsys.readouterr().out
    assert f"==> {paths.rank_log(1, 1, 'out')} <==" in out and "hello from rank 1" in out
    assert "warning from rank 1" in out and "rank 0" not in out
    assert main(["logs", str(paths.run_dir), "--rank", "2"]) == 2
    assert "the job has ranks 0-1" in capsys.readouterr().err
    assert main(["logs", str(paths.run_dir), "--attempt", "7"]) == 2  # issue 16: it printed nothing, exit 0
    assert "--attempt 7" in capsys.readouterr().err


def test_preempt_refuses_a_run_that_is_not_running(tmp_path: Path, capsys):
    paths = make_run(tmp_path, outcome="stopped")
    assert main(["preempt", str(paths.run_dir)]) == 3
    assert "the run is stopped, not running" in capsys.readouterr().err


def test_preempt_never_signals_a_recorded_pid_that_is_no_longer_a_task(tmp_path: Path, capsys):
    paths = make_run(tmp_path, outcome=None)
    paths.pids.mkdir(exist_ok=True)
    # A stale record whose pid now belongs to another process (this test's): SIGUSR2 would kill it.
    write_text_atomically(paths.pid_file(0), json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                                          "attempt": 1, "rank": 0}))
    before = signal.getsignal(signal.SIGUSR2)
    assert main(["preempt", str(paths.run_dir)]) == 3
    assert "no task of job" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGUSR2) is before


def test_cancelling_an_ended_run_changes_nothing(tmp_path: Path, capsys):
    paths = make_run(tmp_path, outcome="finished")
    assert main(["cancel", str(paths.run_dir)]) == 0
    assert "already finished; nothing to cancel" in capsys.readouterr().out
    assert not paths.cancel_marker.exists()


def test_resume_or_submit_of_a_finished_run_is_refused_with_the_line_that_extends_it(tmp_path: Path, capsys):
    paths = make_run(tmp_path, outcome="finished")
    recorded = {path: path.read_bytes() for path in paths.run_dir.rglob("*") if path.is_file()}
    for argv in (["resume", str(paths.run_dir)], ["submit", str(tmp_path / "demo.yaml"), "--executor", "local"],
                 ["resume", str(paths.run_dir), "--set", "resources.timeout_min=20"]):
        assert main(argv) == 3
        err = capsys.readouterr().err
        assert "the run is finished; submitting it again would train nothing" in err
        assert f"elfes resume {paths.run_dir} --set config.epochs=2" in err
    assert {path: path.read_bytes() for path in paths.run_dir.rglob("*") if path.is_file()} == recorded


def test_the_line_that_extends_a_finished_run_raises_its_recorded_budget_not_the_one_given(tmp_path: Path, capsys):
    paths = make_run(tmp_path, outcome="finished")
    paths.spec.write_text(paths.spec.read_text().replace("epochs: 1\n", "epochs: 200\n"))
    for argv in (["resume", str(paths.run_dir), "--set", "config.epochs=1"],
                 ["resume", str(paths.run_dir), "--set", "config.epochs=2"],
                 ["submit", str(tmp_path / "demo.yaml"), "--executor", "local"]):  # its file says epochs: 1
        assert main(argv) == 3
        assert f"elfes resume {paths.run_dir} --set config.epochs=400" in capsys.readouterr().err, argv


def test_a_run_that_finishes_while_a_submission_decides_is_refused_and_left_as_it_was(tmp_path: Path, capsys,
                                                                                      monkeypatch):
    import contextlib

    from elfes.launcher.rundir import state as run_state
    from elfes.launcher.submit import transaction

    paths = make_run(tmp_path, outcome=None)  # running when the submitter decides to submit
    taken = transaction.submission_lock
    recorded = {}

    @contextlib.contextmanager
    def finish_while_waiting(run_paths):  # the job records its end while the submitter waits for the lock
        run_state.update_state(run_paths, lambda s: run_state.end_attempt(
            s, token=f"{GONE_JOB_ID}:0", outcome="finished", signal=None, step=10, error=None))
        recorded.update({path: path.read_bytes() for path in paths.run_dir.rglob("*") if path.is_file()})
        with taken(run_paths):
            yield

    monkeypatch.setattr(transaction, "submission_lock", finish_while_waiting)
    argv = ["submit", str(tmp_path / "demo.yaml"), "--executor", "local", "--set", "resources.timeout_min=20"]
    assert main(argv) == 3
    assert "the run is finished; submitting it again would train nothing" in capsys.readouterr().err
    assert {path: path.read_bytes() for path in paths.run_dir.rglob("*") if path.is_file()} == recorded


def test_validate_refuses_a_spec_the_chosen_executor_cannot_run(tmp_path: Path, capsys):
    spec = write_project(tmp_path)
    spec.write_text(spec.read_text().replace("tasks_per_node: 2", "nodes: 2, tasks_per_node: 2"))
    assert main(["validate", str(spec), "--executor", "local"]) == 2
    assert "resources.nodes = 2: the local executor runs on this machine only" in capsys.readouterr().err
    assert main(["validate", str(spec), "--executor", "slurm"]) == 0


def test_auto_is_slurm_only_where_sbatch_is_on_path_and_a_cluster_is_configured(tmp_path: Path, monkeypatch):
    from elfes.launcher.submit.executors import choose_executor

    sbatch = shutil.which("sbatch")
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch at all
    assert choose_executor("auto") == "local"
    if sbatch is None:
        pytest.skip("no sbatch here to check the SLURM side")
    monkeypatch.setenv("PATH", str(Path(sbatch).parent))
    monkeypatch.delenv("SLURM_CONF", raising=False)
    if not executors.slurm_configured():
        assert choose_executor("auto") == "local"  # client packages without a cluster
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    assert choose_executor("auto") == "slurm"
    assert choose_executor("local") == "local" and choose_executor("slurm") == "slurm"
