"""Login node: wall time of ``elfes --help``, ``status``, ``validate`` and ``submit --dry-run``.

Each round runs every command once, in rotating order, next to ``python -c pass`` (the floor any
Python command pays). ``status`` reads a real finished run: the benchmark first submits a one-epoch
quickstart job to the local executor and follows it to the end. The commands run through the
``elfes`` console script installed beside this interpreter (not a version manager's shim, which adds
its own start-up), else ``python -m elfes``.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from .measure import REPOSITORY, Progress, Row, child_environment, run_command

TARGETS = {"--help": 0.3, "status": 0.5, "validate": 0.5, "submit --dry-run": 0.5}

SPEC = """\
name: benchmark-login
entrypoint: examples.quickstart.job:main
workdir: {workdir}
run_dir: {run_dir}
config: {{epochs: 1, batch_size: 16, accumulation: 2, train_samples: 64, validation_samples: 16}}
resources: {{nodes: 1, tasks_per_node: 1, gpus_per_node: 0, cpus_per_task: 1, mem_gb: 4, timeout_min: 10}}
env: {{OMP_NUM_THREADS: "1"}}
"""


def elfes_command() -> list[str]:
    for python in (sys.executable, getattr(sys, "_base_executable", sys.executable)):  # a venv's, then its base's
        beside = Path(python).with_name("elfes")
        if beside.exists():
            return [str(beside)]
    return [sys.executable, "-m", "elfes"]


def run(rounds: int, progress: Progress, *, smoke: bool = False) -> list[Row]:
    elfes = elfes_command()
    with tempfile.TemporaryDirectory(prefix="elfes-login-bench-") as folder:
        spec = Path(folder) / "job.yaml"
        run_dir = Path(folder) / "run"
        spec.write_text(SPEC.format(workdir=REPOSITORY, run_dir=run_dir))
        submitted = subprocess.run([*elfes, "submit", str(spec), "--executor", "local", "--follow"], cwd=folder,
                                   env=child_environment(), capture_output=True, text=True, timeout=600)
        if submitted.returncode != 0:
            raise RuntimeError(f"the login benchmark's job did not finish:\n{submitted.stdout[-3000:]}{submitted.stderr[-2000:]}")
        progress(f"login: ran a one-epoch local job for `elfes status` ({run_dir})")
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "--help": [*elfes, "--help"],
            "status": [*elfes, "status", str(run_dir)],
            "validate": [*elfes, "validate", str(spec), "--executor", "local"],
            "submit --dry-run": [*elfes, "submit", "--dry-run", str(spec), "--executor", "local"],
        }
        env = child_environment()
        samples: dict[str, list[dict[str, float]]] = {name: [] for name in commands}
        names = list(commands)
        for name in names:  # warm-up: the page cache holds every module afterwards
            run_command(commands[name], cwd=Path(folder), env=env)
        for round_index in range(rounds):
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                samples[name].append(run_command(commands[name], cwd=Path(folder), env=env))
            progress(f"login: round {round_index + 1}/{rounds}: " + ", ".join(
                f"{name} {samples[name][-1]['wall_s']:.3f} s" for name in names))
    floor = statistics.median(sample["wall_s"] for sample in samples["python -c pass"])
    rows = []
    for name, target in TARGETS.items():
        walls = [sample["wall_s"] for sample in samples[name]]
        over = [sample["wall_s"] - base["wall_s"] for sample, base in zip(samples[name], samples["python -c pass"])]
        details = {"command": " ".join(commands[name][len(elfes):]) if name != "python -c pass" else None,
                   "cpu_s": statistics.median(sample["cpu_s"] for sample in samples[name]),
                   "python_pass_cpu_s": statistics.median(sample["cpu_s"] for sample in samples["python -c pass"]),
                   "over_python_pass_s": statistics.median(over)}
        rows.append(Row("login", f"elfes {name}", "wall time of the command", "s", statistics.median(walls), floor,
                        "python -c pass", "value", statistics.median(walls), target=f"<= {target:g}", rounds=rounds,
                        details=details))
    return rows
