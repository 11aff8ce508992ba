"""sbatch's refusal reaches the user once: `elfes submit` exits 3 with one error line that carries
sbatch's own words. The sbatch here is a stand-in that refuses as SLURM's does (its message on stderr,
exit 1); what is tested is how the launcher passes it on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from launching import launch_environment

REFUSAL = "sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified"


def test_an_sbatch_refusal_is_printed_once(tmp_path: Path):
    bin_folder = tmp_path / "bin"
    bin_folder.mkdir()
    (bin_folder / "sbatch").write_text(f"#!/bin/sh\necho '{REFUSAL}' >&2\nexit 1\n")
    (bin_folder / "srun").write_text("#!/bin/sh\nexit 0\n")  # submitit looks for it before it submits
    for tool in ("sbatch", "srun"):
        (bin_folder / tool).chmod(0o755)
    elfes = [sys.executable, "-m", "elfes"]
    assert subprocess.run([*elfes, "init", "slurm-gpu", str(tmp_path / "job.yaml")], capture_output=True,
                          timeout=60).returncode == 0
    environment = launch_environment()
    environment["PATH"] = f"{bin_folder}:{environment['PATH']}"
    completed = subprocess.run([*elfes, "submit", str(tmp_path / "job.yaml"), "--executor", "slurm"], cwd=tmp_path,
                               env=environment, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 3, completed.stderr
    assert completed.stderr.count("Invalid account") == 1, completed.stderr
    assert completed.stderr.startswith("elfes: error: sbatch refused job train-1gpu") and REFUSAL in completed.stderr
