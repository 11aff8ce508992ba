"""What a code snapshot may hold and say (launcher/submit/snapshot.py, code_plan.py, launcher/rundir/code_record.py):
no credentials unless brought back, a submodule's ignored files left out, owner-only modes, a fingerprint of what
it copied; a FIFO named as the snapshot's problem; other code continuing a run's checkpoints said and recorded."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest
import yaml
from local_runs import Runs, wait_ended
from snapshot_project import git, make_project

from elfes.launcher.cli.main import main as elfes
from elfes.launcher.job.provenance import collect
from elfes.launcher.rundir.code_record import load_code_record, new_code_record, save_code_record
from elfes.launcher.rundir.paths import RunPaths
from elfes.launcher.spec import load_spec
from elfes.launcher.spec.sections import Snapshot
from elfes.launcher.submit.code_plan import carry_out, plan_resume
from elfes.launcher.submit.handover import RunDirUndo
from elfes.launcher.submit.snapshot import select, take

SECRETS = (".env", ".netrc", ".aws/credentials", "id_rsa", "certs/server.pem", "deploy/.env.production")


def plain_project(folder: Path) -> Path:
    """A folder outside git with code and the credentials a careless workdir holds."""
    (folder / "pkg").mkdir(parents=True)
    (folder / "train.py").write_text("print('training')\n")
    (folder / "pkg" / "model.py").write_text("WIDTH = 8\n")
    (folder / "id_rsa.pub").write_text("ssh-ed25519 AAAA public\n")  # a public key is no secret
    for name in SECRETS:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(f"secret of {name}\n")
    os.chmod(folder / "train.py", 0o755)
    return folder


def test_secrets_are_left_out_named_at_submit_and_the_copy_is_its_owners_alone(tmp_path: Path, runs: Runs,
                                                                                 capsys) -> None:
    project = plain_project(tmp_path / "project")
    run_dir = runs.submit("careful", workdir=str(project), entrypoint=None, config={},
                          command=["{python}", "-c", "pass"])
    said = capsys.readouterr().out
    assert "warning: left out of the code snapshot as they look like credentials: " in said, said
    assert all(name in said for name in SECRETS) and "snapshot.include" in said, said
    wait_ended(run_dir, "finished")

    record = load_code_record(RunPaths(run_dir))
    copy = Path(record.path)
    copied = sorted(path.relative_to(copy).as_posix() for path in copy.rglob("*") if path.is_file())
    assert copied == ["id_rsa.pub", "pkg/model.py", "train.py"]
    assert sorted(record.secrets_left_out) == sorted(SECRETS)
    assert record.fingerprint is not None and record.commit is None and record.fingerprint[:12] in record.describe()
    for path in [copy.parent, copy, *copy.rglob("*")]:  # code/, code/1 and all it holds: nothing for group or others
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, (path, oct(path.stat().st_mode))
    assert stat.S_IMODE(copy.stat().st_mode) == 0o700 and os.access(copy / "train.py", os.X_OK)


def test_snapshot_include_brings_a_secret_back(tmp_path: Path) -> None:
    project = plain_project(tmp_path / "project")
    selection = select(project, Snapshot(include=[".env", "certs/*.pem"]))
    assert ".env" in selection.files and "certs/server.pem" in selection.files
    assert sorted(selection.secrets) == sorted(set(SECRETS) - {".env", "certs/server.pem"})
    assert not set(selection.secrets) & set(selection.files)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_submodules_ignored_files_are_not_copied(tmp_path: Path) -> None:
    library = tmp_path / "library"
    library.mkdir()
    (library / "lib.py").write_text("X = 1\n")
    (library / ".gitignore").write_text("generated/\n*.log\n")
    git(library, "init", "-q")
    git(library, "add", "-A")
    git(library, "commit", "-q", "-m", "library")
    project = make_project(tmp_path / "project")
    git(project, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(library), "vendor/library")
    git(project, "commit", "-q", "-m", "with the library")
    inside = project / "vendor" / "library"
    (inside / "generated").mkdir()
    (inside / "generated" / "weights.bin").write_bytes(b"\0" * 1000)  # ignored by the submodule's .gitignore
    (inside / "debug.log").write_text("noise\n")
    (inside / "extra.py").write_text("Y = 2\n")  # untracked, not ignored: copied like the superproject's

    selection = select(project, Snapshot())
    assert [name for name in selection.files if name.startswith("vendor/")] == [
        "vendor/library/.gitignore", "vendor/library/extra.py", "vendor/library/lib.py"], selection.files
    copy, _ = take(selection, tmp_path / "code")
    assert not (copy / "vendor" / "library" / "generated").exists() and not (copy / "vendor/library/.git").exists()


def test_a_fifo_in_workdir_is_named_as_the_snapshots_problem_and_nothing_is_created(tmp_path: Path, capsys) -> None:
    project = plain_project(tmp_path / "project")
    os.mkfifo(project / "pkg" / "progress.pipe")
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({"name": "piped", "command": ["true"], "workdir": "project",
                                    "run_dir": "runs/piped"}))
    before = sorted(tmp_path.rglob("*"))
    assert elfes(["submit", str(spec), "--executor", "local"]) == 2
    error = capsys.readouterr().err
    assert "pkg/progress.pipe is a named pipe (FIFO)" in error and "snapshot.exclude" in error, error
    assert "exclude: ['pkg/progress.pipe']" in error and "run_dir" not in error, error
    assert sorted(tmp_path.rglob("*")) == before
    assert select(project, Snapshot(exclude=["*.pipe"])).files  # the fix it names works


def test_copies_of_a_folder_outside_git_are_told_apart_by_their_fingerprint(tmp_path: Path) -> None:
    first = plain_project(tmp_path / "first")
    same = plain_project(tmp_path / "same")
    records = [new_code_record(*take(selection, tmp_path / name / "code"), "submit")
               for name, selection in (("a", select(first, Snapshot())), ("b", select(same, Snapshot())))]
    assert records[0].fingerprint == records[1].fingerprint and len(records[0].fingerprint) == 64
    (same / "pkg" / "model.py").write_text("WIDTH = 9\n")
    edited = select(same, Snapshot())
    other = new_code_record(*take(edited, tmp_path / "c" / "code"), "submit")
    assert other.fingerprint != records[0].fingerprint
    provenance = collect(code=other)
    assert provenance.code.fingerprint == other.fingerprint and other.fingerprint[:12] in provenance.describe()


def test_resuming_with_other_code_says_the_checkpoint_state_wins_and_provenance_marks_it(tmp_path: Path) -> None:
    project = plain_project(tmp_path / "project")
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(yaml.safe_dump({"name": "edited", "command": ["true"], "workdir": "project",
                                         "run_dir": "runs/edited"}))
    spec = load_spec(spec_file)
    paths = RunPaths(spec.run_dir)
    selection = select(project, spec.snapshot)
    save_code_record(paths, new_code_record(*take(selection, paths.code), "submit"))
    paths.checkpoints.mkdir(parents=True)
    (paths.checkpoints / "step-00000004-batches-0000000004.pt").write_bytes(b"a checkpoint")

    unchanged = plan_resume(spec, paths, "job.yaml", "current")
    assert unchanged.other_code_than is None and not any("other code" in text for text in unchanged.warnings)
    (project / "train.py").write_text("LEARNING_RATE = 0.5\n")
    plan = plan_resume(spec, paths, "job.yaml", "current")
    warning = next(text for text in plan.warnings if "other code" in text)
    assert "optimizer's and scheduler's state" in warning and "has no effect" in warning, warning
    assert "--set run_dir=NEW_FOLDER" in warning and "code/1" in warning
    record = carry_out(plan, paths, RunDirUndo(paths))
    assert record.other_code_than is not None and "code/1" in record.other_code_than
    assert json.loads(paths.code_record.read_text())["other_code_than"] == record.other_code_than
    described = collect(code=load_code_record(paths)).describe()
    assert "continued with other code than its checkpoints'" in described, described


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_secret_git_tracks_is_left_out_too(tmp_path: Path) -> None:
    project = make_project(tmp_path / "project")
    (project / ".env").write_text("TOKEN=tracked by mistake\n")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "a secret")
    selection = select(project, Snapshot())
    assert selection.secrets == (".env",) and selection.files == (".gitignore", "train.py")
