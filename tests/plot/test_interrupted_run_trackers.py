"""The tracker histories of a real run preempted twice and SIGKILLed once (interrupted_run.py's flow) equal those
of the same job run straight, metric by metric, step by step, value by value: MLflow through a real `mlflow
server` that the flow starts only once the run has found it unreachable (read back from the server's store once
the server is gone), W&B in offline mode read back from its transaction logs. The straight run mirrors to an
MLflow SQLite store. Throughput is sent but left out. Both tracker runs end FINISHED with each attempt's end
tagged: two requeues, the kill found "lost" by the next attempt, and the finish."""

from __future__ import annotations

import pytest
from interrupted_run import attempt_events, events

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


@pytest.fixture
def runs(tracked_runs):
    """The straight run and its MLflow store, the interrupted run and its server's (tests/plot/conftest.py)."""
    return {"straight": (tracked_runs.straight, tracked_runs.straight_store),
            "interrupted": (tracked_runs.interrupted.run_dir, tracked_runs.server_store)}


def test_the_mlflow_history_of_the_interrupted_run_equals_the_straight_runs(runs):
    (straight, store), (interrupted, server_store) = runs["straight"], runs["interrupted"]
    trained = [event["step"] for event in events(interrupted) if event["event"] == "train"]
    assert len(trained) > len(set(trained)) == 24  # the kill made the run redo steps, which its records hold twice
    assert any(event["event"] == "warning" and event["kind"] == "tracker_behind" and "mlflow" in event["message"]
               for event in attempt_events(interrupted, 1) + attempt_events(interrupted, 2))

    expected = mlflow_history(store, read_mirror_state(straight, "mlflow").run_id)
    state = read_mirror_state(interrupted, "mlflow")
    assert not state.behind and state.offset == RunPaths(interrupted).events.stat().st_size
    history = mlflow_history(server_store, state.run_id)
    assert list(history) == list(expected) and "train/samples_per_second" in history  # sent, not compared
    assert deterministic(history) == deterministic(expected)
    assert [step for step, _ in history["train/loss"]] == list(range(1, 25))
    assert [step for step, _ in history["eval/validation/loss"]] == [8, 16, 24]

    from mlflow.tracking import MlflowClient

    run = MlflowClient(tracking_uri=server_store).get_run(state.run_id)
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
