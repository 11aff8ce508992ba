"""The templates of `elfes init`: each one is a valid spec (its entrypoint found in this repository),
ships inside the installed package, and `elfes init` writes it verbatim without overwriting anything."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from run_fixtures import REPOSITORY

from elfes.launcher import actions, executors
from elfes.launcher.cli import main
from elfes.launcher.paths import RunPaths
from elfes.launcher.spec import validate_spec_data

TEMPLATES = ["local-debug", "slurm-gpu", "slurm-multinode", "slurm-node"]


def test_the_four_templates_ship_in_the_package():
    assert actions.template_names() == TEMPLATES
    for name in TEMPLATES:
        assert actions.template_text(name) == (REPOSITORY / "templates" / f"{name}.yaml").read_text()


@pytest.mark.parametrize("name", TEMPLATES)
def test_a_template_is_a_valid_spec_for_its_executor(name: str):
    data = yaml.safe_load(actions.template_text(name))
    # Written into the repository root, its entrypoint (the quickstart job) is found there.
    spec = validate_spec_data(data, source=f"templates/{name}.yaml", base=REPOSITORY)
    assert spec.workdir == REPOSITORY and spec.run_dir.is_relative_to(REPOSITORY / "runs")
    executor = "local" if name == "local-debug" else "slurm"
    executors.check_executor(spec, executor)
    text = executors.dry_run(spec, RunPaths(spec.run_dir), executor)
    if executor == "slurm":
        assert "#SBATCH --requeue" in text and f"#SBATCH --nodes={spec.resources.nodes}" in text
    else:
        assert f"starts {spec.resources.tasks_per_node} task(s)" in text


@pytest.mark.parametrize("name", TEMPLATES)
def test_init_writes_the_template_verbatim(tmp_path: Path, capsys, name: str):
    target = tmp_path / "job.yaml"
    assert main(["init", name, str(target)]) == 0
    assert target.read_text() == actions.template_text(name)
    assert f"wrote {target}" in capsys.readouterr().out


def test_init_defaults_to_the_local_debug_template_in_job_yaml(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["init"]) == 0
    assert (tmp_path / "job.yaml").read_text() == actions.template_text("local-debug")


def test_init_refuses_to_overwrite_and_unknown_templates(tmp_path: Path, capsys):
    target = tmp_path / "job.yaml"
    target.write_text("mine\n")
    assert main(["init", "slurm-gpu", str(target)]) == 2
    assert "already exists" in capsys.readouterr().err and target.read_text() == "mine\n"
    assert main(["init", "slurm-tpu", str(tmp_path / "other.yaml")]) == 2
    assert "choose one of: local-debug, slurm-gpu, slurm-multinode, slurm-node" in capsys.readouterr().err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["job.yaml"]
