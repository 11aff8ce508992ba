"""Every login-node command path runs without importing torch or numpy (checked in a fresh process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from launching import launch_environment
from run_fixtures import make_run, write_project

PROBE = """
import json, sys
from elfes.launcher.cli.main import main
try:
    code = main(json.loads(sys.argv[1]))
except SystemExit as exit:
    code = exit.code
with open(sys.argv[2], "w") as report:
    json.dump({"code": code, "loaded": sorted(m for m in ("torch", "numpy") if m in sys.modules)}, report)
"""

COMMANDS = {
    "help": ["--help"],
    "submit-help": ["submit", "--help"],
    "validate": ["validate", "{spec}", "--executor", "local"],
    "status": ["status", "{run}"],
    "status-json": ["status", "{run}", "--json"],
    "logs": ["logs", "{run}", "--rank", "1"],
    "logs-follow": ["logs", "{run}", "--follow"],
    "schema": ["schema"],
    "init": ["init", "slurm-gpu", "{folder}/new.yaml"],
    "submit-dry-run-slurm": ["submit", "{spec}", "--executor", "slurm", "--dry-run"],
    "submit-dry-run-local": ["submit", "{spec}", "--executor", "local", "--dry-run"],
    "validate-set": ["validate", "{spec}", "--set", "config.epochs=3", "--set", "slurm.partition=long"],
    "submit-dry-run-set": ["submit", "{spec}", "--executor", "slurm", "--dry-run", "--set", "resources.timeout_min=5"],
    "doctor-help": ["doctor", "--help"],
    "export-help": ["export", "--help"],
    "doctor": ["doctor", "{spec}"],
}
# Exit codes other than 0 that a command may have here: doctor asks SLURM (scontrol), and exits 3 where
# no cluster answers; its imports are the same either way (tests/slurm runs it against a real cluster).
ALSO_ALLOWED = {"doctor": (3,)}


@pytest.mark.parametrize("command", list(COMMANDS), ids=list(COMMANDS))
def test_a_login_node_command_imports_neither_torch_nor_numpy(tmp_path: Path, command: str):
    paths = make_run(tmp_path / "existing")
    spec = write_project(tmp_path / "fresh", "fresh")
    values = {"spec": str(spec), "run": str(paths.run_dir), "folder": str(tmp_path)}
    argv = [part.format(**values) for part in COMMANDS[command]]
    report = tmp_path / "report.json"
    completed = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv), str(report)], cwd=tmp_path,
                               env=launch_environment(), capture_output=True, text=True, timeout=120)
    assert report.exists(), completed.stderr[-3000:]
    result = json.loads(report.read_text())
    assert result["code"] in (0, *ALSO_ALLOWED.get(command, ())), completed.stdout[-2000:] + completed.stderr[-2000:]
    assert result["loaded"] == [], f"elfes {' '.join(argv)} imported {result['loaded']}"


def test_status_json_of_an_ended_run_loads_neither_the_spec_models_nor_rich(tmp_path: Path):
    # `elfes status` is polled (by scripts, by a sweep's watchers) on loaded login nodes: it loads what it
    # reads with, not pydantic (the spec's models) nor rich (tables), whose imports were most of its time.
    paths = make_run(tmp_path / "existing")
    probe = PROBE.replace('("torch", "numpy")', '("torch", "numpy", "pydantic", "rich", "elfes.launcher.spec")')
    report = tmp_path / "report.json"
    completed = subprocess.run([sys.executable, "-c", probe, json.dumps(["status", str(paths.run_dir), "--json"]),
                                str(report)], cwd=tmp_path, env=launch_environment(), capture_output=True, text=True,
                               timeout=120)
    assert report.exists(), completed.stderr[-3000:]
    result = json.loads(report.read_text())
    assert result == {"code": 0, "loaded": []}, completed.stderr[-2000:]
