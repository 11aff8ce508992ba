"""A hand-over reads the run directory once: `elfes submit` and `elfes resume` of a run read its `state.json` and
its recorded `job.yaml` once each while the hand-over holds the run's locks (launcher/submit/transaction.py),
and decide on what they read. Real local `command:` jobs."""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from pathlib import Path

from launching import kill_local_run, launch_environment

from elfes.launcher.cli.main import main
from elfes.launcher.rundir import state as run_state
from elfes.launcher.rundir.paths import RunPaths
from elfes.launcher.spec import loading
from elfes.launcher.submit import transaction


def test_a_hand_over_reads_state_json_and_job_yaml_once(tmp_path: Path, monkeypatch):
    for name, value in launch_environment().items():
        monkeypatch.setenv(name, value)
    spec = tmp_path / "reads.yaml"
    spec.write_text(json.dumps({
        "name": "reads", "command": ["{python}", "-c", "raise SystemExit(3)"], "run_dir": "reads",
        "requeue": {"max_failures": 0},
        "resources": {"tasks_per_node": 1, "timeout_min": 10}, "slurm": {"signal_delay_s": 60},
    }))
    paths = RunPaths(tmp_path / "reads")
    reads: Counter[str] = Counter()
    holding = []
    load_state, read_text, held = run_state.load_state, loading._read_text, transaction.held

    def counted_load_state(run_paths):
        reads["state.json" if holding else "state.json before"] += run_paths.state == paths.state
        return load_state(run_paths)

    def counted_read_text(path):
        reads["job.yaml" if holding else "job.yaml before"] += Path(path) == paths.spec
        return read_text(path)

    @contextlib.contextmanager
    def counted_held(*args, **kwargs):
        with held(*args, **kwargs) as run:
            holding.append(run)
            try:
                yield run
            finally:
                holding.pop()

    monkeypatch.setattr(run_state, "load_state", counted_load_state)
    monkeypatch.setattr(loading, "_read_text", counted_read_text)
    monkeypatch.setattr(transaction, "held", counted_held)
    try:
        # A fresh run has no job.yaml yet; the failed run's resume reads the one its submission recorded.
        for argv, expected in ((["submit", str(spec), "--executor", "local"], (1, 0)),
                               (["resume", str(paths.run_dir)], (1, 1))):
            reads.clear()
            assert main(argv) == 0
            assert (reads["state.json"], reads["job.yaml"]) == expected, (argv[0], dict(reads))
            ended = None
            for _ in range(600):  # the job (a command that exits 3) ends failed in about two seconds
                ended = load_state(paths)
                if ended is not None and ended.status in run_state.ENDED:
                    break
                time.sleep(0.1)
            assert ended is not None and ended.status == "failed", ended
    finally:
        kill_local_run(paths.run_dir)
