"""A finished run's tracker history is complete, and `elfes sync` completes it when it is not: real local jobs
mirrored to a real MLflow SQLite store. A straight run beside a CPU burner (its mirror slow to import MLflow and
create the store's tables) has every step in MLflow, with a flush wait far shorter than that start; a run whose
store could not be written is named by `elfes status` (with `elfes sync`, not a next attempt it will never have),
then completed by `elfes sync`, and a second sync sends nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from local_runs import Runs, wait_ended

from elfes.launcher.cli.main import main as elfes
from elfes.records.tracker_mirror import FLUSH_TIMEOUT_VARIABLE
from elfes.records.tracker_sender import read_mirror_state

pytest.importorskip("mlflow", reason="the mlflow extra: pip install -e '.[test]' installs it")
from tracker_histories import mlflow_history  # noqa: E402

# 128 samples, batches of 16, accumulation 2: 4 optimizer steps an epoch, 8 in all; a train record every step.
CONFIG = {"epochs": 2, "train_samples": 128, "log_every": 1, "step_delay_s": 0.0}
STEPS = list(range(1, 9))


@pytest.fixture
def cpu_burner() -> Iterator[None]:
    """Two busy-looping processes for the test's duration (the machine the issue's run was lost on), reaped after."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        yield
    finally:
        for burner in burners:
            burner.kill()
        for burner in burners:
            burner.wait()


def mlflow_run(store: str, run_dir: Path):
    from mlflow.tracking import MlflowClient

    state = read_mirror_state(run_dir, "mlflow")
    assert state is not None, f"{run_dir}: the mlflow mirror recorded nothing"
    return state, MlflowClient(tracking_uri=store).get_run(state.run_id)


def status_notes(run_dir: Path, capsys: pytest.CaptureFixture) -> list[str]:
    capsys.readouterr()
    assert elfes(["status", str(run_dir), "--json"]) == 0
    return json.loads(capsys.readouterr().out)["notes"]


def test_a_straight_run_beside_a_cpu_burner_has_its_whole_history_in_mlflow(runs: Runs, cpu_burner, capsys):
    """The store is the spec's relative sqlite:///burn.db: resolved against the spec's folder, not
    inside each attempt's code snapshot. The flush wait (1 s) is far shorter than the mirror's start here."""
    run_dir = runs.submit("burned", config=CONFIG,
                          env={"OMP_NUM_THREADS": "1", FLUSH_TIMEOUT_VARIABLE: "1"},
                          tracking={"mlflow": {"tracking_uri": "sqlite:///burn.db", "experiment": "burn"}})
    wait_ended(run_dir, "finished")
    store = f"sqlite:///{runs.folder / 'burn.db'}"
    state, run = mlflow_run(store, run_dir)
    assert not state.behind and state.offset == (run_dir / "events.jsonl").stat().st_size
    history = mlflow_history(store, state.run_id)
    trained = [event["step"] for event in map(json.loads, (run_dir / "events.jsonl").read_text().splitlines())
               if event["event"] == "train"]
    assert trained == STEPS
    assert [step for step, _ in history["train/loss"]] == STEPS
    assert run.info.status == "FINISHED" and run.data.tags["elfes.status"] == "FINISHED"
    assert not [note for note in status_notes(run_dir, capsys) if "mlflow" in note]


def test_a_run_whose_store_was_down_is_completed_by_elfes_sync_and_a_second_sync_sends_nothing(runs: Runs, capsys):
    blocker = runs.folder / "store"
    blocker.write_text("a file where the store's folder goes: the store cannot be created\n")
    store = f"sqlite:///{blocker / 'mlflow.db'}"
    run_dir = runs.submit("down", config=CONFIG,
                          tracking={"mlflow": {"tracking_uri": store, "experiment": "down"}})
    wait_ended(run_dir, "finished")
    state = read_mirror_state(run_dir, "mlflow")
    assert state is not None and state.behind and state.offset == 0, state
    notes = status_notes(run_dir, capsys)
    (note,) = [note for note in notes if note.startswith("the mlflow mirror is behind")]
    assert f"the run has ended, so no attempt of it sends them: `elfes sync {run_dir}` does" in note, note
    assert not [note for note in notes if "the run's next attempt" in note], notes

    blocker.unlink()
    blocker.mkdir()  # the store is back
    capsys.readouterr()
    assert elfes(["sync", str(run_dir)]) == 0
    said = capsys.readouterr().out
    assert f"{run_dir}: mlflow: sent " in said and "and the run's lifecycle" in said, said
    state, run = mlflow_run(store, run_dir)
    assert not state.behind and state.offset == (run_dir / "events.jsonl").stat().st_size
    history = mlflow_history(store, state.run_id)
    assert [step for step, _ in history["train/loss"]] == STEPS
    assert run.info.status == "FINISHED" and run.data.tags["elfes.attempt.1.end"] == "finished"
    assert run.data.params["spec.name"] == "down"
    # The attempt's warning stays among its records; status has nothing more to say of the mirror.
    assert [note for note in status_notes(run_dir, capsys) if "mlflow" in note] == [note for note in notes
                                                                                   if "cannot send" in note]

    assert elfes(["sync", str(run_dir)]) == 0
    assert capsys.readouterr().out.strip() == f"{run_dir}: mlflow: nothing to send: it has every record (run {state.run_id})"
    assert mlflow_history(store, state.run_id) == history  # not one row more


def test_elfes_sync_of_a_sweep_folder_completes_every_member(runs: Runs, capsys):
    blocker = runs.folder / "store"
    blocker.write_text("a file where the store's folder goes\n")
    store = f"sqlite:///{blocker / 'mlflow.db'}"
    sweep_dir = runs.submit("swept", config=CONFIG,
                            sweep={"grid": {"config.seed": [0, 1]}},
                            tracking={"mlflow": {"tracking_uri": store, "experiment": "swept"}})
    members = [sweep_dir / "seed=0", sweep_dir / "seed=1"]
    runs.run_dirs[-1:] = members  # what the teardown ends
    for run_dir in members:
        wait_ended(run_dir, "finished")
        assert read_mirror_state(run_dir, "mlflow").behind

    blocker.unlink()
    blocker.mkdir()
    capsys.readouterr()
    assert elfes(["sync", str(sweep_dir)]) == 0
    said = capsys.readouterr().out.splitlines()
    assert [line.split(": mlflow: sent ")[0] for line in said] == [str(run_dir) for run_dir in members], said
    for run_dir in members:
        state, run = mlflow_run(store, run_dir)
        assert [step for step, _ in mlflow_history(store, state.run_id)["train/loss"]] == STEPS
        assert run.data.tags["elfes.group"] == "swept" and run.info.status == "FINISHED"
