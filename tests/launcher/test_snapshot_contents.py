"""A code snapshot holds code (launcher/submit/snapshot.py, snapshot_rules.py): the ML ecosystem's token files
and private keys under any name (recognised by their content) are left out and named at submit; what ELFES
writes under a workdir (other runs, tracker stores and their journals, checkpoints) stays out, so the workdir's
changes and the fingerprint are the code's; a file that vanishes between the listing and its copy is skipped,
and a file that cannot be read is named, never blamed on run_dir."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from local_runs import Runs, wait_ended
from snapshot_project import make_project

from elfes.launcher.cli.main import main as elfes
from elfes.launcher.rundir.code_record import fingerprint, load_code_record
from elfes.launcher.rundir.paths import RunPaths
from elfes.launcher.spec.sections import Snapshot
from elfes.launcher.submit import snapshot
from elfes.launcher.submit.code_plan import CodePlan
from elfes.launcher.submit.snapshot import changed_files, select, take

PEM = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ==\n-----END OPENSSH PRIVATE KEY-----\n"
SERVICE_ACCOUNT = json.dumps({"type": "service_account", "project_id": "p", "private_key_id": "0a1b",
                              "private_key": "-----BEGIN PRIVATE KEY-----\\nMIIE\\n-----END PRIVATE KEY-----\\n",
                              "client_email": "trainer@p.iam.gserviceaccount.com"})
# The list (named like a credential, or holding a key under another name), and the ones left out before.
SECRETS = {
    ".kaggle/kaggle.json": '{"username": "ada", "key": "0123456789abcdef"}', ".huggingface/token": "hf_abc\n",
    ".cache/huggingface/token": "hf_abc\n", ".mlflow/credentials": "[mlflow]\nmlflow_tracking_password = pw\n",
    ".config/gh/hosts.yml": "github.com:\n    oauth_token: gho_abc\n", "gcp/trainer-4f2a.json": SERVICE_ACCOUNT,
    ".s3cfg": "[default]\nsecret_key = abc\n", ".vault-token": "hvs.abc\n",
    ".config/rclone/rclone.conf": "[s3]\nsecret_access_key = abc\n", "secrets.yaml": "db: pw\n",
    "deploy/secrets.toml": "db = 'pw'\n", "configs/secrets.yml": "pw: x\n", "secrets.json": "{}", ".boto": "[Credentials]\n", ".databrickscfg": "[DEFAULT]\ntoken = x\n",
    "keys/deploy_key": PEM, "id_rsa.bak": PEM, "notes/old-laptop.txt": "my key, keep safe\n" + PEM,
    ".env": "TOKEN=x\n", "id_rsa": PEM, ".netrc": "machine api.wandb.ai password x\n",
    ".aws/credentials": "[default]\naws_secret_access_key = x\n", ".git-credentials": "https://me:pw@github.com\n",
}
# Ordinary code and data that merely mention a key or a token: copied.
CODE = {
    "train.py": "print('training')\n", "pkg/tokenizer.py": "def tokenize(text): return text.split()\n",
    "pkg/keys.py": "PRIVATE_KEY_ENV = 'APP_PRIVATE_KEY'  # read from the environment\n",
    "configs/model.yaml": "width: 8\ntokenizer: gpt2\n", "keys/README.md": "Deploy keys live in the vault.\n",
    "data/schema.json": '{"type": "record", "fields": []}', "id_rsa.pub": "ssh-ed25519 AAAA public\n",
    "templates/account.json": '{"type": "service_account", "client_email": "x"}',  # no key in it
}


def write_files(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)


def test_ml_token_files_and_keys_found_by_content_are_left_out_and_named_at_submit(tmp_path: Path, runs: Runs,
                                                                                    capsys) -> None:
    project = tmp_path / "project"
    write_files(project, {**SECRETS, **CODE})
    run_dir = runs.submit("tokens", workdir=str(project), entrypoint=None, config={},
                          command=["{python}", "-c", "pass"])
    said = capsys.readouterr().out
    assert "left out of the code snapshot as they look like credentials" in said, said
    shown = ", ".join(sorted(SECRETS)[:10]) + f" and {len(SECRETS) - 10} more; "  # the first ten, then a count
    assert f"look like credentials: {shown}" in said and "snapshot.include" in said, said
    wait_ended(run_dir, "finished")

    record = load_code_record(RunPaths(run_dir))
    copy = Path(record.path)
    assert sorted(path.relative_to(copy).as_posix() for path in copy.rglob("*") if path.is_file()) == sorted(CODE)
    assert sorted(record.secrets_left_out) == sorted(SECRETS)
    brought_back = select(project, Snapshot(include=["keys/deploy_key"]))
    assert "keys/deploy_key" in brought_back.files and "keys/deploy_key" not in brought_back.secrets


# What ELFES and its trackers write under a workdir that git does not ignore, and checkpoints.
OUTPUTS = {
    "mlflow.db": "SQLite format 3", "mlflow.db-journal": "journal", "mirror.sqlite-wal": "wal",
    "mlruns/0/meta.yaml": "name: Default\n", "mlartifacts/1/model.txt": "artifact",
    "store/tracking.db-shm": "shm", "wandb/offline-run-1/run-1.wandb": "records",
    "old-run/job.yaml": "name: old\n", "old-run/state.json": "{}", "old-run/events.jsonl": "{}\n",
    "sweeps/lr/sweep.json": "{}", "model.pt": "weights", "best.pth": "weights", "last.ckpt": "weights",
    "export/model.safetensors": "weights", "checkpoints/step-2/__0_0.distcp": "shard",
    "checkpoints/step-2/.metadata": "metadata",
}
CHECKPOINTS = ["best.pth", "checkpoints/step-2/.metadata", "checkpoints/step-2/__0_0.distcp",
               "export/model.safetensors", "last.ckpt", "model.pt"]


@pytest.mark.parametrize("in_git", [True, False], ids=["git-work-tree", "plain-folder"])
def test_elfes_outputs_and_checkpoints_stay_out_so_changes_and_fingerprint_are_the_codes(tmp_path: Path,
                                                                                          in_git: bool) -> None:
    if in_git and shutil.which("git") is None:
        pytest.skip("needs git")
    project = make_project(tmp_path / "project") if in_git else tmp_path / "project"
    write_files(project, {**OUTPUTS, "helper.py": "X = 1\n", **({} if in_git else {"train.py": "pass\n"})})
    selection = select(project, Snapshot())
    code = [".gitignore", "helper.py", "train.py"] if in_git else ["helper.py", "train.py"]
    assert list(selection.files) == code and list(selection.checkpoints) == CHECKPOINTS
    warning = next(text for text in CodePlan(selection=selection).warnings if "as checkpoints" in text)
    assert ", ".join(CHECKPOINTS) in warning and "include: ['best.pth']" in warning, warning  # named at submit
    folder, copied = take(selection, tmp_path / "code")
    taken = fingerprint(folder, copied.files)

    # The mirror writes on, a new checkpoint lands, another run starts: the code has not changed.
    write_files(project, {"mlflow.db": "SQLite format 3, more rows", "mlflow.db-wal": "wal", "model.pt": "newer",
                          "checkpoints/step-4/__0_0.distcp": "shard", "new-run/job.yaml": "name: new\n",
                          "new-run/state.json": "{}", "new-run/train.log": "step 1\n"})
    now = select(project, Snapshot())
    assert changed_files(folder, now) == [] and fingerprint(project, now.files) == taken
    (project / "helper.py").write_text("X = 2\n")
    edited = select(project, Snapshot())
    assert changed_files(folder, edited) == ["changed: helper.py"] and fingerprint(project, edited.files) != taken
    assert "model.pt" in select(project, Snapshot(include=["model.pt"])).files  # include brings one back


def spec_file(folder: Path, name: str) -> Path:
    spec = folder / f"{name}.yaml"
    spec.write_text(yaml.safe_dump({"name": name, "command": ["true"], "workdir": "project",
                                    "run_dir": f"runs/{name}", "env": {"OMP_NUM_THREADS": "1"}}))
    return spec


def in_the_copy_path(monkeypatch: pytest.MonkeyPatch, action) -> None:
    """Run ``action`` once, when the snapshot's copy begins (the listing is done): a race made deterministic."""
    create_folders, done = snapshot._owner_only_folders, []

    def hooked(top: Path, folder: Path) -> None:
        if not done:
            done.append(action())
        create_folders(top, folder)

    monkeypatch.setattr(snapshot, "_owner_only_folders", hooked)


def test_a_file_that_vanishes_before_its_copy_is_skipped(tmp_path: Path, monkeypatch, capsys) -> None:
    project = tmp_path / "project"
    write_files(project, {"logs/train.log": "step 1\n", "pkg/model.py": "WIDTH = 8\n", "train.py": "pass\n"})
    in_the_copy_path(monkeypatch, (project / "logs" / "train.log").unlink)
    assert elfes(["submit", str(spec_file(tmp_path, "vanishing")), "--executor", "local"]) == 0, capsys.readouterr()
    run_dir = tmp_path / "runs" / "vanishing"
    assert "run_dir" not in capsys.readouterr().err
    wait_ended(run_dir, "finished")
    record = load_code_record(RunPaths(run_dir))
    copy = Path(record.path)
    assert sorted(path.relative_to(copy).as_posix() for path in copy.rglob("*") if path.is_file()) == [
        "pkg/model.py", "train.py"]
    assert record.files == 2 and record.fingerprint == fingerprint(project, ["pkg/model.py", "train.py"])


def test_a_file_that_cannot_be_read_is_named_and_nothing_is_created(tmp_path: Path, monkeypatch, capsys) -> None:
    project = tmp_path / "project"
    write_files(project, {"pkg/model.py": "WIDTH = 8\n", "train.py": "pass\n"})

    def unreadable() -> None:  # replaced by what cannot be read as a file (root reads a chmod 000 file)
        (project / "pkg" / "model.py").unlink()
        (project / "pkg" / "model.py").mkdir()

    in_the_copy_path(monkeypatch, unreadable)
    assert elfes(["submit", str(spec_file(tmp_path, "unreadable")), "--executor", "local"]) == 2
    error = capsys.readouterr().err
    assert "pkg/model.py cannot be read for the code snapshot" in error and "snapshot.exclude" in error, error
    assert "run_dir" not in error, error
    assert not (tmp_path / "runs" / "unreadable").exists()


def test_more_token_files_and_names_in_other_case_are_left_out(tmp_path: Path) -> None:
    """Comet's, Modal's and ClearML's key files, GnuPG's keyring, a PuTTY key, a Google OAuth client's secret, and a
    credential's name in other case (a case-insensitive file system reads `.ENV` as `.env`)."""
    secrets = {".comet.config": "[comet]\napi_key = x\n", ".modal.toml": "[default]\ntoken_secret = 'x'\n",
               "clearml.conf": "api { credentials { secret_key: x } }\n", ".gnupg/private-keys-v1.d/A1.key": "x",
               "keys/deploy.ppk": "PuTTY-User-Key-File-3: ssh-ed25519\n", ".ENV": "TOKEN=x\n",
               "client_secret_42.apps.googleusercontent.com.json": '{"installed": {"client_secret": "x"}}',
               "Secrets.yaml": "db: pw\n", "ID_RSA.bak": "x"}
    write_files(tmp_path, {**secrets, **CODE})
    selection = select(tmp_path, Snapshot())
    assert sorted(selection.secrets) == sorted(secrets)
    assert sorted(selection.files) == sorted(CODE)



@pytest.mark.parametrize(("uri", "copied"), [
    ("sqlite:///project/store/experiments.db", ["tracked/0/meta.yaml", "train.py"]),
    ("file:project/tracked", ["store/experiments.db", "train.py"])])  # a journal of any name stays out
def test_the_runs_own_mlflow_store_stays_out_whatever_its_name(tmp_path: Path, uri: str, copied: list[str]) -> None:
    """A store named otherwise than mlflow.db or mlruns (`sqlite:///.../experiments.db` and its journal,
    `file:tracked`), which the run's mirror writes under the workdir: never copied, so never a change."""
    from elfes.launcher.spec import load_spec
    from elfes.launcher.submit.code_plan import plan_submit

    files = {"train.py": "pass\n", "store/experiments.db": "SQLite format 3", "store/experiments.db-journal": "j",
             "tracked/0/meta.yaml": "name: x\n"}
    write_files(tmp_path / "project", files)
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({"name": "a", "command": ["true"], "workdir": "project", "run_dir": "runs/a",
                                    "tracking": {"mlflow": {"tracking_uri": uri}}}))
    selection = plan_submit(load_spec(spec), str(spec)).selection
    assert selection is not None
    assert list(selection.files) == copied


def test_a_code_package_named_like_a_tracker_store_is_copied_and_the_store_itself_is_not(tmp_path: Path) -> None:
    """A store's folder is known by what it holds, not by its name alone: `loggers/wandb/` is code."""
    project = tmp_path / "project"
    write_files(project, {"train.py": "pass\n", "loggers/wandb/__init__.py": "", "loggers/wandb/utils.py": "X = 1\n",
                          "pkg/mlruns/reader.py": "Y = 2\n", "wandb/offline-run-1/run-1.wandb": "records",
                          "mlruns/0/meta.yaml": "name: Default\n"})
    (project / "wandb" / "latest-run").symlink_to("offline-run-1")
    selection = select(project, Snapshot())
    assert list(selection.files) == ["loggers/wandb/__init__.py", "loggers/wandb/utils.py", "pkg/mlruns/reader.py",
                                     "train.py"]
