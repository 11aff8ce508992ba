"""The tracker registry against the real libraries (an MLflow SQLite store, W&B offline, TensorBoard's event files
read back with its own reader): a registered tracker is built from ``RunLogger(trackers=...)`` and from a spec's
``tracking:`` section as the job runtime hands it over; the deprecated ``tensorboard=``, ``mlflow=`` and ``wandb=``
still work and warn; each sink says the run's status in its own tracker's words; TensorBoard, written through the
mirror, holds the run's scalars also where a mirror was killed mid-attempt or never ran; the W&B service's
lifetime is one object whose count of open runs returns to 0, and the service is torn down then."""

from __future__ import annotations

import ast
import json
import os
import socket
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from synthetic_events import checkpoint, evaluation, plain_console, run_end, started, train
from tracker_histories import mlflow_history, wandb_offline_ends
from waiting import wait_until

from elfes.records import RunLogger, read_events
from elfes.records.tracker_lifecycle import Lifecycle, TrackerStatus, write_lifecycle
from elfes.records.tracker_sender import read_mirror_state
from elfes.records.tracker_sync import sync_tracker
from elfes.records.trackers import REGISTRY, build_sinks
from elfes.records.tracking import TRACKERS, TrackingSettings, tracker_state_path, wandb_dir

pytest.importorskip("mlflow", reason="the mlflow extra: pip install -e '.[test]' installs it")
pytest.importorskip("wandb", reason="the wandb extra: pip install -e '.[test]' installs it")
pytest.importorskip("tensorboard", reason="the tensorboard extra: pip install -e '.[test]' installs it")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

pytestmark = pytest.mark.usefixtures("wandb_offline", "patient_close")  # tests/records/conftest.py

REPOSITORY = Path(__file__).resolve().parents[2]

def scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    accumulator = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    accumulator.Reload()
    return [(event.step, event.value) for event in accumulator.Scalars(tag)]


def recorded_loss(run_dir: Path) -> list[tuple[int, float]]:
    """Each step's loss as the run's records hold it last (a redo's, where a step was trained twice)."""
    last = {event["step"]: event["metrics"]["loss"] for event in read_events(run_dir) if event["event"] == "train"}
    return sorted(last.items())


def attempts() -> list[list[dict]]:
    """Stopped at 2; resumed and killed after 4 (nothing saved past 2); resumed at 2 and redoing 3 and 4, here
    with other values, so that a value TensorBoard shows says which attempt wrote it."""
    return [
        [started(), train(1, loss=1.0), train(2, loss=0.9), checkpoint(2), run_end(2, reason="SIGTERM")],
        [started(2, resumed_from="last"), train(3, loss=0.7), train(4, loss=0.6)],
        [started(2, resumed_from="last"), train(3, loss=0.8), train(4, loss=0.75),
         evaluation(4, 0.5, improved=True, best=0.5, best_step=4), train(5, loss=0.5), run_end(5)],
    ]


def log(run_dir: Path, events: list[dict], **options) -> None:
    with RunLogger(run_dir, is_main_process=True, console=plain_console(), **options) as logger:
        for event in events:
            logger.log(event)


# -- the registry -------------------------------------------------------------------------------------------------
def test_every_tracker_of_the_tracking_section_is_registered_with_its_settings_and_builds_its_sink(tmp_path):
    assert tuple(REGISTRY) == TRACKERS and {"mlflow", "wandb", "tensorboard"} <= set(REGISTRY)
    for name, registered in REGISTRY.items():
        assert TrackingSettings.model_fields[name].annotation == registered.settings | None, name
    every = TrackingSettings(mlflow={"tracking_uri": "sqlite:///m.db"}, wandb={"project": "p"}, tensorboard={})
    assert [sink.name for sink in build_sinks(every, tmp_path, group=None)] == list(REGISTRY)


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, anywhere in it, relative imports made absolute."""
    package = ".".join(path.relative_to(REPOSITORY).parent.parts)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]) if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def test_only_the_registry_and_the_sinks_name_a_trackers_module_or_library():
    """The walk the guide describes for a new tracker: nothing in launcher/ or elsewhere in elfes/ builds a sink or
    imports a tracker's library; they ask the registry."""
    sinks = {registered.sink.__module__ for registered in REGISTRY.values()}

    def names_a_tracker(module: str) -> bool:
        return (module in sinks or module.split(".")[0] in ("mlflow", "wandb", "tensorboard")
                or module.startswith("torch.utils.tensorboard"))

    naming = sorted(str(path.relative_to(REPOSITORY)) for root in ("elfes", "launcher")
                    for path in (REPOSITORY / root).rglob("*.py") if any(map(names_a_tracker, imported_modules(path))))
    assert naming == sorted(["elfes/records/trackers.py", *(module.replace(".", "/") + ".py" for module in sinks)])


def test_a_registered_tracker_is_built_from_trackers_and_from_the_specs_tracking_section(tmp_path, store, monkeypatch):
    events = [started(), train(1, loss=1.0), train(2, loss=0.9), run_end(2)]
    log(tmp_path / "given", events, trackers={"mlflow": {"tracking_uri": store, "experiment": "given"},
                                              "tensorboard": {}})
    state = read_mirror_state(tmp_path / "given", "mlflow")
    assert mlflow_history(store, state.run_id)["train/loss"] == [(1, 1.0), (2, 0.9)]
    assert scalars(tmp_path / "given", "train/loss") == [(1, 1.0), (2, pytest.approx(0.9))]

    from elfes.launcher.spec.loading import load_spec

    tracking = {"mlflow": {"tracking_uri": store, "experiment": "spec"}, "wandb": {"project": "p", "mode": "offline"},
                "tensorboard": {}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump({"name": "spec", "entrypoint": "job:main", "run_dir": "run",
                                                       "tracking": tracking}))
    spec = load_spec(tmp_path / "job.yaml", check_files=False)
    assert spec.tracking.trackers == ("mlflow", "wandb", "tensorboard")
    monkeypatch.setenv("ELFES_TRACKING", spec.tracking.model_dump_json())  # as the job runtime hands it over
    log(tmp_path / "spec", events)
    state = read_mirror_state(tmp_path / "spec", "mlflow")
    assert mlflow_history(store, state.run_id)["train/loss"] == [(1, 1.0), (2, 0.9)]
    assert wandb_offline_ends(wandb_dir(tmp_path / "spec"), read_mirror_state(tmp_path / "spec", "wandb").run_id) == [
        (False, 0)]  # finished
    assert scalars(tmp_path / "spec", "train/loss") == [(1, 1.0), (2, pytest.approx(0.9))]
    monkeypatch.setenv("ELFES_TENSORBOARD", "0")  # turns the section's TensorBoard off, the others stay
    log(tmp_path / "spec-without-tensorboard", events)
    assert not (tmp_path / "spec-without-tensorboard" / "tensorboard").exists()
    assert read_mirror_state(tmp_path / "spec-without-tensorboard", "mlflow") is not None


def test_an_unknown_tracker_is_refused_naming_it_and_the_registered_ones(tmp_path):
    with pytest.raises(ValueError, match="'neptune', which is not a tracker; give one of mlflow, wandb, tensorboard"):
        RunLogger(tmp_path, is_main_process=True, trackers={"neptune": {}})
    with pytest.raises(TypeError, match="trackers= or the deprecated"):
        RunLogger(tmp_path, is_main_process=True, trackers={}, tensorboard=True)
    assert not tmp_path.joinpath("tracking").exists()


def test_the_deprecated_keywords_still_work_and_warn(tmp_path, store, monkeypatch):
    events = [started(), train(1, loss=1.0), run_end(1)]
    with pytest.warns(DeprecationWarning, match="trackers="):
        log(tmp_path / "old", events, mlflow={"tracking_uri": store, "experiment": "old"}, tensorboard=True)
    state = read_mirror_state(tmp_path / "old", "mlflow")
    assert mlflow_history(store, state.run_id)["train/loss"] == [(1, 1.0)]
    assert scalars(tmp_path / "old", "train/loss") == [(1, 1.0)]

    monkeypatch.setenv("ELFES_TENSORBOARD", "1")
    with pytest.warns(DeprecationWarning, match="trackers="):
        log(tmp_path / "off", events, tensorboard=False)  # the argument wins over the environment, as before
    assert not (tmp_path / "off" / "tensorboard").exists()
    with pytest.warns(DeprecationWarning, match="trackers="):
        log(tmp_path / "env", events, wandb={"project": "p", "mode": "offline"})  # TensorBoard from the environment
    assert scalars(tmp_path / "env", "train/loss") == [(1, 1.0)]
    assert read_mirror_state(tmp_path / "env", "wandb") is not None


# -- each tracker's status in its own words ---------------------------------------------------------------------
def test_each_sink_says_the_runs_status_in_its_trackers_words(tmp_path):
    from elfes.records.mlflow_sink import MlflowSink
    from elfes.records.wandb_sink import WandbSink

    assert set(MlflowSink.RUN_STATUS) == set(TrackerStatus)
    assert WandbSink.EXIT_CODES == {TrackerStatus.FINISHED: 0, TrackerStatus.FAILED: 1, TrackerStatus.KILLED: 143}
    sinks = {sink.name: sink for sink in build_sinks(
        TrackingSettings(mlflow={"tracking_uri": "sqlite:///m.db"}, wandb={"project": "p"}, tensorboard={}),
        tmp_path, group=None)}
    assert sinks["mlflow"].describe_status(TrackerStatus.KILLED) == "set KILLED"
    assert sinks["wandb"].describe_status(TrackerStatus.KILLED) == "finished with exit code 143"
    assert Lifecycle(status="KILLED").terminal and not Lifecycle(status="RUNNING").terminal


def test_a_run_end_a_tracker_did_not_take_is_named_in_its_trackers_words(tmp_path, monkeypatch):
    """The launcher's send at a run's end asks the sink how its run shows the status it could not set."""
    from elfes.launcher.job.tracker_publishing import send_lifecycle

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    write_lifecycle(tmp_path, Lifecycle(status="KILLED", attempt_ends={1: "cancelled (SIGTERM)"}))
    settings = TrackingSettings(mlflow={"tracking_uri": f"http://127.0.0.1:{port}"}, tensorboard={})
    (line,) = send_lifecycle(tmp_path, settings, timeout_s=120.0)
    assert line.startswith("the mlflow run was not set KILLED (") and f"`elfes sync {tmp_path}` sends it" in line
    assert read_mirror_state(tmp_path, "tensorboard").lifecycle_sent  # TensorBoard took it: it has no status
    assert not (tmp_path / "tensorboard").exists()  # and wrote no event file for it


# -- TensorBoard through the mirror ---------------------------------------------------------------------------------
def test_tensorboard_through_the_mirror_holds_each_steps_last_recorded_value(tmp_path):
    for events in attempts():
        log(tmp_path, events, trackers={"tensorboard": {}})
    loss = scalars(tmp_path, "train/loss")
    assert [step for step, _ in loss] == [1, 2, 3, 4, 5]
    assert [value for _, value in loss] == pytest.approx([value for _, value in recorded_loss(tmp_path)])
    assert [value for _, value in loss] == pytest.approx([1.0, 0.9, 0.8, 0.75, 0.5])  # the redo's values
    assert scalars(tmp_path, "eval/val/accuracy") == [(4, 0.5)]
    assert len(list((tmp_path / "tensorboard").iterdir())) == 3  # one event file per attempt
    accumulator = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    accumulator.Reload()
    (last,) = [event for event in read_events(tmp_path) if event["event"] == "train" and event["step"] == 5]
    assert accumulator.Scalars("train/loss")[-1].wall_time == pytest.approx(  # at the record's time
        datetime.fromisoformat(last["time"]).timestamp(), abs=1e-3)
    state = read_mirror_state(tmp_path, "tensorboard")
    assert not state.behind and state.offset == (tmp_path / "events.jsonl").stat().st_size


def test_a_mirror_killed_mid_attempt_leaves_its_rows_to_the_next_attempt_which_writes_each_step_once(tmp_path):
    """A kill after TensorBoard took rows and before the mirror recorded it: the next attempt's mirror writes those
    rows again behind a purge marker at the first of them, so each step is shown once."""
    first, second, third = attempts()
    log(tmp_path, first + second[:2], trackers={"tensorboard": {}})
    path = tracker_state_path(tmp_path, "tensorboard")
    lines = (tmp_path / "events.jsonl").read_bytes().splitlines(keepends=True)
    assert [json.loads(line)["event"] for line in lines[:2]] == ["started", "train"]
    state = json.loads(path.read_text())
    path.write_text(json.dumps({**state, "offset": len(lines[0]) + len(lines[1])}))  # recorded up to step 1 only
    log(tmp_path, second[2:], trackers={"tensorboard": {}})  # the rest of attempt 2, by a new mirror
    log(tmp_path, third, trackers={"tensorboard": {}})
    loss = scalars(tmp_path, "train/loss")
    assert [step for step, _ in loss] == [1, 2, 3, 4, 5]
    assert [value for _, value in loss] == pytest.approx([value for _, value in recorded_loss(tmp_path)])


def test_elfes_sync_writes_tensorboard_where_no_mirror_ran(tmp_path):
    for events in attempts():
        log(tmp_path, events, trackers={})  # no tracker: nothing but the records
    (sink,) = build_sinks(TrackingSettings(tensorboard={}), tmp_path, group=None, sender="sync")
    synced = sync_tracker(sink, tmp_path)
    assert synced.tracker == "tensorboard" and synced.rows > 0
    loss = scalars(tmp_path, "train/loss")
    assert [step for step, _ in loss] == [1, 2, 3, 4, 5]
    assert [value for _, value in loss] == pytest.approx([1.0, 0.9, 0.8, 0.75, 0.5])
    assert sync_tracker(sink, tmp_path).rows == 0  # nothing twice


# -- W&B's service --------------------------------------------------------------------------------------------------
def wandb_services() -> list[int]:
    """The W&B service processes that serve this one (``wandb-core ... --pid <this pid>``) and have not exited."""
    found = []
    for folder in Path("/proc").iterdir():
        if not folder.name.isdigit():
            continue
        try:
            arguments = (folder / "cmdline").read_bytes().split(b"\0")
            state = (folder / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if (state != "Z" and any(argument.endswith(b"wandb-core") for argument in arguments) and b"--pid" in arguments
                and arguments[arguments.index(b"--pid") + 1] == str(os.getpid()).encode()):
            found.append(int(folder.name))
    return found


def test_the_wandb_service_counts_the_sinks_open_runs_and_is_torn_down_after_the_last(tmp_path):
    from elfes.records.wandb_sink import SERVICE

    assert SERVICE.open_runs == 0
    settings = TrackingSettings(wandb={"project": "p", "mode": "offline"})
    (first,) = build_sinks(settings, tmp_path / "a", group=None)
    (second,) = build_sinks(settings, tmp_path / "b", group=None)
    first_id, second_id = first.open(None, None), second.open(None, None)
    assert SERVICE.open_runs == 2 and wandb_services()
    first.close()
    assert SERVICE.open_runs == 1 and wandb_services()  # the second run is still served
    second.close()
    assert SERVICE.open_runs == 0
    wait_until(lambda: not wandb_services(), "the W&B service to exit")
    # Torn down, the service wrote each offline run out whole, its exit included (paused: marked preempting).
    assert wandb_offline_ends(wandb_dir(tmp_path / "a"), first_id) == [(True, 1)]
    assert wandb_offline_ends(wandb_dir(tmp_path / "b"), second_id) == [(True, 1)]


def test_the_wandb_service_serves_on_while_the_process_has_a_run_of_its_own(tmp_path):
    import wandb

    from elfes.records.wandb_sink import SERVICE

    own = wandb.init(project="p", mode="offline", dir=str(tmp_path), reinit="create_new")
    try:
        (sink,) = build_sinks(TrackingSettings(wandb={"project": "p", "mode": "offline"}), tmp_path / "a", group=None)
        sink.open(None, None)
        sink.close()
        assert SERVICE.open_runs == 0 and wandb_services()  # not torn down under the job's own run
        own.log({"after": 1.0})  # which still logs
    finally:
        own.finish()
    wandb.teardown()
    wait_until(lambda: not wandb_services(), "the W&B service to exit")
