"""RunLogger's tracker mirrors against the real libraries: an MLflow SQLite store and W&B in offline mode, read
back from the trackers. Attempts that redo steps send none of them twice; a send repeated after a kill (the
mirror's state not yet written) leaves one copy; a tracker that cannot be reached warns, naming it, and the
state says the mirror is behind; credentials from the environment reach no file of the run directory."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from synthetic_events import checkpoint, evaluation, plain_console, run_end, started, train
from tracker_histories import mlflow_history, wandb_offline_history
from waiting import wait_until

from elfes.launcher.commands.status import tracker_notes
from elfes.launcher.rundir.paths import RunPaths
from elfes.records import RunLogger, read_events
from elfes.records.mlflow_sink import MlflowSink
from elfes.records.tracker_mirror import (
    FLUSH_TIMEOUT_S,
    FLUSH_TIMEOUT_VARIABLE,
    START_TIMEOUT_VARIABLE,
    flush_timeout_s,
)
from elfes.records.tracker_sender import REQUEST_TIMEOUT_S, read_mirror_state
from elfes.records.tracker_sync import Synced, TrackerBusy, sync_tracker
from elfes.records.tracking import MlflowSettings, tracker_state_path, wandb_dir

pytest.importorskip("mlflow", reason="the mlflow extra: pip install -e '.[test]' installs it")
pytest.importorskip("wandb", reason="the wandb extra: pip install -e '.[test]' installs it")
pytestmark = pytest.mark.usefixtures("patient_close")  # tests/records/conftest.py


def log_attempt(run_dir: Path, events: list[dict], **trackers) -> None:
    with RunLogger(run_dir, is_main_process=True, console=plain_console(), trackers=trackers) as logger:
        for event in events:
            logger.log(event)


def start(step: int = 0, **fields) -> dict:
    return {**started(step, **fields), "run_id": "run-5f0c"}  # the engine's run id, as started events carry it


def three_attempts() -> list[list[dict]]:
    """Paused at 2; resumed and killed after 4 (nothing saved past 2); resumed at 2, redoing 3 and 4 alike."""
    return [
        [start(), train(1, loss=1.0), train(2, loss=0.9), checkpoint(2), run_end(2, reason="SIGTERM")],
        [start(2, resumed_from="last"), train(3, loss=0.7), train(4, loss=0.6)],
        [start(2, resumed_from="last"), train(3, loss=0.7), train(4, loss=0.6),
         evaluation(4, 0.5, improved=True, best=0.5, best_step=4), train(5, loss=0.5), run_end(5)],
    ]


def test_mlflow_gets_every_step_once_across_attempts_that_redo_steps(tmp_path, store):
    mlflow = {"tracking_uri": store, "experiment": "redo"}
    for events in three_attempts():
        log_attempt(tmp_path / "run", events, mlflow=mlflow)

    state = read_mirror_state(tmp_path / "run", "mlflow")
    assert state is not None and not state.behind and state.offset == (tmp_path / "run" / "events.jsonl").stat().st_size
    history = mlflow_history(store, state.run_id)
    assert history["train/loss"] == [(1, 1.0), (2, 0.9), (3, 0.7), (4, 0.6), (5, 0.5)]
    assert history["eval/val/accuracy"] == [(4, 0.5)]
    assert [step for step, _ in history["train/grad_norm"]] == [1, 2, 3, 4, 5]

    from mlflow.tracking import MlflowClient

    run = MlflowClient(tracking_uri=store).get_run(state.run_id)
    assert run.data.tags["elfes.run_dir"] == str((tmp_path / "run").absolute())
    assert run.data.tags["elfes.run_id"] == state.elfes_run_id == "run-5f0c"
    assert run.data.params["config.lr"] == "0.001"
    assert run.info.status == "FINISHED"  # the last attempt's finished event


def test_a_send_repeated_after_a_kill_leaves_one_copy_in_mlflow(tmp_path, store):
    """A kill after the tracker took a batch but before the mirror recorded it: the next attempt sends the same
    lines again, with the same timestamps, and the store keeps one copy."""
    mlflow = {"tracking_uri": store, "experiment": "repeat"}
    run_dir = tmp_path / "run"
    log_attempt(run_dir, [started(), train(1, loss=1.0), train(2, loss=0.9)], mlflow=mlflow)
    path = tracker_state_path(run_dir, "mlflow")
    state = json.loads(path.read_text())
    path.write_text(json.dumps({**state, "offset": 0, "sent_steps": {}}))  # as before the send
    log_attempt(run_dir, [started(2, resumed_from="last"), train(3, loss=0.8)], mlflow=mlflow)

    assert mlflow_history(store, state["run_id"])["train/loss"] == [(1, 1.0), (2, 0.9), (3, 0.8)]


def test_an_unreachable_tracker_warns_naming_it_and_the_state_says_the_mirror_is_behind(tmp_path, monkeypatch):
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mlflow = {"tracking_uri": f"http://127.0.0.1:{port}", "experiment": "down"}
    with RunLogger(tmp_path, is_main_process=True, console=plain_console(), trackers={"mlflow": mlflow}) as logger:
        logger.log(started())
        logger.log(train(1, loss=1.0))
        logger._trackers[0].close(timeout_s=0.0)  # one try, then give up: the attempt's end

    state = read_mirror_state(tmp_path, "mlflow")
    assert state is not None and state.behind and state.offset == 0 and state.behind_since
    assert f"127.0.0.1:{port}" in state.error
    (warning,) = [event for event in read_events(tmp_path) if event["event"] == "warning"]
    assert warning["kind"] == "tracker_behind" and "the mlflow mirror cannot send" in warning["message"]
    size = (tmp_path / "events.jsonl").stat().st_size
    (note,) = tracker_notes(RunPaths(tmp_path))  # what `elfes status` says of the run
    assert note.startswith(f"the mlflow mirror is behind since {state.behind_since}") and f"{size} bytes" in note


def test_wandb_offline_gets_every_step_once_with_the_run_id_kept_in_the_run_directory(tmp_path, wandb_offline):
    wandb = {"project": "elfes-tests", "mode": "offline"}
    for events in three_attempts():
        log_attempt(tmp_path / "run", events, wandb=wandb)

    state = read_mirror_state(tmp_path / "run", "wandb")
    assert state is not None and not state.behind
    history = wandb_offline_history(wandb_dir(tmp_path / "run"), state.run_id)
    assert history["train/loss"] == [(1, 1.0), (2, 0.9), (3, 0.7), (4, 0.6), (5, 0.5)]
    assert history["eval/val/accuracy"] == [(4, 0.5)]
    assert len(list(wandb_dir(tmp_path / "run").glob(f"**/run-{state.run_id}.wandb"))) == 3  # one per attempt


def test_no_credential_from_the_environment_reaches_the_run_directory(tmp_path, store, wandb_offline, monkeypatch):
    secrets = {"WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567", "MLFLOW_TRACKING_TOKEN": "tok-4f1c9e-secret",
               "MLFLOW_TRACKING_PASSWORD": "pw-93b2-secret"}
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    log_attempt(tmp_path / "run", three_attempts()[0], mlflow={"tracking_uri": store, "experiment": "secrets"},
                wandb={"project": "elfes-tests", "mode": "offline"})

    files = [path for path in (tmp_path / "run").rglob("*") if path.is_file()]
    assert any(path.suffix == ".wandb" for path in files)
    for path in files:
        data = path.read_bytes()
        assert not any(value.encode() in data for value in secrets.values()), path



def test_the_command_line_of_the_process_never_reaches_wandb(tmp_path, wandb_offline, monkeypatch):
    """W&B records its process's arguments with the run's metadata by default: a job run as `python train.py
    --hf-token ...` would send what spec.command's rule leaves out. The sink asks W&B for no metadata."""
    token = "hf_QwErTyUiOpAsDfGhJkLzXcVbNm01234567"
    monkeypatch.setattr("sys.argv", ["train.py", "--hf-token", token])
    log_attempt(tmp_path / "run", three_attempts()[0], wandb={"project": "elfes-tests", "mode": "offline"})

    files = [path for path in (tmp_path / "run").rglob("*") if path.is_file()]
    assert any(path.suffix == ".wandb" for path in files)
    assert not [path for path in files if token.encode() in path.read_bytes()]

def test_settings_that_do_not_fit_are_refused_naming_the_field(tmp_path):
    with pytest.raises(ValueError, match="tracking_uri"):
        RunLogger(tmp_path, is_main_process=True, trackers={"mlflow": {"tracking_uri": "https://me:secret@mlflow.example"}})
    with pytest.raises(ValueError, match="mode"):
        RunLogger(tmp_path, is_main_process=True, trackers={"wandb": {"project": "p", "mode": "sometimes"}})
    assert not tmp_path.joinpath("tracking").exists()


def test_the_trackers_section_of_the_guide_validates(tmp_path):
    import yaml

    from elfes.launcher.spec.loading import load_spec
    from tests.docs.blocks import block

    spec = {"name": "guide", "entrypoint": "job:main", "run_dir": "runs/guide", **yaml.safe_load(block("trackers/job.yaml").text)}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    loaded = load_spec(tmp_path / "job.yaml", check_files=False)
    assert loaded.tracking.trackers == ("mlflow", "wandb") and loaded.tracking.wandb.mode == "offline"


def test_a_sweep_members_mlflow_run_is_tagged_with_its_group(tmp_path, store, monkeypatch):
    monkeypatch.setenv("ELFES_TRACKING_GROUP", "lr-sweep")
    log_attempt(tmp_path / "member", [start(), train(1, loss=1.0)], mlflow={"tracking_uri": store, "experiment": "sweep"})

    from mlflow.tracking import MlflowClient

    run = MlflowClient(tracking_uri=store).get_run(read_mirror_state(tmp_path / "member", "mlflow").run_id)
    assert run.data.tags["elfes.group"] == "lr-sweep" and run.info.status == "RUNNING"  # not finished yet


@pytest.mark.parametrize(("value", "seconds"), [(None, FLUSH_TIMEOUT_S), ("7.5", 7.5), ("0", FLUSH_TIMEOUT_S),
                                                ("-3", FLUSH_TIMEOUT_S), ("nan", FLUSH_TIMEOUT_S), ("soon", FLUSH_TIMEOUT_S)])
def test_the_wait_for_the_rest_at_an_attempts_end_is_20_s_or_the_variables_positive_number(monkeypatch, value, seconds):
    assert FLUSH_TIMEOUT_S == 20.0  # the guide's number
    if value is None:
        monkeypatch.delenv(FLUSH_TIMEOUT_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(FLUSH_TIMEOUT_VARIABLE, value)
    assert flush_timeout_s() == seconds


# -- a tracker that never answers, a mirror that cannot start, `elfes sync` beside a running mirror -----------------
@pytest.fixture
def silent_server() -> Iterator[tuple[str, list[socket.socket]]]:
    """An HTTP tracking URI whose server accepts every connection and never answers a byte."""
    server = socket.create_server(("127.0.0.1", 0), backlog=64)
    server.settimeout(0.2)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}", accepted
    finally:
        stop.set()
        thread.join()
        for connection in accepted:
            connection.close()
        server.close()


def warnings_of(run_dir: Path) -> list[dict]:
    return [event for event in read_events(run_dir) if event["event"] == "warning"] if (run_dir / "events.jsonl").exists() else []


def test_a_tracker_that_accepts_connections_and_never_answers_is_reported_within_seconds(tmp_path, silent_server):
    uri, accepted = silent_server
    with RunLogger(tmp_path, is_main_process=True, console=plain_console(),
                   trackers={"mlflow": {"tracking_uri": uri, "experiment": "silent"}}) as logger:
        logger.log(start())
        began = time.monotonic()
        logger.log(train(1, loss=1.0))
        (warning,) = wait_until(lambda: warnings_of(tmp_path), "the mirror's warning while the attempt runs")
        waited = time.monotonic() - began
        assert accepted, "the mirror never reached the server"
        assert REQUEST_TIMEOUT_S <= 10 and waited < REQUEST_TIMEOUT_S + 15, waited  # not the client's minutes
        assert warning["kind"] == "tracker_behind" and "the mlflow mirror cannot send" in warning["message"]
        assert "timeout" in warning["message"].lower(), warning["message"]
        (note,) = tracker_notes(RunPaths(tmp_path))  # what `elfes status` says meanwhile
        assert note.startswith("the mlflow mirror is behind since") and "elfes sync" in note
        assert logger._trackers[0].close(timeout_s=0.0) is False  # one more try, then the attempt's end goes on


def test_a_mirror_that_has_not_started_when_the_attempt_ends_is_marked_behind_with_a_warning(
        tmp_path, silent_server, monkeypatch):
    """Its first request still hangs when the close's wait for the start (here 0.5 s) is over: the attempt ends,
    and the mirror's state and a warning say so; status names `elfes sync`."""
    monkeypatch.setenv(START_TIMEOUT_VARIABLE, "0.5")
    uri, _ = silent_server
    log_attempt(tmp_path, [start(), train(1, loss=1.0)], mlflow={"tracking_uri": uri, "experiment": "slow"})

    state = read_mirror_state(tmp_path, "mlflow")
    assert state is not None and state.behind and state.offset == 0, state
    (warning,) = warnings_of(tmp_path)
    assert "the mlflow mirror had not started 0.5 s after the attempt's end began" in warning["message"], warning
    assert START_TIMEOUT_VARIABLE in warning["message"]
    (note,) = tracker_notes(RunPaths(tmp_path), ended=True)
    assert f"`elfes sync {tmp_path}`" in note and "next attempt" not in note, note


def test_elfes_sync_leaves_a_tracker_to_the_running_attempts_mirror_then_sends_nothing_twice(tmp_path, store):
    settings = MlflowSettings(tracking_uri=store, experiment="busy")
    run_dir = tmp_path / "run"
    with RunLogger(run_dir, is_main_process=True, console=plain_console(), trackers={"mlflow": settings}) as logger:
        logger.log(start())
        logger.log(train(1, loss=1.0))
        wait_until(lambda: logger._trackers[0].sender is not None, "the mirror to hold its sender lock")
        with pytest.raises(TrackerBusy, match="another sender to mlflow holds .*mlflow.lock \\(a running attempt's mirror"):
            sync_tracker(MlflowSink(settings, run_dir, None), run_dir)

    state = read_mirror_state(run_dir, "mlflow")
    assert sync_tracker(MlflowSink(settings, run_dir, None), run_dir) == Synced("mlflow", 0, False, state.run_id)
    assert mlflow_history(store, state.run_id)["train/loss"] == [(1, 1.0)]


def test_a_relative_store_path_is_the_spec_folders_and_a_plain_scripts_is_mlflows(tmp_path, monkeypatch):
    import yaml

    from elfes.launcher.spec.loading import load_spec

    folder = tmp_path / "project"
    folder.mkdir()
    monkeypatch.chdir(tmp_path)  # not the spec's folder
    for given, resolved in [("sqlite:///runs/mlflow.db", f"sqlite:///{folder}/runs/mlflow.db"),
                            ("file:mlruns", f"file://{folder}/mlruns"),
                            (f"sqlite:///{tmp_path}/abs.db", f"sqlite:///{tmp_path}/abs.db"),
                            ("http://127.0.0.1:5000", "http://127.0.0.1:5000")]:
        spec = {"name": "rel", "entrypoint": "job:main", "run_dir": "runs/rel",
                "tracking": {"mlflow": {"tracking_uri": given}}}
        (folder / "job.yaml").write_text(yaml.safe_dump(spec))
        assert load_spec(folder / "job.yaml", check_files=False).tracking.mlflow.tracking_uri == resolved
    assert MlflowSettings(tracking_uri="sqlite:///runs/mlflow.db").tracking_uri == "sqlite:///runs/mlflow.db"


def test_elfes_sync_sends_a_wandb_run_every_step_once_where_no_mirror_ran(tmp_path, wandb_offline):
    from elfes.records.tracking import WandbSettings
    from elfes.records.wandb_sink import WandbSink

    for events in three_attempts():  # recorded without trackers: no mirror ever ran
        log_attempt(tmp_path / "run", events)
    sink = WandbSink(WandbSettings(project="elfes-tests", mode="offline"), tmp_path / "run", None, sender="sync")
    synced = sync_tracker(sink, tmp_path / "run")
    assert (synced.tracker, synced.lifecycle) == ("wandb", False) and synced.rows > 0
    history = wandb_offline_history(wandb_dir(tmp_path / "run"), synced.run_id)
    assert history["train/loss"] == [(1, 1.0), (2, 0.9), (3, 0.7), (4, 0.6), (5, 0.5)]
    assert sync_tracker(sink, tmp_path / "run") == Synced("wandb", 0, False, synced.run_id)


def test_status_names_elfes_sync_for_an_ended_run_whose_mirror_never_started_or_whose_tracker_lacks_its_end(tmp_path):
    from elfes.records.tracker_lifecycle import Lifecycle, write_lifecycle
    from elfes.records.tracker_sender import MirrorState, save_mirror_state

    paths = RunPaths(tmp_path)
    paths.spec.write_text("name: ended\ntracking:\n  mlflow: {tracking_uri: 'sqlite:////x/m.db'}\n  wandb: null\n")
    log_attempt(tmp_path, [start(), train(1, loss=1.0), run_end(1)])
    (note,) = tracker_notes(paths, ended=True)
    assert note.startswith("the mlflow mirror never started") and f"`elfes sync {tmp_path}` sends them" in note
    assert tracker_notes(paths, ended=False) == []  # a running attempt's mirror may be starting

    write_lifecycle(tmp_path, Lifecycle(status="FINISHED"))
    save_mirror_state(tmp_path, MirrorState(tracker="mlflow", offset=paths.events.stat().st_size))
    (note,) = tracker_notes(paths, ended=True)
    assert note == (f"the mlflow run does not say yet that the run ended FINISHED (mlflow did not take it at the run's "
                    f"end); `elfes sync {tmp_path}` sends it")


def test_a_stopping_attempt_waits_for_a_mirror_that_has_not_started_no_longer_than_the_flush(
        tmp_path, silent_server, monkeypatch):
    """A preemption's grace time is short: once the attempt logged its stop, the close waits for the mirror's start
    at most the flush's wait (here 1 s), not the start's (its default, 120 s); the next attempt sends the rest."""
    monkeypatch.setenv(FLUSH_TIMEOUT_VARIABLE, "1")
    monkeypatch.delenv(START_TIMEOUT_VARIABLE, raising=False)
    uri, _ = silent_server
    began = time.monotonic()
    log_attempt(tmp_path, [start(), train(1, loss=1.0), run_end(1, reason="signal")],
                mlflow={"tracking_uri": uri, "experiment": "slow"})

    assert time.monotonic() - began < 60.0  # well under the start's 120 s on a loaded machine
    state = read_mirror_state(tmp_path, "mlflow")
    assert state is not None and state.behind and state.offset == 0, state
    (warning,) = warnings_of(tmp_path)
    assert "the mlflow mirror had not started 1 s after the attempt's end began" in warning["message"], warning
    assert FLUSH_TIMEOUT_VARIABLE in warning["message"]
