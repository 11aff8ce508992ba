"""The tracker histories of a real run preempted twice and SIGKILLed once (interrupted_run.py's flow) equal those
of the same job run straight, metric by metric, step by step, value by value: MLflow through a real `mlflow
server` that the test starts only once the run has found it unreachable, W&B in offline mode read back from
its transaction logs. The straight run mirrors to an MLflow SQLite store. Throughput is sent but left out.
Both tracker runs end FINISHED with each attempt's end tagged: two requeues, the kill found "lost" by the next
attempt, and the finish."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from interrupted_run import attempt_events, ended, events, job_gone, trained_past, wait_for, write_spec
from launching import kill_local_run

from elfes.launcher.cli.main import main as elfes
from elfes.launcher.rundir.paths import RunPaths
from elfes.records.tracker_sender import read_mirror_state
from elfes.records.tracking import wandb_dir

pytest.importorskip("mlflow", reason="the mlflow extra: pip install -e '.[test]' installs it")
pytest.importorskip("wandb", reason="the wandb extra: pip install -e '.[test]' installs it")
from tracker_histories import (  # noqa: E402
    deterministic,
    mlflow_history,
    wandb_offline_ends,
    wandb_offline_history,
    wandb_offline_summary,
)

ATTEMPT_ENDS = {"elfes.attempt.1.end": "requeued (SIGUSR2)", "elfes.attempt.2.end": "requeued (SIGUSR2)",
                "elfes.attempt.3.end": "lost", "elfes.attempt.4.end": "finished"}

WANDB = {"project": "elfes-tests", "mode": "offline"}
# Attempt 1 is slow enough to be preempted early; attempt 3 slow, so that the kill lands before its checkpoint.
STEP_DELAY_S = {"default": 0.03, "1": 0.2, "3": 0.4}


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


def submit(folder: Path, name: str, tracking: dict) -> Path:
    spec = write_spec(folder, name, step_delay_s=STEP_DELAY_S, tracking=tracking)
    assert elfes(["submit", str(spec), "--executor", "local"]) == 0
    return folder / name


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("trackers")
    server_uri = f"http://127.0.0.1:{free_port()}"
    store = f"sqlite:///{folder / 'straight.db'}"
    straight = submit(folder, "straight", {"mlflow": {"tracking_uri": store, "experiment": "straight"}, "wandb": WANDB})
    interrupted = folder / "interrupted"
    server = None
    try:
        submit(folder, "interrupted", {"mlflow": {"tracking_uri": server_uri, "experiment": "e2e"}, "wandb": WANDB})
        wait_for(lambda: trained_past(interrupted, 1, 2), "attempt 1 to train 2 steps", interrupted)
        assert elfes(["preempt", str(interrupted)]) == 0
        # The server is not there yet: the mirror finds it so before the server starts.
        wait_for(lambda: (state := read_mirror_state(interrupted, "mlflow")) and state.behind,
                 "the mlflow mirror to find its server unreachable", interrupted)
        server = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{folder / 'server.db'}",
             "--host", "127.0.0.1", "--port", server_uri.rsplit(":", 1)[1], "--workers", "1"],
            stdout=subprocess.DEVNULL, stderr=(folder / "server.log").open("w"), start_new_session=True)
        wait_for(lambda: (step := trained_past(interrupted, 2, 2)) and step >= 10, "attempt 2 to pass step 10",
                 interrupted)
        assert elfes(["preempt", str(interrupted)]) == 0
        wait_for(lambda: trained_past(interrupted, 3, 2), "attempt 3 to train 2 steps", interrupted)
        os.kill(json.loads(RunPaths(interrupted).pid_file(0).read_text())["pid"], signal.SIGKILL)
        wait_for(lambda: job_gone(interrupted), "the killed job's processes to be gone", interrupted)
        wait_for(lambda: healthy(server_uri, server), "the mlflow server to answer /health", interrupted)
        assert elfes(["resume", str(interrupted)]) == 0
        assert wait_for(lambda: ended(interrupted), "the resumed run to end", interrupted).status == "finished"
        assert wait_for(lambda: ended(straight), "the straight run to end", straight).status == "finished"
        yield {"straight": (straight, store), "interrupted": (interrupted, server_uri)}
    finally:
        kill_local_run(interrupted)
        kill_local_run(straight)
        if server is not None:
            os.killpg(server.pid, signal.SIGKILL)  # the server and its workers, in the session it leads
            server.wait()


def test_the_mlflow_history_of_the_interrupted_run_equals_the_straight_runs(runs):
    (straight, store), (interrupted, server_uri) = runs["straight"], runs["interrupted"]
    trained = [event["step"] for event in events(interrupted) if event["event"] == "train"]
    assert len(trained) > len(set(trained)) == 24  # the kill made the run redo steps, which its records hold twice
    assert any(event["event"] == "warning" and event["kind"] == "tracker_behind" and "mlflow" in event["message"]
               for event in attempt_events(interrupted, 1) + attempt_events(interrupted, 2))

    expected = mlflow_history(store, read_mirror_state(straight, "mlflow").run_id)
    state = read_mirror_state(interrupted, "mlflow")
    assert not state.behind and state.offset == RunPaths(interrupted).events.stat().st_size
    history = mlflow_history(server_uri, state.run_id)
    assert list(history) == list(expected) and "train/samples_per_second" in history  # sent, not compared
    assert deterministic(history) == deterministic(expected)
    assert [step for step, _ in history["train/loss"]] == list(range(1, 25))
    assert [step for step, _ in history["eval/validation/loss"]] == [8, 16, 24]

    from mlflow.tracking import MlflowClient

    run = MlflowClient(tracking_uri=server_uri).get_run(state.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["elfes.status"] == "FINISHED"
    assert {key: value for key, value in run.data.tags.items() if key.startswith("elfes.attempt.")} == ATTEMPT_ENDS
    assert run.data.tags["elfes.version.torch"] and run.data.params["spec.name"] == "interrupted"
    assert run.data.tags["elfes.run_dir"] == str(interrupted)
    assert run.data.tags["elfes.run_id"] == next(e["run_id"] for e in events(interrupted) if e["event"] == "started")


def test_the_wandb_offline_history_of_the_interrupted_run_equals_the_straight_runs(runs):
    (straight, _), (interrupted, _) = runs["straight"], runs["interrupted"]
    expected = wandb_offline_history(wandb_dir(straight), read_mirror_state(straight, "wandb").run_id)
    history = wandb_offline_history(wandb_dir(interrupted), read_mirror_state(interrupted, "wandb").run_id)
    assert list(history) == list(expected) and "train/samples_per_second" in history
    assert deterministic(history) == deterministic(expected)
    assert [step for step, _ in history["train/loss"]] == list(range(1, 25))
    run_id = read_mirror_state(interrupted, "wandb").run_id
    ends = wandb_offline_ends(wandb_dir(interrupted), run_id)
    assert ends[:2] == [(True, 1), (True, 1)] and ends[-1] == (False, 0)  # paused twice (preempting), finished
    summary = wandb_offline_summary(wandb_dir(interrupted), run_id)
    assert summary["elfes.status"] == "FINISHED" and {key: summary[key] for key in ATTEMPT_ENDS} == ATTEMPT_ENDS
