"""Regenerate docs/quickstart-plot.png: the example job, preempted twice, SIGKILLed once, resumed, then drawn
by `elfes plot`.

    python docs/plot_example.py          # a minute or two on a laptop; writes docs/quickstart-plot.png

The job is examples/quickstart/job.yaml (two CPU ranks, 4 epochs of 128 optimizer steps) with a train
record every step (log_every: 1) and its run directory in a temporary folder. `elfes preempt` sends the
requeue signal at step 40 and again at step 90 of the relaunch; in the third attempt both ranks are
frozen (SIGSTOP) once they logged four steps past the last checkpoint, then SIGKILLed, so that those
steps are lost; `elfes resume` trains them again and finishes the run.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from elfes.launcher.cli.main import main as elfes
from elfes.launcher.rundir.liveness import local_processes
from elfes.launcher.rundir.paths import RunPaths
from elfes.launcher.rundir.state import load_state

REPOSITORY = Path(__file__).resolve().parents[1]
OUTPUT = REPOSITORY / "docs" / "quickstart-plot.png"
TIMEOUT_S = 600.0


def wait_for(condition: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + TIMEOUT_S
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.02)
    return value


def attempt_events(paths: RunPaths, attempt: int) -> list[dict[str, Any]]:
    """The events of the ``attempt``-th start of the training loop (complete lines only)."""
    starts, found = 0, []
    lines = paths.events.read_text().splitlines() if paths.events.exists() else []
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        starts += event["event"] in ("started", "resumed")
        if starts == attempt:
            found.append(event)
    return found


def last_step(paths: RunPaths, attempt: int, kind: str = "train") -> int | None:
    steps = [event["step"] for event in attempt_events(paths, attempt) if event["event"] == kind]
    return steps[-1] if steps else None


def last_checkpoint(paths: RunPaths, attempt: int) -> int | None:
    """The step of the attempt's last checkpoint (its start step before it saved one); None before it starts."""
    found = attempt_events(paths, attempt)
    checkpoints = [event["step"] for event in found if event["event"] == "checkpoint"]
    return checkpoints[-1] if checkpoints else found[0]["state"]["step"] if found else None


def trained_past_checkpoint(paths: RunPaths, attempt: int, steps: int) -> bool:
    checkpoint, step = last_checkpoint(paths, attempt), last_step(paths, attempt)
    return checkpoint is not None and step is not None and step >= checkpoint + steps


def rank_pids(paths: RunPaths, ranks: int) -> list[int]:
    return [json.loads(paths.pid_file(rank).read_text())["pid"] for rank in range(ranks)]


def job_gone(paths: RunPaths) -> bool:
    processes = local_processes(paths)
    return not processes["controller"] and not processes["task"]


def main() -> int:
    spec = yaml.safe_load((REPOSITORY / "examples" / "quickstart" / "job.yaml").read_text())
    folder = Path(tempfile.mkdtemp(prefix="elfes-plot-example-"))
    spec.update(workdir=str(REPOSITORY), run_dir=str(folder / "quickstart-job"))
    spec["config"] = {**spec["config"], "log_every": 1}
    spec_file = folder / "job.yaml"
    spec_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    paths = RunPaths(folder / "quickstart-job")
    ranks = spec["resources"]["tasks_per_node"]

    assert elfes(["submit", str(spec_file), "--executor", "local"]) == 0
    wait_for(lambda: (last_step(paths, 1) or 0) >= 40, "attempt 1 to reach step 40")
    assert elfes(["preempt", str(paths.run_dir)]) == 0
    wait_for(lambda: (last_step(paths, 2) or 0) >= 90, "attempt 2 to reach step 90")
    assert elfes(["preempt", str(paths.run_dir)]) == 0
    while True:  # freeze attempt 3 four steps past its last checkpoint, then kill it
        wait_for(lambda: trained_past_checkpoint(paths, 3, 4), "attempt 3 to train past its last checkpoint")
        pids = rank_pids(paths, ranks)
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        if trained_past_checkpoint(paths, 3, 1):
            break
        for pid in pids:  # a checkpoint landed in between: let it go on
            os.kill(pid, signal.SIGCONT)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: job_gone(paths), "the killed job to be gone")
    assert elfes(["resume", str(paths.run_dir)]) == 0
    wait_for(lambda: (state := load_state(paths)) is not None and state.status == "finished" and job_gone(paths),
             "the resumed run to finish")
    return elfes(["plot", str(paths.run_dir), "-o", str(OUTPUT), "--metric", "train/loss",
                  "--metric", "eval/validation/loss"])


if __name__ == "__main__":
    sys.exit(main())
