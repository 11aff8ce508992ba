"""Hostile values cannot hurt: every spec value that reaches the sbatch script or the local plan either is
refused when it holds a control character (exit 2 naming the field; nothing created) or reaches it
quoted so that sbatch and bash read back exactly the value given: no directive is dropped, no command
is injected. sbatch's reading of ``#SBATCH`` lines is modelled by ``hostile.sbatch_arguments``, which
tests/slurm/test_hostile_values_on_slurm.py checks against real sbatch."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hostile import CONTROL, HOSTILE, sbatch_arguments

from elfes.launcher.cli.main import main
from elfes.launcher.rundir.paths import RunPaths
from elfes.launcher.spec import load_spec
from elfes.launcher.submit import executors


def directives(script: str) -> dict[str, str | bool]:
    """``{"time": "10", "requeue": True, ...}`` of ``script``'s sbatch arguments (each given once)."""
    found: dict[str, str | bool] = {}
    for argument in sbatch_arguments(script):
        assert argument.startswith("--"), argument
        key, equals, value = argument[2:].partition("=")
        assert key not in found, f"--{key} is given twice"
        found[key] = value if equals else True
    return found


def base_spec(project: Path, **fields: Any) -> Path:
    spec = {"name": "hostile", "command": ["{python}", "-c", "pass"], "workdir": ".", "run_dir": "run",
            "resources": {"timeout_min": 10, "mem_gb": 2}, "slurm": {"signal_delay_s": 60}, **fields}
    path = project / "job.yaml"
    path.write_text(json.dumps(spec, sort_keys=True))  # JSON is YAML, and escapes every control character
    return path


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # an injected `touch pwned-...` would land here
    return tmp_path


def assert_nothing_injected(project: Path) -> None:
    assert not [path.name for path in project.rglob("pwned*")]


@pytest.mark.parametrize("value", HOSTILE, ids=range(len(HOSTILE)))
def test_the_sbatch_script_carries_each_hostile_value_exactly(project: Path, value: str):
    folder = project / value.replace("/", "_").strip()
    (folder / "code").mkdir(parents=True)
    slurm = {"signal_delay_s": 60, "partition": value, "account": value, "qos": value, "constraint": value,
             "setup": ["echo setup-ran"], "additional": {"comment": value, "mail-user": value, "exclusive": True}}
    spec = load_spec(base_spec(project, workdir=str(folder / "code"), run_dir=str(folder / "run"), slurm=slurm,
                               env={"HOSTILE": value}))
    script = executors.sbatch_script(spec, RunPaths(spec.run_dir))

    read = directives(script)
    for option in ("partition", "account", "qos", "constraint", "comment", "mail-user"):
        assert read[option] == value, option
    assert read["chdir"] == str(folder / "code")
    assert read["output"] == str(folder / "run" / "submitit" / "%j_0_log.out")
    assert read["error"] == str(folder / "run" / "submitit" / "%j_0_log.err")
    # The directives the launcher manages all survive, whatever came before them.
    assert (read["time"], read["signal"], read["mem"], read["requeue"], read["exclusive"]) == (
        "10", "USR2@60", "2GB", True, True)
    assert read["job-name"] == "hostile" and read["open-mode"] == "append"

    # bash reads the script's lines back to the same values; the setup line runs as written.
    body = script.replace("srun ", "printf '%s\\n' srun ", 1)
    ran = subprocess.run(["bash", "-c", body + '\nprintf "HOSTILE=%s\\n" "$HOSTILE"'], cwd=project,
                         capture_output=True, text=True, timeout=60, check=True)
    lines = ran.stdout.split("\n")
    assert lines[0] == "setup-ran" and f"HOSTILE={value}" in ran.stdout
    assert lines[1:5] == ["srun", "--unbuffered", "--output", str(folder / "run" / "submitit" / "%j_%t_log.out")]
    assert str(folder / "run" / "submitit") in lines  # the folder argument of submitit's entry point
    assert_nothing_injected(project)


@pytest.mark.parametrize("value", HOSTILE, ids=range(len(HOSTILE)))
def test_the_local_plan_quotes_each_hostile_value(project: Path, value: str):
    folder = project / value.replace("/", "_").strip()
    (folder / "code").mkdir(parents=True)
    spec = load_spec(base_spec(project, workdir=str(folder / "code"), run_dir=str(folder / "run"),
                               env={"HOSTILE": value, "PLAIN": "1"}))
    plan = executors.local_plan(spec, RunPaths(spec.run_dir), python="python3")
    benign = executors.local_plan(load_spec(base_spec(project)), RunPaths(project / "run"), python="python3")
    assert len(plan.splitlines()) == len(benign.splitlines())
    commands = [shlex.split(line) for line in plan.splitlines() if not line.startswith("#")]
    assert commands[0] == ["cd", str(folder / "code")]
    controller = commands[1]
    assert controller[:4] == ["setsid", "env", f"HOSTILE={value}", "PLAIN=1"]
    assert str(folder / "run" / "submitit") in controller
    assert controller[-4:] == [">>", str(folder / "run" / "submitit" / "controller.log"), "2>&1", "&"]
    assert_nothing_injected(project)


def test_the_issue_injection_is_refused_naming_the_field(project: Path, capsys):
    spec = base_spec(project, slurm={"signal_delay_s": 60, "additional": {"comment": "x\n touch FILE\n#"}})
    for argv in (["validate", str(spec)], ["submit", str(spec), "--executor", "slurm", "--dry-run"],
                 ["submit", str(spec), "--executor", "local"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert 'slurm.additional.comment = "x\\n touch FILE\\n#": contains a newline (\\n) at character 2' in err, err
        assert "one line of printable text" in err and "\n" not in err.rstrip("\n"), err
    assert sorted(path.name for path in project.iterdir()) == ["job.yaml"]


def test_a_trailing_newline_from_a_yaml_block_is_refused_naming_the_field_and_the_fix(project: Path, capsys):
    spec = project / "job.yaml"
    spec.write_text("name: hostile\ncommand: [python]\nrun_dir: run\nslurm:\n  partition: |\n    gpu\n")
    assert main(["validate", str(spec)]) == 2
    err = capsys.readouterr().err
    assert 'slurm.partition = "gpu\\n": contains a newline (\\n) at its end' in err, err
    assert "use |- or >-" in err, err


FIELDS_REACHING_A_SCRIPT = {
    "workdir": lambda bad: {"workdir": bad},
    "run_dir": lambda bad: {"run_dir": bad},
    "slurm.partition": lambda bad: {"slurm": {"partition": bad}},
    "slurm.account": lambda bad: {"slurm": {"account": bad}},
    "slurm.qos": lambda bad: {"slurm": {"qos": bad}},
    "slurm.constraint": lambda bad: {"slurm": {"constraint": bad}},
    "slurm.setup[1]": lambda bad: {"slurm": {"setup": ["module load x", bad]}},
    "slurm.additional.comment": lambda bad: {"slurm": {"additional": {"comment": bad}}},
    "env.HOSTILE": lambda bad: {"env": {"HOSTILE": bad}},
    "name": lambda bad: {"name": bad},
}


@pytest.mark.parametrize("field", FIELDS_REACHING_A_SCRIPT)
@pytest.mark.parametrize("bad", CONTROL, ids=range(len(CONTROL)))
def test_a_control_character_is_refused_in_every_field_that_reaches_a_script(project: Path, capsys, field, bad):
    fields = FIELDS_REACHING_A_SCRIPT[field](bad)
    if "slurm" in fields:
        fields["slurm"]["signal_delay_s"] = 60
    spec = base_spec(project, **fields)
    before = sorted(project.rglob("*"))
    assert main(["validate", str(spec), "--executor", "local"]) == 2
    err = capsys.readouterr().err
    assert f"{field} = {json.dumps(bad)}" in err, err
    if field != "name":  # the name's own pattern (letters, digits, . _ -) answers first
        assert "one line of printable text" in err, err
    assert sorted(project.rglob("*")) == before


def test_an_additional_option_name_with_a_control_character_is_named_printably(project: Path, capsys):
    spec = base_spec(project, slurm={"signal_delay_s": 60, "additional": {"mail\ntype": "END"}})
    assert main(["validate", str(spec)]) == 2
    err = capsys.readouterr().err
    assert 'slurm.additional["mail\\ntype"] = "END": not an sbatch option name' in err, err


def test_a_command_may_hold_newlines_but_no_nul(project: Path, capsys):
    # The command reaches no shell (an argument list in the job): a multi-line `python -c` program is fine.
    program = "import sys\nprint(sys.argv)\n"
    assert load_spec(base_spec(project, command=["{python}", "-c", program])).command == ["{python}", "-c", program]
    assert main(["validate", str(base_spec(project, command=["python", "a\x00b"]))]) == 2
    err = capsys.readouterr().err
    assert 'command[1] = "a\\u0000b": contains a NUL character' in err, err


def test_a_run_directory_with_a_percent_sign_is_refused_for_slurm_only(project: Path, capsys):
    # sbatch and srun read % in --output/--error as a file-name pattern: the logs would go elsewhere.
    spec = base_spec(project, run_dir="runs/50%j")
    assert main(["validate", str(spec), "--executor", "slurm"]) == 2
    err = capsys.readouterr().err
    assert f"run_dir = {str(project / 'runs' / '50%j')!r}: contains '%'" in err, err
    assert main(["validate", str(spec), "--executor", "local"]) == 0


def test_a_run_directory_with_a_backslash_is_refused_for_slurm_only(project: Path, capsys):
    # sbatch drops a backslash of --output/--error and then expands no %j: the logs would go elsewhere.
    run_dir = project / "runs\\a"
    spec = base_spec(project, run_dir=str(run_dir))
    for verb in (["validate", str(spec)], ["submit", str(spec), "--dry-run"]):
        assert main([*verb, "--executor", "slurm"]) == 2
        err = capsys.readouterr().err
        assert f"run_dir = {str(run_dir)!r}: contains a backslash, which sbatch reads as turning" in err, err
        assert "give a run directory without a backslash for SLURM" in err
    assert main(["validate", str(spec), "--executor", "local"]) == 0
    assert not run_dir.exists()


def test_a_setup_line_sbatch_would_read_as_a_directive_is_refused(project: Path, capsys):
    # Without env exports the setup lines follow the directives: a `#SBATCH` comment there is one more directive.
    spec = base_spec(project, slurm={"signal_delay_s": 60, "setup": ["module load cuda", "  #SBATCH --time=1"]})
    assert main(["validate", str(spec)]) == 2
    err = capsys.readouterr().err
    assert 'slurm.setup[1] = "  #SBATCH --time=1": sbatch would read this comment as a directive' in err, err
