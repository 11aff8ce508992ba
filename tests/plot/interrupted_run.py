"""A real interrupted run for the plot, TensorBoard and tracker tests, through `elfes submit --executor local`
(:func:`run_tracked_jobs`; tests/plot/conftest.py runs it once per session for both test files).

The quickstart job (one rank, 3 epochs of 8 optimizer steps, a train record every step, the
TensorBoard mirror on through the spec's ``env:``, mirrored to MLflow and W&B offline) is preempted twice with
`elfes preempt` (SIGUSR2: the job saves `last` and relaunches itself), then its third attempt's task is SIGKILLed
once it has logged train records two steps past its start, and `elfes resume` finishes the run; beside it, the
same job runs straight. Every wait is on what the jobs write (events.jsonl, state.json, pid files) or on a
server's answer, never a bare sleep.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from launching import kill_local_run

from elfes.launcher.cli.main import main as elfes
from elfes.launcher.rundir import state as run_state
from elfes.launcher.rundir.liveness import local_processes
from elfes.launcher.rundir.paths import RunPaths

REPOSITORY = Path(__file__).resolve().parents[2]
PLANNED_STEPS = 24  # 256 samples, batches of 16, accumulation 2: 8 steps per epoch, 3 epochs
# Seconds of sleep per batch: attempt 1 is slow enough to be preempted early; attempt 3 slow, so that the kill
# lands long before its next checkpoint.
STEP_DELAY_S = {"default": 0.03, "1": 0.2, "3": 0.4}
WANDB = {"project": "elfes-tests", "mode": "offline"}
TIMEOUT_S = 150.0
SLOW_POLL_S = 0.5  # waits that nothing is timed by: a job's end, a server's start


@dataclass(frozen=True)
class InterruptedRun:
    run_dir: Path
    killed_at_step: int  # the last step attempt 3 logged before the kill


def diagnostics(run_dir: Path) -> str:
    paths = RunPaths(run_dir)
    parts = [f"--- {paths.state} ---", paths.state.read_text() if paths.state.exists() else "(none)"]
    for file in sorted(paths.logs.glob("attempt-*/rank-*.*")) + [paths.controller_log]:
        if file.is_file():
            parts += [f"--- {file} (tail) ---", file.read_text(errors="replace")[-2000:]]
    return "\n".join(parts)


def wait_for(condition: Callable[[], Any], what: str, run_dir: Path, every_s: float = 0.02) -> Any:
    """``condition()`` once true, looked at every ``every_s`` (the polling interval of the condition, not a stand-in
    for it): a step to signal at is looked for often; the end of a job, a pass over /proc, every :data:`SLOW_POLL_S`."""
    deadline = time.monotonic() + TIMEOUT_S
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {TIMEOUT_S:.0f} s waiting for {what}\n{diagnostics(run_dir)}")
        time.sleep(every_s)
    return value


def events(run_dir: Path) -> list[dict[str, Any]]:
    file = RunPaths(run_dir).events
    found = []
    for line in file.read_text().splitlines() if file.exists() else ():
        try:
            found.append(json.loads(line))
        except ValueError:
            pass  # a line being written
    return found


def attempt_events(run_dir: Path, attempt: int) -> list[dict[str, Any]]:
    """The events of the ``attempt``-th start (started or resumed) of the training loop."""
    starts, found = 0, []
    for event in events(run_dir):
        starts += event["event"] in ("started", "resumed")
        if starts == attempt:
            found.append(event)
    return found


def trained_past(run_dir: Path, attempt: int, steps: int) -> int | None:
    """The last train step of ``attempt`` once it is ``steps`` or more past the attempt's start, else None."""
    found = attempt_events(run_dir, attempt)
    train = [event["step"] for event in found if event["event"] == "train"]
    if not train or train[-1] < found[0]["state"]["step"] + steps:
        return None
    return train[-1]


def run_state_of(run_dir: Path) -> run_state.RunState | None:
    return run_state.load_state(RunPaths(run_dir))


def job_gone(run_dir: Path) -> bool:
    processes = local_processes(RunPaths(run_dir))
    return not processes["controller"] and not processes["task"]


def ended(run_dir: Path) -> run_state.RunState | None:
    """The run's state once it ended and no process of its job is left, else None."""
    state = run_state_of(run_dir)
    return state if state is not None and state.status in run_state.ENDED and job_gone(run_dir) else None


def write_spec(folder: Path, name: str, tracking: dict[str, Any]) -> Path:
    spec: dict[str, Any] = {
        "name": name,
        "entrypoint": "tests.plot.paced_job:paced_quickstart",
        "workdir": str(REPOSITORY),
        "run_dir": str(folder / name),
        "config": {"epochs": 3, "train_samples": 256, "log_every": 1, "step_delay_s": STEP_DELAY_S},
        "resources": {"nodes": 1, "tasks_per_node": 1, "gpus_per_node": 0, "cpus_per_task": 1, "mem_gb": 1,
                      "timeout_min": 10},
        "requeue": {"max_requeues": 5},
        "tracking": tracking,
        # W&B's service starts slowly on a loaded machine.
        "env": {"OMP_NUM_THREADS": "1", "ELFES_TENSORBOARD": "1", "ELFES_TRACKER_FLUSH_TIMEOUT_S": "300"},
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


# -- the runs -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrackedRuns:
    """The straight run (MLflow: ``straight_store``, SQLite) and the interrupted one, whose MLflow server wrote
    into ``server_store`` (read once the server is gone); both mirrored to W&B offline too."""

    straight: Path
    straight_store: str
    interrupted: InterruptedRun
    server_store: str

    def to_json(self) -> str:
        return json.dumps({"straight": str(self.straight), "straight_store": self.straight_store,
                           "interrupted": str(self.interrupted.run_dir),
                           "killed_at_step": self.interrupted.killed_at_step, "server_store": self.server_store})

    @classmethod
    def from_json(cls, text: str) -> TrackedRuns:
        data = json.loads(text)
        return cls(Path(data["straight"]), data["straight_store"],
                   InterruptedRun(Path(data["interrupted"]), data["killed_at_step"]), data["server_store"])


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def healthy(uri: str, server: subprocess.Popen) -> bool:
    assert server.poll() is None, f"mlflow server exited with {server.returncode}"
    try:
        with urllib.request.urlopen(f"{uri}/health", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def submit(folder: Path, name: str, tracking: dict[str, Any]) -> Path:
    spec = write_spec(folder, name, tracking)
    assert elfes(["submit", str(spec), "--executor", "local"]) == 0
    return folder / name


def run_tracked_jobs(folder: Path) -> TrackedRuns:
    """The job run straight (MLflow to a SQLite store) beside the interrupted one, mirrored to a real `mlflow server`
    that is started only once the run has found it unreachable (after the first preemption); both to W&B offline.
    Returns once both runs ended and the server is gone."""
    from elfes.records.tracker_sender import read_mirror_state

    from_mlflow = f"sqlite:///{folder / 'server.db'}"
    server_uri = f"http://127.0.0.1:{free_port()}"
    store = f"sqlite:///{folder / 'straight.db'}"
    straight = submit(folder, "straight", {"mlflow": {"tracking_uri": store, "experiment": "straight"},
                                                   "wandb": WANDB})
    interrupted = folder / "interrupted"
    server = None
    try:
        submit(folder, "interrupted", {"mlflow": {"tracking_uri": server_uri, "experiment": "e2e"},
                                               "wandb": WANDB})
        wait_for(lambda: trained_past(interrupted, 1, 2), "attempt 1 to train 2 steps", interrupted)
        assert elfes(["preempt", str(interrupted)]) == 0
        # The server is not there yet: the mirror finds it so before the server starts.
        wait_for(lambda: (state := read_mirror_state(interrupted, "mlflow")) and state.behind,
                 "the mlflow mirror to find its server unreachable", interrupted)
        server = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", from_mlflow,
             "--host", "127.0.0.1", "--port", server_uri.rsplit(":", 1)[1], "--workers", "1"],
            stdout=subprocess.DEVNULL, stderr=(folder / "server.log").open("w"), start_new_session=True)
        wait_for(lambda: (step := trained_past(interrupted, 2, 2)) and step >= 10, "attempt 2 to pass step 10",
                 interrupted)
        assert elfes(["preempt", str(interrupted)]) == 0
        wait_for(lambda: trained_past(interrupted, 3, 2), "attempt 3 to train 2 steps", interrupted)
        os.kill(json.loads(RunPaths(interrupted).pid_file(0).read_text())["pid"], signal.SIGKILL)
        wait_for(lambda: job_gone(interrupted), "the killed job's processes to be gone", interrupted, SLOW_POLL_S)
        killed_at = max(event["step"] for event in attempt_events(interrupted, 3) if event["event"] == "train")
        wait_for(lambda: healthy(server_uri, server), "the mlflow server to answer /health", interrupted, SLOW_POLL_S)
        assert elfes(["resume", str(interrupted)]) == 0
        state = wait_for(lambda: ended(interrupted), "the resumed run to end", interrupted, SLOW_POLL_S)
        assert state.status == "finished", diagnostics(interrupted)
        state = wait_for(lambda: ended(straight), "the straight run to end", straight, SLOW_POLL_S)
        assert state.status == "finished", diagnostics(straight)
    finally:
        kill_local_run(interrupted)
        kill_local_run(straight)
        if server is not None:
            os.killpg(server.pid, signal.SIGKILL)  # the server and its workers, in the session it leads
            server.wait()
    return TrackedRuns(straight, store, InterruptedRun(interrupted, killed_at), from_mlflow)
