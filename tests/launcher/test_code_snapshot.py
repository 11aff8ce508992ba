"""The code snapshot and the provenance of attempts (launcher/submit/snapshot.py, launcher/submit/code_plan.py,
launcher/rundir/provenance.py).

What is copied (git's files, else the folder; exclude, include, the run directory left out), the size limit's
refusal before anything is created, the resume's account of what changed, the bitwise threats named between
attempts; and end to end on the local executor: a job whose ``train.py`` is edited before a preemption
relaunches the code it was submitted with and ends bitwise equal to a straight run of that code, while
``elfes resume --code current`` runs the edited code and records it.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from local_runs import Runs, outcomes, preempt, tasks_running, trained_to, wait_ended, wait_for
from run_comparison import assert_runs_bitwise_equal
from snapshot_project import TRAIN, git, make_project, set_scale

from elfes.launcher.cli.main import main as elfes
from elfes.launcher.commands.status import run_status
from elfes.launcher.rundir import state as run_state
from elfes.launcher.rundir.code_record import load_code_record, new_code_record, save_code_record
from elfes.launcher.rundir.paths import RunPaths
from elfes.launcher.rundir.provenance import Provenance, environment_changes
from elfes.launcher.spec import load_spec
from elfes.launcher.spec.sections import Snapshot
from elfes.launcher.submit.code_plan import plan_resume
from elfes.launcher.submit.snapshot import SnapshotTooLarge, check_size, select, take

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="the git work tree cases need git")


def write_spec(project: Path, name: str, **fields: Any) -> Path:
    """A spec beside ``project`` (not in it: an untracked spec would make the snapshot dirty)."""
    spec = {"name": name, "entrypoint": "train:main", "workdir": project.name, "run_dir": f"{project.name}/runs/{name}",
            "config": {"epochs": 2}, "resources": {"timeout_min": 10, "mem_gb": 1},
            "slurm": {"signal_delay_s": 60}, "env": {"OMP_NUM_THREADS": "1"}, **fields}
    path = project.parent / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


# -- what is copied ---------------------------------------------------------------------------------------------
def test_a_git_work_tree_copies_its_files_not_the_ignored_ones_nor_the_run_directory(tmp_path: Path) -> None:
    project = make_project(tmp_path / "project")
    (project / "helper.py").write_text("X = 1\n")  # untracked, not ignored: copied
    (project / "weights.bin").write_bytes(b"\0" * 1000)  # ignored: left out, unless included
    (project / "notes").mkdir()
    (project / "notes" / "draft.md").write_text("draft\n")
    (project / "runs" / "old").mkdir(parents=True)
    (project / "runs" / "old" / "state.json").write_text("{}")
    (project / "run-here").mkdir()
    (project / "run-here" / "events.jsonl").write_text("")  # a run directory git does not ignore

    selection = select(project, Snapshot(), leave_out=[project / "run-here"])
    assert selection.files == (".gitignore", "helper.py", "notes/draft.md", "train.py")
    assert selection.git is not None and selection.git.commit == git(project, "rev-parse", "HEAD")
    assert selection.git.dirty and selection.git.diff_sha256  # helper.py and notes/ are not committed

    chosen = select(project, Snapshot(exclude=["notes", "*.gitignore"], include=["*.bin"]),
                    leave_out=[project / "run-here"])
    assert chosen.files == ("helper.py", "train.py", "weights.bin")

    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "everything")
    clean = select(project, Snapshot(), leave_out=[project / "run-here"])
    assert clean.git is not None and not clean.git.dirty and clean.git.diff_sha256 is None
    folder, _ = take(clean, tmp_path / "code")
    assert folder == tmp_path / "code" / "1"
    assert (folder / "train.py").read_text() == (TRAIN.read_text())
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) == list(clean.files)
    assert take(clean, tmp_path / "code")[0] == tmp_path / "code" / "2"

    set_scale(project, 2.0)
    edited = select(project, Snapshot(), leave_out=[project / "run-here"])
    assert edited.git.dirty and edited.git.commit == clean.git.commit and edited.git.diff_sha256


def test_a_folder_outside_git_is_copied_whole_without_caches(tmp_path: Path) -> None:
    project = tmp_path / "plain"
    (project / "pkg" / "__pycache__").mkdir(parents=True)
    (project / "train.py").write_text("")
    (project / "pkg" / "model.py").write_text("")
    (project / "pkg" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"")
    (project / "runs" / "demo").mkdir(parents=True)
    (project / "runs" / "demo" / "state.json").write_text("{}")
    (project / "shared").symlink_to(project / "pkg")  # a link is copied as a link
    selection = select(project, Snapshot(), leave_out=[project / "runs" / "demo"])
    assert selection.files == ("pkg/model.py", "shared", "train.py") and selection.git is None
    copy, _ = take(selection, tmp_path / "code")
    assert (copy / "shared").is_symlink() and (copy / "shared" / "model.py").is_file()


def test_a_workdir_over_the_limit_is_refused_before_anything_is_created(tmp_path: Path, capsys) -> None:
    project = make_project(tmp_path / "project")
    (project / "data.csv").write_bytes(b"1,2\n" * 400_000)  # 1.6 MB, untracked and not ignored
    (project / "table.csv").write_bytes(b"3\n" * 200_000)
    spec = write_spec(project, "big", snapshot={"max_mb": 1})
    before = sorted(tmp_path.rglob("*"))

    for verb in (["submit", str(spec), "--executor", "local"], ["submit", str(spec), "--executor", "local", "--dry-run"]):
        assert elfes(verb) == 2
        error = capsys.readouterr().err
        assert "over snapshot.max_mb = 1" in error and "data.csv (1.6 MB), table.csv (0.4 MB)" in error, error
        assert "snapshot.exclude" in error and "snapshot: false" in error
        assert sorted(tmp_path.rglob("*")) == before  # no run directory, no snapshot, no job

    selection = select(project, Snapshot(max_mb=1, exclude=["data.csv"]))
    check_size(selection, Snapshot(max_mb=1), source="spec")  # within the limit once left out
    with pytest.raises(SnapshotTooLarge):
        check_size(select(project, Snapshot()), Snapshot(max_mb=0.5), source="spec")


def test_the_job_starts_in_its_snapshot_or_with_snapshot_false_in_workdir(tmp_path: Path, capsys) -> None:
    project = make_project(tmp_path / "project")
    for name, fields, folder in (("copied", {}, project / "runs" / "copied" / "code" / "1"),
                                 ("uncopied", {"snapshot": False}, project)):
        assert elfes(["submit", str(write_spec(project, name, **fields)), "--executor", "local", "--dry-run"]) == 0
        assert f"\ncd {folder}\n" in capsys.readouterr().out
    assert not (project / "runs").exists()  # a dry run creates nothing


def test_resume_names_the_files_changed_since_the_snapshot(tmp_path: Path) -> None:
    project = make_project(tmp_path / "project")
    spec = load_spec(write_spec(project, "demo"))
    paths = RunPaths(spec.run_dir)
    selection = select(project, spec.snapshot, leave_out=[spec.run_dir])
    save_code_record(paths, new_code_record(*take(selection, paths.code), "submit"))

    kept = plan_resume(spec, paths, "demo.yaml", "snapshot")
    assert kept.keep and kept.selection is None and "has not changed since" in kept.note
    set_scale(project, 3.0)
    (project / "extra.py").write_text("")
    (project / ".gitignore").unlink()
    kept = plan_resume(spec, paths, "demo.yaml", "snapshot")
    assert kept.keep and "changed: train.py" in kept.note and "added: extra.py" in kept.note, kept.note
    assert "removed: .gitignore" in kept.note and "runs the code snapshot" in kept.note
    fresh = plan_resume(spec, paths, "demo.yaml", "current")
    assert fresh.selection is not None and fresh.kind == "current" and "extra.py" in fresh.selection.files


# -- bitwise threats between attempts ---------------------------------------------------------------------------
def test_a_changed_environment_between_attempts_is_named_as_a_threat() -> None:
    first = Provenance(python="3.11.7", torch="2.13.0", cuda="12.8", cudnn="91000", gpu="NVIDIA H200", threads=8)
    attempts = tuple(run_state.Attempt(number=n, token=f"1:{n}", job_id="1", launch="requeue", started_at="t",
                                       provenance=p)
                     for n, p in ((1, first), (2, None), (3, dataclasses.replace(first, python="3.12.0")),
                                  (4, dataclasses.replace(first, torch="2.14.0", gpu="NVIDIA A100", threads=4))))
    state = run_state.RunState(status="running", executor="slurm", max_requeues=5, attempts=attempts)
    changes = environment_changes(state)
    assert [change.split(":")[0] for change in changes] == [
        "attempt 4 runs torch 2.14.0, attempt 3 ran 2.13.0", "attempt 4 runs the GPU model NVIDIA A100, attempt 3 ran NVIDIA H200",
        "attempt 4 runs the torch thread count 4, attempt 3 ran 8"]
    assert all("threat to bitwise resume" in change for change in changes)
    # state.json keeps the provenance through a write and a read
    data = json.loads(json.dumps(state.to_json()))
    assert run_state.RunState.from_json(data) == state


def test_status_shows_what_the_latest_attempt_ran_on_and_names_a_change(tmp_path: Path, capsys) -> None:
    from run_fixtures import make_run

    paths = make_run(tmp_path, outcome="stopped")
    before = Provenance(python="3.11.7", torch="2.13.0", threads=2)
    run_state.update_state(paths, lambda s: run_state.record_provenance(s, token=s.attempts[0].token,
                                                                         provenance=before))
    run_state.update_state(paths, lambda s: run_state.begin_attempt(s, token="9:1", job_id="9", launch="resume",
                                                                    hosts=["node-b"], world_size=2))
    after = dataclasses.replace(before, threads=8)
    run_state.update_state(paths, lambda s: run_state.record_provenance(s, token="9:1", provenance=after))
    assert elfes(["status", str(paths.run_dir)]) == 0
    shown = " ".join(capsys.readouterr().out.split())  # the console may wrap long lines
    assert "latest attempt ran on Python 3.11.7, torch 2.13.0, CPU build, 8 threads; code: workdir as it was" in shown
    assert "attempt 2 runs the torch thread count 8, attempt 1 ran 2: a threat to bitwise resume" in shown


# -- end to end on the local executor ---------------------------------------------------------------------------
def submit(runs: Runs, spec: Path) -> Path:
    run_dir = Path(load_spec(spec).run_dir)
    runs.run_dirs.append(run_dir)
    assert elfes(["submit", str(spec), "--executor", "local"]) == 0
    return run_dir


def test_an_edit_before_a_preemption_does_not_reach_the_relaunch(tmp_path: Path, runs: Runs, capsys) -> None:
    """train.py edited while the job runs, then a preemption: the relaunch runs the submitted code and ends
    bitwise equal to a straight run of it; `resume --code current` runs the edited code and records it; a
    torch version changed in the record is named as a threat to the bitwise resume."""
    project = make_project(tmp_path / "project")
    head = git(project, "rev-parse", "HEAD")
    reference = submit(runs, write_spec(project, "reference"))
    run_dir = submit(runs, write_spec(project, "edited", config={"epochs": 2, "step_delay_s": 0.15}))
    paths = RunPaths(run_dir)
    assert (paths.code / "1" / "train.py").read_text() == TRAIN.read_text()

    wait_for(lambda: tasks_running(run_dir, 1, 1) and trained_to(run_dir, 2), what="attempt 1 to train to step 2",
             run_dir=run_dir)
    set_scale(project, 3.0)  # the author edits the code while the job runs
    preempt(run_dir)
    state = wait_ended(run_dir, "finished")
    assert outcomes(state) == [("requeued", "SIGUSR2", "submit"), ("finished", None, "requeue")]
    assert "SCALE = 1.0" in paths.rank_log(2, 0).read_text()  # the relaunch ran the submitted code
    wait_ended(reference, "finished")
    assert_runs_bitwise_equal(run_dir, reference)

    import torch

    for attempt in state.attempts:
        provenance = attempt.provenance
        assert provenance is not None and provenance.torch == torch.__version__ and provenance.threads == 1
        assert provenance.code is not None and provenance.code.path == str(paths.code / "1")
        assert (provenance.code.origin, provenance.code.commit, provenance.code.dirty) == ("submit", head, False)
    assert not environment_changes(state)
    shown = run_status(run_dir).to_json()
    assert shown["code"]["path"] == str(paths.code / "1") and shown["code"]["kind"] == "submit"
    assert f"torch {torch.__version__}" in shown["ran_on"] and shown["attempts"][1]["provenance"]["threads"] == 1

    # Another torch in the record of attempt 2 (as if it ran elsewhere): status names the change.
    data = json.loads(paths.state.read_text())
    data["attempts"][1]["provenance"]["torch"] = "2.0.0"
    paths.state.write_text(json.dumps(data))
    assert any(f"attempt 2 runs torch 2.0.0, attempt 1 ran {torch.__version__}" in note
               for note in run_status(run_dir).notes)

    capsys.readouterr()
    assert elfes(["resume", str(run_dir), "--code", "current", "--set", "config.epochs=3"]) == 0
    assert "a fresh code snapshot" in capsys.readouterr().out
    state = wait_ended(run_dir, "finished")
    assert "SCALE = 3.0" in paths.rank_log(3, 0).read_text()  # the edited code
    warning = f"attempt 3 runs torch {torch.__version__}, attempt 2 ran 2.0.0: a threat to bitwise resume"
    assert warning in paths.rank_log(3, 0, "err").read_text()  # named in the attempt's log
    record = load_code_record(paths)
    assert record.kind == "current" and record.path == str(paths.code / "2") and record.dirty
    assert not (paths.code / "1").exists()  # the older snapshot is pruned once the new job is handed over
    code = state.attempts[2].provenance.code
    assert (code.origin, code.path, code.commit, code.dirty) == ("current", record.path, head, True)
    assert code.diff_sha256 == record.diff_sha256 is not None
