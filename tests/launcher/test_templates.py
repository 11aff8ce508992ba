"""The templates of `elfes init`: each one is a valid spec whose entrypoint is the train.py `elfes init`
writes beside it, both ship inside the installed package, and `elfes init` writes them verbatim without
overwriting anything; the spec names what `job` holds and keeps a bounded number of checkpoints."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import signal
from pathlib import Path

import pytest
import yaml
from launching import REPOSITORY

from elfes.launcher.cli.main import main
from elfes.launcher.commands import authoring
from elfes.launcher.commands.authoring import entrypoint_text
from elfes.launcher.job.runtime import Job
from elfes.launcher.rundir.paths import RunPaths
from elfes.launcher.spec import validate_spec_data
from elfes.launcher.submit import executors

TEMPLATES = ["local-debug", "slurm-gpu", "slurm-multinode", "slurm-node"]


def test_the_four_templates_ship_in_the_package():
    assert authoring.template_names() == TEMPLATES
    for name in TEMPLATES:
        assert authoring.template_text(name) == (REPOSITORY / "templates" / f"{name}.yaml").read_text()


@pytest.mark.parametrize("name", TEMPLATES)
def test_a_template_is_a_valid_spec_for_its_executor(tmp_path: Path, name: str):
    data = yaml.safe_load(authoring.template_text(name))
    assert data["entrypoint"] == "train:main" and data["workdir"] == "."
    (tmp_path / "train.py").write_text(entrypoint_text())  # as `elfes init` writes it, anywhere
    spec = validate_spec_data(data, source=f"{tmp_path}/{name}.yaml", base=tmp_path)
    assert spec.workdir == tmp_path and spec.run_dir.is_relative_to(tmp_path / "runs")
    executor = "local" if name == "local-debug" else "slurm"
    executors.check_executor(spec, executor)
    text = executors.dry_run(spec, RunPaths(spec.run_dir), executor)
    if executor == "slurm":
        assert "#SBATCH --requeue" in text and f"#SBATCH --nodes={spec.resources.nodes}" in text
    else:
        assert f"starts {spec.resources.tasks_per_node} task(s)" in text


@pytest.mark.parametrize("name", TEMPLATES)
def test_init_writes_the_template_and_its_entrypoint_verbatim(tmp_path: Path, capsys, name: str):
    target = tmp_path / "job.yaml"
    assert main(["init", name, str(target)]) == 0
    assert target.read_text() == authoring.template_text(name)
    assert (tmp_path / "train.py").read_text() == entrypoint_text() == (REPOSITORY / "templates" / "train.py").read_text()
    output = capsys.readouterr().out
    assert f"wrote {target} (template {name}) and {tmp_path / 'train.py'}" in output
    assert main(["validate", str(target), "--executor", "local" if name == "local-debug" else "slurm"]) == 0


def test_init_keeps_a_train_py_that_is_there(tmp_path: Path, capsys):
    (tmp_path / "train.py").write_text("def main(job):\n    return None\n")
    assert main(["init", "slurm-gpu", str(tmp_path / "gpu.yaml")]) == 0
    assert (tmp_path / "train.py").read_text() == "def main(job):\n    return None\n"
    assert f"kept {tmp_path / 'train.py'}" in capsys.readouterr().out


@pytest.mark.parametrize("name", TEMPLATES)
def test_a_template_says_what_job_holds_and_bounds_its_checkpoints(name: str):
    text = authoring.template_text(name)
    for field in dataclasses.fields(Job):
        assert f"job.{field.name}" in text, f"{name}.yaml does not name job.{field.name}"
    config = yaml.safe_load(text)["config"]
    assert config["keep_checkpoints"] >= 1
    assert set(config) <= set(train_template().DEFAULTS), "every config key is one train.py reads"


def train_template():
    return importlib.import_module("elfes.launcher.templates.train")


def test_init_then_submit_trains_outside_the_repository_keeping_a_few_checkpoints(tmp_path: Path, capsys):
    """`elfes init` in a folder of its own, then `elfes submit --follow`: train.py trains there (2 ranks),
    a checkpoint each epoch, the newest 3 of them kept besides the pointers."""
    assert not tmp_path.is_relative_to(REPOSITORY)
    spec = tmp_path / "job.yaml"
    assert main(["init", "local-debug", str(spec)]) == 0
    spec.write_text(spec.read_text().replace("config: {epochs: 2,", "config: {epochs: 5,"))
    try:
        assert main(["submit", str(spec), "--executor", "local", "--follow"]) == 0, capsys.readouterr()
    finally:
        from elfes.launcher.rundir.liveness import local_processes

        paths = RunPaths(tmp_path / "runs" / "debug")
        for pid in sum(local_processes(paths).values(), []):
            os.kill(pid, signal.SIGKILL)
    checkpoints = paths.run_dir / "checkpoints"
    kept = sorted(path.name for path in checkpoints.iterdir() if not path.is_symlink())
    assert len(kept) == 3, kept
    assert (checkpoints / "last").resolve().name == kept[-1]
    written = [event for event in map(json.loads, paths.events.read_text().splitlines()) if event["event"] == "checkpoint"]
    assert len({event["path"] for event in written}) == 5, "one per epoch; the older ones were deleted"


def test_init_defaults_to_the_local_debug_template_in_job_yaml(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["init"]) == 0
    assert (tmp_path / "job.yaml").read_text() == authoring.template_text("local-debug")


def test_init_refuses_to_overwrite_and_unknown_templates(tmp_path: Path, capsys):
    target = tmp_path / "job.yaml"
    target.write_text("mine\n")
    assert main(["init", "slurm-gpu", str(target)]) == 2
    assert "already exists" in capsys.readouterr().err and target.read_text() == "mine\n"
    assert main(["init", "slurm-tpu", str(tmp_path / "other.yaml")]) == 2
    assert "choose one of: local-debug, slurm-gpu, slurm-multinode, slurm-node" in capsys.readouterr().err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["job.yaml"]
