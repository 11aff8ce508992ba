"""benchmarks/gpu_check.sh on a machine without CUDA: it installs, then stops with a clear message (exit 3)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPOSITORY = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA, the script itself is the check (minutes)")
def test_without_cuda_it_installs_then_says_no_gpu_and_exits_3(tmp_path: Path) -> None:
    # The install builds the project in a fresh environment: on a busy two-core machine (four test workers, or a
    # second suite beside this one) it has taken more than the script's 60 s for a GPU machine.
    environment = {**os.environ, "PYTHON": sys.executable, "INSTALL_S": "360"}
    environment.pop("OUT", None)
    completed = subprocess.run([str(REPOSITORY / "benchmarks" / "gpu_check.sh"), str(tmp_path)], cwd=tmp_path,
                               env=environment, capture_output=True, text=True, timeout=480)
    summary = (tmp_path / "summary.txt").read_text()
    assert completed.returncode == 3, completed.stdout + completed.stderr
    assert "install      PASS" in summary and "the project imports" in (tmp_path / "install.log").read_text()
    assert "no CUDA device: torch sees no GPU here; gpu-tests, charlm-cuda and loop-cuda need one (not run)" in summary
    assert sorted(path.name for path in tmp_path.iterdir()) == ["install.log", "summary.txt"]
