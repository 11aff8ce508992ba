"""`--set KEY=VALUE` on validate, submit (and its dry run) and resume: dotted paths into the spec,
values read as YAML scalars, validated by the spec's model with its messages; an unknown path is
refused by name; the recorded job.yaml holds the result. Login-node tests (no job runs), plus one
torch-free local job."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from launching import launch_environment
from run_fixtures import make_run, write_project

from elfes.launcher.cli.main import main
from elfes.launcher.spec.overrides import MAX_VALUE_CHARS

ELFES = str(Path(sys.executable).with_name("elfes"))


def validate(capsys, spec: Path, *sets: str) -> tuple[int, str]:
    code = main(["validate", str(spec), "--executor", "local", *(part for item in sets for part in ("--set", item))])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_set_changes_fields_by_dotted_path_with_yaml_scalars(tmp_path: Path, capsys):
    spec = write_project(tmp_path)
    code, said = validate(capsys, spec, "resources.timeout_min=30", "resources.tasks_per_node=1", "requeue.max_requeues=0",
                          "config.new_key=1", "config.nested.deep=true", "env.OMP_NUM_THREADS='2'")
    assert code == 0, said
    assert "1 task(s)" in said and "30 min per attempt; up to 0 requeues" in said


@pytest.mark.parametrize(("override", "message"), [
    ("resources.gpus=1", "--set resources.gpus: resources has no field 'gpus'; its fields are: nodes, tasks_per_node"),
    ("epochs=3", "--set epochs: a job spec has no field 'epochs'; its fields are: name, entrypoint"),
    ("slurm.partitions=long", "slurm has no field 'partitions'"),
    ("resources.nodes=0", "resources.nodes = 0: Input should be greater than or equal to 1"),
    ("resources.mem_gb=lots", 'resources.mem_gb = "lots": Input should be a valid number'),
    ("env.OMP_NUM_THREADS=1", 'env.OMP_NUM_THREADS = 1: Input should be a valid string'),
    ("env.SLURM_JOB_ID='7'", "set by the launcher in the job; remove it from env"),
    ("slurm.signal_delay_s=7200", "slurm.signal_delay_s = 7200: must be below resources.timeout_min * 60"),
    ("name.first=x", "--set name.first: name is 'demo', not a mapping"),
    ("resources.timeout_min", "--set 'resources.timeout_min': no '='; write --set KEY=VALUE"),
    ("resources..nodes=1", "is not a dotted field path"),
    ("slurm.setup=[module load cuda]", "a list, not a single value"),
    ("config.epochs={a: 1}", "a dict, not a single value"),
    ("name=a\tb", "contains a control character"),
    ("name=" + "x" * (MAX_VALUE_CHARS + 1), f"more than {MAX_VALUE_CHARS}"),
    ("name=[unclosed", "not a YAML scalar"),
], ids=lambda value: value[:40])
def test_a_bad_set_is_refused_naming_the_field_and_exits_2(tmp_path: Path, capsys, override: str, message: str):
    spec = write_project(tmp_path)
    code, said = validate(capsys, spec, override)
    assert code == 2 and message in said, said
    assert "(with --set" in said or "--set" in said


@pytest.mark.parametrize(("override", "advice"), [
    ("resources.nodes=[1,2]", "resources.nodes takes one value; give it alone, e.g. --set resources.nodes=1"),
    ("slurm.setup=[module load cuda]", "slurm.setup is a list: write it in the spec file"),
    ("command=[python, train.py]", "command is a list: write it in the spec file"),
    ("resources={nodes: 2}", "resources is a section: set its fields one by one (--set resources.FIELD=VALUE; "
                             "its fields are: nodes, tasks_per_node"),
    ("config.schedule={warmup: 2}", "set its keys one by one (--set config.schedule.NAME=VALUE) or edit the spec file"),
    ("config.layers=[64, 64]", "write a list under config.layers in the spec file"),
], ids=["number", "list-field", "command", "section", "config-mapping", "config-list"])
def test_a_list_or_mapping_is_refused_with_what_its_field_takes(tmp_path: Path, capsys, override: str, advice: str):
    code, said = validate(capsys, write_project(tmp_path), override)
    assert code == 2 and "not a single value; --set takes one scalar" in said and advice in said, said


def test_the_same_key_twice_is_refused(tmp_path: Path, capsys):
    code, said = validate(capsys, write_project(tmp_path), "config.epochs=2", "config.epochs=3")
    assert code == 2 and "--set config.epochs is given twice" in said


def test_a_dry_run_shows_the_overridden_spec_and_touches_nothing(tmp_path: Path, capsys):
    spec = write_project(tmp_path)
    assert main(["submit", str(spec), "--executor", "slurm", "--dry-run", "--set", "slurm.partition=long",
                 "--set", "resources.timeout_min=7"]) == 0
    script = capsys.readouterr().out
    assert "#SBATCH --partition=long" in script and "#SBATCH --time=7" in script
    assert not (tmp_path / "runs").exists()


def test_resume_with_set_refuses_run_dir_and_an_unknown_field(tmp_path: Path, capsys):
    paths = make_run(tmp_path, outcome="stopped")
    before = paths.state.read_bytes(), paths.spec.read_bytes()
    assert main(["resume", str(paths.run_dir), "--set", f"run_dir={tmp_path / 'elsewhere'}"]) == 2
    assert "`elfes resume` continues" in capsys.readouterr().err
    assert main(["resume", str(paths.run_dir), "--set", "resources.gpu=1"]) == 2
    assert "resources has no field 'gpu'" in capsys.readouterr().err
    assert (paths.state.read_bytes(), paths.spec.read_bytes()) == before


def test_submit_records_the_spec_with_the_overrides_applied(tmp_path: Path):
    spec = tmp_path / "job.yaml"
    spec.write_text(json.dumps({"name": "printer", "command": ["{python}", "-c", "import os; print(os.environ['GREETING'])"],
                                "run_dir": "run", "resources": {"timeout_min": 10}, "slurm": {"signal_delay_s": 60}}))
    submitted = subprocess.run([ELFES, "submit", str(spec), "--executor", "local", "--set", "env.GREETING=hello",
                                "--set", "requeue.max_requeues=1", "--set", "config.note=free-form"],
                               env=launch_environment(), capture_output=True, text=True, timeout=120)
    assert submitted.returncode == 0, submitted.stderr
    recorded = yaml.safe_load((tmp_path / "run" / "job.yaml").read_text())
    assert recorded["env"] == {"GREETING": "hello"} and recorded["requeue"]["max_requeues"] == 1
    assert recorded["config"] == {"note": "free-form"}
    state_file = tmp_path / "run" / "state.json"
    deadline = time.monotonic() + 120
    while json.loads(state_file.read_text())["status"] != "finished":
        assert time.monotonic() < deadline, state_file.read_text()
        time.sleep(0.1)
    assert "hello" in (tmp_path / "run" / "logs" / "attempt-1" / "rank-0.out").read_text()
