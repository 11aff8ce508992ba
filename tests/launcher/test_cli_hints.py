"""What the CLI tells a new user: `elfes --help` says what `job` holds and how to start; the commands it
suggests are shell words (a path with spaces comes quoted), so they can be pasted as they are."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

import pytest
from run_fixtures import write_project

from elfes.launcher.cli.main import main
from elfes.launcher.job.runtime import Job


def test_help_names_every_field_of_job_and_the_step_contract(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for field in dataclasses.fields(Job):
        assert f"job.{field.name}" in text, f"elfes --help does not say what job.{field.name} is"
    assert "StepOutput(loss=" in text and "num_samples=" in text and "return its TrainState" in text
    assert "Start with: elfes init local-debug job.yaml (writes job.yaml and train.py)" in text


def test_init_suggests_quoted_commands(tmp_path: Path, capsys):
    folder = tmp_path / "my project"
    folder.mkdir()
    spec = folder / "job.yaml"
    assert main(["init", "local-debug", str(spec)]) == 0
    output = capsys.readouterr().out
    assert f"elfes validate {shlex.quote(str(spec))}; elfes submit {shlex.quote(str(spec))} --follow" in output
    assert "'" in shlex.quote(str(spec))


def test_submit_suggests_quoted_commands_to_follow_the_run(tmp_path: Path, capsys):
    spec = write_project(tmp_path / "my project")
    run_dir = tmp_path / "my project" / "runs" / "demo"
    assert main(["submit", str(spec), "--executor", "local"]) == 0
    output = capsys.readouterr().out
    quoted = shlex.quote(str(run_dir))
    assert f"follow it: elfes status {quoted}   (or elfes logs {quoted} --follow)" in output
    assert main(["status", str(run_dir), "--until", "ended", "--timeout-s", "120"]) == 0, capsys.readouterr()
