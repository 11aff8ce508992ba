"""`elfes submit --dry-run` prints the sbatch script of a multi-node GPU job, identical to a committed
golden file (no SLURM needed), and touches nothing. Regenerate on purpose with ELFES_UPDATE_GOLDEN=1."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

import pytest

from elfes.launcher.cli.main import main
from elfes.launcher.rundir.paths import RunPaths
from elfes.launcher.spec import load_spec
from elfes.launcher.submit import executors

GOLDEN = Path(__file__).parent / "golden"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    shutil.copy(GOLDEN / "multinode-gpu.yaml", tmp_path / "job.yaml")
    (tmp_path / "train.py").write_text("def main(job):\n    return None\n")
    return tmp_path


def normalised(text: str, project: Path) -> str:
    return text.replace(shlex.quote(sys.executable), "PYTHON").replace(str(project), "/SPEC_DIR")


def test_the_dry_run_prints_the_golden_sbatch_script_and_touches_nothing(project: Path, capsys):
    before = sorted(project.rglob("*"))
    assert main(["submit", str(project / "job.yaml"), "--executor", "slurm", "--dry-run"]) == 0
    script = normalised(capsys.readouterr().out, project)
    assert sorted(project.rglob("*")) == before
    golden = GOLDEN / "multinode-gpu.sbatch"
    if os.environ.get("ELFES_UPDATE_GOLDEN"):
        golden.write_text(script)
    assert script == golden.read_text()
    # What the golden file must say, whatever else submitit adds.
    for line in ("#SBATCH --requeue", "#SBATCH --signal=USR2@300", "#SBATCH --open-mode=append",
                 "#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=8", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --job-name=golden-4x8", "#SBATCH --chdir=/SPEC_DIR/runs/golden/code/1",  # the code snapshot
                 "#SBATCH --output=/SPEC_DIR/runs/golden/submitit/%j_0_log.out", "export MESSAGE='two words'",
                 "module load cuda/12.4"):
        assert line in script.splitlines(), line


def test_the_dry_run_is_the_script_submitits_slurm_executor_writes(project: Path):
    if shutil.which("srun") is None:
        pytest.skip("SlurmExecutor cannot be built without srun on PATH")
    from submitit import SlurmExecutor

    spec = load_spec(project / "job.yaml")
    paths = RunPaths(spec.run_dir)
    executor = SlurmExecutor(folder=paths.submitit)
    executor.update_parameters(**executors.slurm_parameters(spec))
    written = executor._make_submission_file_text(executor._submitit_command_str, "uid")
    assert written == executors.sbatch_script(spec, paths)
    assert not paths.run_dir.exists()


def test_the_local_dry_run_shows_the_processes_it_would_start(project: Path, capsys):
    spec = project / "job.yaml"
    text = spec.read_text().replace("nodes: 4, tasks_per_node: 8, gpus_per_node: 8", "nodes: 1, tasks_per_node: 2, gpus_per_node: 0")
    spec.write_text(text)
    before = sorted(project.rglob("*"))
    assert main(["submit", str(spec), "--executor", "local", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert sorted(project.rglob("*")) == before
    assert "starts 2 task(s) (ranks 0-1, CPU, gloo)" in out
    assert "-m elfes.launcher.submit.local_controller" in out and "-m submitit.core._submit" in out
    assert f"cd {project}" in out and "OMP_NUM_THREADS=12" in out
    assert f"JobRuntime({str(project / 'runs' / 'golden')!r})" in out


def test_a_local_dry_run_of_several_nodes_is_refused_naming_the_field(project: Path, capsys):
    assert main(["submit", str(project / "job.yaml"), "--executor", "local", "--dry-run"]) == 2
    assert "resources.nodes = 4: the local executor runs on this machine only" in capsys.readouterr().err
