"""The README's commands and reference tables stay true."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from elfes.records import event_reference, read_events


def _tests_conftest():
    """tests/conftest.py, loaded by path: tests/slurm has a conftest.py too, and whichever pytest imported
    last owns the module name "conftest", so `from conftest import ...` may find the wrong one."""
    spec = importlib.util.spec_from_file_location("tests_conftest", Path(__file__).resolve().parent / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_SHARED = _tests_conftest()
REPOSITORY = _SHARED.REPOSITORY
launch_environment = _SHARED.launch_environment

README = (REPOSITORY / "README.md").read_text()


CI_SCRIPT = (REPOSITORY / ".ci" / "run").read_text()


def section(title: str) -> str:
    """The text of the README's ``## title`` section."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README, flags=re.S | re.M)
    assert match, f"the README has a '## {title}' section"
    return match[1]


def bash_blocks(text: str = README) -> list[str]:
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]


def commands(block: str) -> list[str]:
    """A bash block's commands, comments removed."""
    return [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_the_test_command_is_what_ci_runs():
    run_example, run_tests = bash_blocks(section("The two commands"))[:2]
    ci_commands = [line for line in CI_SCRIPT.splitlines() if line and not line.startswith("#")]
    assert ci_commands[-1] == run_tests


def test_the_install_section_sets_up_a_virtual_environment_then_torch_then_the_package():
    install = section("Install")
    steps = commands("\n".join(bash_blocks(install)))
    python = re.search(r'requires-python = ">=(\d+\.\d+)"', (REPOSITORY / "pyproject.toml").read_text())[1]
    assert f"Python {python} or newer" in install
    assert steps[0].startswith("python3 -m venv ") and steps[1].startswith("source ")
    cpu_torch = "python -m pip install torch --index-url https://download.pytorch.org/whl/cpu"
    assert steps.index(cpu_torch) < steps.index('python -m pip install -e ".[test]"'), "torch before the package"
    assert 'python -m pip install --quiet -e ".[test]"' in CI_SCRIPT  # the package installs as CI installs it
    prose = " ".join(install.split())
    assert "the ordinary index (PyPI) gives a CUDA build on Linux" in prose and "from the repository root" in prose


def test_the_ci_script_tells_other_machines_where_the_cpu_build_of_torch_comes_from():
    comments = " ".join(line.lstrip("# ") for line in CI_SCRIPT.splitlines() if line.startswith("#"))
    assert "CI machine" in comments
    assert "https://download.pytorch.org/whl/cpu" in comments and "README" in comments


def test_the_example_job_command_runs_here_and_exits_0_when_the_run_finished(tmp_path):
    run_job = bash_blocks(section("The two commands"))[0]
    assert run_job == "elfes submit examples/quickstart/job.yaml --follow"
    (tmp_path / "examples").symlink_to(REPOSITORY / "examples")  # the spec's paths resolve under tmp_path
    elfes = str(Path(sys.executable).with_name("elfes"))
    completed = subprocess.run(run_job.replace("elfes", elfes, 1), shell=True, cwd=tmp_path, env=launch_environment(),
                               capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert "submitted as local job" in completed.stdout and "elfes: run finished" in completed.stdout
    run_dir = tmp_path / "runs" / "quickstart-job"
    assert json.loads((run_dir / "state.json").read_text())["status"] == "finished"
    assert [event["event"] for event in read_events(run_dir)].count("finished") == 1


def test_the_tour_and_the_launcher_sections_name_real_commands_files_and_states():
    from elfes.launcher.cli.parser import build_parser
    from elfes.launcher.rundir.paths import RunPaths
    from elfes.launcher.rundir.state import STATUSES

    for command in commands("\n".join(bash_blocks(section("A tour: preempt it, watch it resume")))):
        build_parser().parse_args(command.split()[1:])  # argparse exits on an unknown verb or option
    layout = section("The run directory")
    paths = RunPaths("RUN_DIR")
    for path in (paths.spec, paths.state, paths.events, paths.checkpoints, paths.logs, paths.pids, paths.submitit,
                 paths.cancel_marker):
        assert path.name in layout, path.name
    assert "logs/attempt-<A>/rank-<R>.out" in layout and "pids/rank-<R>.json" in layout
    assert paths.rank_log(2, 3).relative_to(paths.run_dir) == Path("logs/attempt-2/rank-3.out")
    assert paths.pid_file(3).relative_to(paths.run_dir) == Path("pids/rank-3.json")
    diagram = re.search(r"```mermaid\n(.*?)```", section("The state machine"), flags=re.S)[1]
    assert set(STATUSES) <= set(re.findall(r"\w+", diagram))


def test_the_example_exit_statuses_are_documented():
    """tests/examples/test_quickstart.py checks them with real signals."""
    prose = " ".join(section("The example script without the launcher").split())
    assert "exits with status 0 when the run finished and with 128 + the signal's number" in prose
    assert "143 for SIGTERM, 130 for SIGINT" in prose


def test_the_example_command_trains_and_a_second_run_continues_from_last(tmp_path):
    run_example = bash_blocks(section("The example script without the launcher"))[0]
    (tmp_path / "examples").symlink_to(REPOSITORY / "examples")
    environment = launch_environment(OMP_NUM_THREADS="2")
    run_dir = tmp_path / "runs" / "quickstart"
    outputs = []
    for extra in (" --epochs 3", " --epochs 6"):
        completed = subprocess.run(run_example + extra, shell=True, cwd=tmp_path, env=environment,
                                   capture_output=True, text=True, timeout=300)
        assert completed.returncode == 0, completed.stderr[-3000:]
        outputs.append(completed.stdout)
    assert "finished at epoch 3" in outputs[0] and "finished at epoch 6" in outputs[1]
    events = read_events(run_dir)
    resumed = next(event for event in events if event["event"] == "resumed")
    assert resumed["state"]["epoch"] == 3 and resumed["resumed_from"].endswith(".pt")
    assert [event["event"] for event in events].count("started") == 1
    assert (run_dir / "model.pt").exists() and (run_dir / "checkpoints" / "final").is_symlink()


@pytest.mark.distributed
def test_the_two_process_example_command_runs(tmp_path):
    command = re.search(r"`(ACCELERATE_USE_CPU=1 torchrun [^`]*)`", README)[1]
    (tmp_path / "examples").symlink_to(REPOSITORY / "examples")
    completed = subprocess.run(command + " --epochs 3", shell=True, cwd=tmp_path, env=launch_environment(),
                               capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    started = read_events(tmp_path / "runs" / "quickstart-2")[0]
    assert started["event"] == "started" and started["world_size"] == 2
    assert completed.stdout.count("finished at epoch 3") == 1  # only the main process prints


def test_the_event_table_matches_the_schema():
    table = README.split("<!-- events:begin -->\n", 1)[1].split("\n<!-- events:end -->", 1)[0]
    assert table == event_reference()


def test_the_elfes_command_reports_its_version_without_importing_torch():
    beside_python = Path(sys.executable).with_name("elfes")  # where pip puts this interpreter's scripts
    command = str(beside_python) if beside_python.exists() else shutil.which("elfes")
    assert command, "the elfes console script is installed with the package (pip install -e .)"
    completed = subprocess.run([command, "--version"], capture_output=True, text=True)
    assert completed.returncode == 0 and completed.stdout.strip() == "elfes 0.1.0"
    probe = subprocess.run(
        [sys.executable, "-c", "import sys; from elfes.launcher.cli.main import main; main(['schema']); print('torch' in sys.modules)"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPOSITORY)},
    )
    assert probe.returncode == 0 and probe.stdout.strip().endswith("False")


def test_the_benchmark_command_shows_progress_then_prints_its_table_and_writes_json(tmp_path):
    """`python -m benchmarks --smoke` runs every benchmark at tiny sizes. Nothing is timed here: only what
    the command prints and writes is checked (and that a resume reads none of the skipped batches)."""
    written = tmp_path / "results.json"
    benchmark = subprocess.Popen(
        [sys.executable, "-m", "benchmarks", "--smoke", "--json", str(written)], cwd=REPOSITORY,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=launch_environment(),
    )
    try:
        plan = benchmark.stderr.readline()
        first_round = benchmark.stderr.readline()
        still_running = benchmark.poll() is None  # progress is reported as it goes, not all at the end
        stdout, rest = benchmark.communicate(timeout=900)
    finally:
        benchmark.kill()
    assert benchmark.returncode == 0, rest[-3000:]
    assert "6 benchmark(s) x 1 round(s) (smoke sizes)" in plan
    assert re.search(r"loop tiny: round 1/1: hand wall [\d.]+ s cpu [\d.]+ s, elfes wall", first_round)
    assert still_running
    assert "ELFES benchmarks" in stdout and "SMOKE SIZES" in stdout
    for name in ("loop", "checkpoint", "stop", "resume", "login"):
        assert re.search(rf"^│ {name} +│", stdout, flags=re.M), name
    results = json.loads(written.read_text())
    assert set(results) == {"machine", "settings", "results"}
    assert {"date", "cpu", "cores", "load_average", "python", "versions", "commit"} <= set(results["machine"])
    assert {"torch", "accelerate"} <= set(results["machine"]["versions"])
    rows = results["results"]
    fields = {"benchmark", "case", "measure", "unit", "value", "reference", "reference_name", "kind", "result",
              "target", "holds", "rounds", "details"}
    assert all(set(row) == fields and row["kind"] in ("ratio", "difference", "value") for row in rows)
    assert {row["benchmark"] for row in rows} == {"loop", "checkpoint", "stop", "resume", "login"}
    assert {row["case"] for row in rows if row["benchmark"] == "login"} == {
        "elfes --help", "elfes status", "elfes validate", "elfes submit --dry-run"}
    assert any(row["case"] == "tiny, 2 ranks" for row in rows)
    (skipped,) = [row for row in rows if row["measure"].startswith("samples of skipped batches")]
    assert skipped["result"] == 0 and skipped["holds"] is True
