"""Where no cluster answers (no SLURM commands here), the cluster checks are skipped: `validate --executor
slurm` and a dry run still work on a laptop. Against a real cluster: tests/slurm/test_hostile_values_on_slurm.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from elfes.launcher.cli.main import main


def test_without_slurm_commands_the_options_are_left_to_sbatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys):
    spec = tmp_path / "job.yaml"
    spec.write_text(json.dumps({"name": "laptop", "command": ["python"], "run_dir": "run",
                                "slurm": {"partition": "gpu", "account": "proj", "qos": "high"}}))
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # no sinfo, no sacctmgr
    assert main(["validate", str(spec), "--executor", "slurm"]) == 0
    assert main(["submit", str(spec), "--executor", "slurm", "--dry-run"]) == 0
    assert "#SBATCH --partition=gpu" in capsys.readouterr().out
    assert sorted(path.name for path in tmp_path.iterdir()) == ["bin", "job.yaml"]
