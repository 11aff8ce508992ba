"""The tracker run's lifecycle against the real libraries (an MLflow SQLite store, W&B offline read back from its
transaction logs), driven as the job drives it: ``state.json`` changed by the launcher's own transitions, the
lifecycle published at each attempt's begin and end (launcher/job/tracker_publishing.py), the attempts' records
mirrored by RunLogger. A requeued attempt leaves the run RUNNING and its end is tagged by the next attempt; a
cancel ends it KILLED, a failure not retried FAILED; the spec goes as parameters without credentials, the
provenance as tags. Real jobs: tests/launcher/test_tracker_lifecycle_jobs.py and
tests/plot/test_interrupted_run_trackers.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from synthetic_events import plain_console, run_end, started, train

from elfes.launcher.job.tracker_publishing import lifecycle_of, publish_lifecycle
from elfes.launcher.rundir import state as run_state
from elfes.launcher.rundir.paths import RunPaths
from elfes.launcher.rundir.provenance import CodeProvenance, Provenance
from elfes.launcher.rundir.state import Failure
from elfes.launcher.spec.loading import load_spec
from elfes.records import RunLogger
from elfes.records.tracker_sender import read_mirror_state
from elfes.records.tracking import wandb_dir

pytest.importorskip("mlflow", reason="the mlflow extra: pip install -e '.[test]' installs it")
pytest.importorskip("wandb", reason="the wandb extra: pip install -e '.[test]' installs it")
from tracker_histories import wandb_offline_config, wandb_offline_ends, wandb_offline_summary  # noqa: E402

# W&B offline in the test's folder; closes patient on a loaded machine (tests/records/conftest.py)
pytestmark = pytest.mark.usefixtures("wandb_offline", "patient_close")

SECRET = "hf_4c1d9e0b7a-secret"
PROVENANCE = Provenance(python="3.12.3", torch="2.13.0", elfes="0.9.0", code=CodeProvenance(
    path="code/1", origin="submit", taken_at="2025-01-01T00:00:00+00:00", commit="a" * 40, dirty=True,
    fingerprint="f" * 64))


class Run:
    """A run directory whose ``state.json`` moves as the launcher moves it, with the trackers of its spec."""

    def __init__(self, tmp_path: Path, store: str, experiment: str, **fields: object) -> None:
        tracking = {"mlflow": {"tracking_uri": store, "experiment": experiment},
                    "wandb": {"project": "elfes-tests", "mode": "offline"}}
        spec = {"name": experiment, "entrypoint": "job:main", "run_dir": "run", "config": {"lr": 0.1},
                "env": {"HF_TOKEN": SECRET, "OMP_NUM_THREADS": "1"}, "tracking": tracking, **fields}
        (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
        self.spec = load_spec(tmp_path / "job.yaml", check_files=False)
        self.paths = RunPaths(tmp_path / "run")
        self.state = run_state.record_submission(None, executor="local", kind="submit", max_requeues=5,
                                                 run_dir=str(self.paths.run_dir))
        self.state = run_state.mark_pending(self.state, job_id="42")

    def attempt(self, number: int, events: list[dict], *, ends: str, **end: object) -> list[str]:
        """Attempt ``number``: begun and published (as rank 0 does after its provenance), its records mirrored,
        ended with ``ends`` and published with the send that an end of the run makes."""
        token = f"42:{number - 1}/1"
        self.state = run_state.begin_attempt(self.state, token=token, job_id="42", launch="submit" if number == 1
                                             else "requeue", hosts=["node-a"], world_size=1)
        self.state = run_state.record_provenance(self.state, token=token, provenance=PROVENANCE)
        publish_lifecycle(self.paths, self.spec, self.state, send=False)
        with RunLogger(self.paths.run_dir, is_main_process=True, console=plain_console(),
                       trackers=self.spec.tracking) as logger:
            for event in events:
                logger.log(event)
        self.state = run_state.end_attempt(self.state, token=token, outcome=ends, **end)
        return publish_lifecycle(self.paths, self.spec, self.state, send=True)

    def mlflow_run(self):
        from mlflow.tracking import MlflowClient

        return MlflowClient(tracking_uri=self.spec.tracking.mlflow.tracking_uri).get_run(
            read_mirror_state(self.paths.run_dir, "mlflow").run_id)

    def wandb_config(self) -> dict:
        return wandb_offline_config(wandb_dir(self.paths.run_dir), read_mirror_state(self.paths.run_dir, "wandb").run_id)

    def wandb(self) -> tuple[list[tuple[bool, int]], dict]:
        run_id = read_mirror_state(self.paths.run_dir, "wandb").run_id
        # Read in the process whose W&B service wrote the logs: each is read once it holds its exit record.
        return (wandb_offline_ends(wandb_dir(self.paths.run_dir), run_id),
                wandb_offline_summary(wandb_dir(self.paths.run_dir), run_id))


def test_a_requeued_attempt_leaves_the_run_running_and_a_cancel_ends_it_killed(tmp_path, store):
    run = Run(tmp_path, store, "cancelled")
    assert run.attempt(1, [started(), train(1, loss=1.0), run_end(1, reason="SIGUSR2")],
                       ends="requeued", signal="SIGUSR2") == []
    mlflow = run.mlflow_run()
    assert mlflow.info.status == "RUNNING" and mlflow.data.tags["elfes.status"] == "RUNNING"
    assert "elfes.attempt.1.end" not in mlflow.data.tags  # told by the next attempt, not during the grace time
    ends, summary = run.wandb()
    assert ends == [(True, 1)] and summary["elfes.status"] == "RUNNING"  # W&B: preempted, not finished

    assert run.attempt(2, [started(1, resumed_from="last"), train(2, loss=0.9), run_end(2, reason="SIGTERM")],
                       ends="cancelled", signal="SIGTERM") == []
    mlflow = run.mlflow_run()
    assert mlflow.info.status == "KILLED" and mlflow.info.end_time is not None
    tags, params = mlflow.data.tags, mlflow.data.params
    assert tags["elfes.status"] == "KILLED"
    assert (tags["elfes.attempt.1.end"], tags["elfes.attempt.2.end"]) == ("requeued (SIGUSR2)", "cancelled (SIGTERM)")
    assert (tags["elfes.code.commit"], tags["elfes.code.dirty"], tags["elfes.version.torch"],
            tags["elfes.version.python"], tags["elfes.version.elfes"]) == ("a" * 40, "true", "2.13.0", "3.12.3", "0.9.0")
    assert "elfes.version.cuda" not in tags  # a CPU build: unknown, left out
    assert params["spec.name"] == "cancelled" and params["spec.config.lr"] == "0.1"
    assert not any(key.startswith("spec.env") for key in params)  # no env value is sent
    assert params["spec.tracking.wandb.mode"] == "offline" and params["config.lr"] == "0.001"  # and the TrainConfig
    ends, summary = run.wandb()
    assert ends == [(True, 1), (True, 1), (False, 143)]  # two attempts paused, then the run's end
    assert summary["elfes.status"] == "KILLED" and summary["elfes.attempt.1.end"] == "requeued (SIGUSR2)"
    assert summary["elfes.attempt.2.end"] == "cancelled (SIGTERM)" and summary["elfes.code.commit"] == "a" * 40
    for path in run.paths.run_dir.rglob("*"):
        if path.is_file() and path.name != "job.yaml":
            assert SECRET.encode() not in path.read_bytes(), path


def test_a_failure_not_retried_ends_the_run_failed_and_one_retried_does_not(tmp_path, store):
    run = Run(tmp_path, store, "failed")
    retried = Failure(category="exception", cause="RuntimeError: boom", retried=True, step=2)
    run.attempt(1, [started(), train(1, loss=1.0)], ends="failed", error="RuntimeError: boom", failure=retried)
    assert run.mlflow_run().info.status == "RUNNING"
    final = Failure(category="exception", cause="RuntimeError: boom", retried=False, step=2, reason="it repeats")
    run.attempt(2, [started(1, resumed_from="last"), train(2, loss=0.9)], ends="failed", error="RuntimeError: boom",
                failure=final)
    mlflow = run.mlflow_run()
    assert mlflow.info.status == "FAILED" and mlflow.data.tags["elfes.status"] == "FAILED"
    assert (mlflow.data.tags["elfes.attempt.1.end"], mlflow.data.tags["elfes.attempt.2.end"]) == (
        "failed (retried)", "failed")
    ends, summary = run.wandb()
    assert ends == [(True, 1), (True, 1), (False, 1)] and summary["elfes.status"] == "FAILED"


def test_a_vanished_attempt_is_set_right_by_the_next(tmp_path, store):
    """Attempt 1 is killed with no chance to say so; attempt 2's start closes it "lost" and the run goes on."""
    run = Run(tmp_path, store, "vanished")
    run.state = run_state.begin_attempt(run.state, token="42:0/1", job_id="42", launch="submit", hosts=["a"],
                                        world_size=1)
    run.state = run_state.begin_attempt(run.state, token="42:1/1", job_id="42", launch="requeue", hosts=["a"],
                                        world_size=1)
    lifecycle = lifecycle_of(run.state, run.spec)
    assert lifecycle.status == "RUNNING" and lifecycle.attempt_ends == {1: "lost"}


def test_a_stopped_run_is_killed_until_its_next_attempt(tmp_path, store):
    run = Run(tmp_path, store, "stopped")
    run.state = run_state.begin_attempt(run.state, token="42:0/1", job_id="42", launch="submit", hosts=["a"],
                                        world_size=1)
    run.state = run_state.end_attempt(run.state, token="42:0/1", outcome="stopped", signal="SIGTERM")
    lifecycle = lifecycle_of(run.state, run.spec)
    assert lifecycle.status == "KILLED" and lifecycle.attempt_ends == {1: "stopped (SIGTERM)"}
    run.state = run_state.begin_attempt(run.state, token="42:1/1", job_id="42", launch="requeue", hosts=["a"],
                                        world_size=1)  # SLURM requeued the preempted job
    lifecycle = lifecycle_of(run.state, run.spec)
    assert lifecycle.status == "RUNNING" and lifecycle.attempt_ends == {1: "requeued (SIGTERM)"}


# The issue's own examples: env values that reached the trackers, and an innocent name that did not.
ENV_SECRETS = {"OPENAI_KEY": "sk-proj-4f9a8b7c6d5e4f3a2b1c0d9e8f7a", "WANDB_KEY": "9c8b7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b",
               "HF_HUB_KEY": "hf_QwErTyUiOpAsDfGhJkLzXcVbNm01234567", "GH_PAT": "ghp_Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2Ji1Hg0FeDcBa",
               "DB_DSN": "host=db.internal dbname=runs user=trainer password:Hunter2-db"}
NOTE = "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ0cmFpbmVyIn0.c2lnbmF0dXJlLXBhcnQ"
INNOCENT = {"author": "Ada Lovelace", "tokenizer": "gpt2", "num_tokens": 4096, "keyboard": "qwerty",
            "monkey_patch": True, "eos_token": "</s>", "lr": 0.1}


def test_no_env_value_nor_credential_looking_config_reaches_mlflow_wandb_or_lifecycle(tmp_path, store):
    run = Run(tmp_path, store, "credentials", env={**ENV_SECRETS, "OMP_NUM_THREADS": "1"},
              config={**INNOCENT, "note": NOTE, "api_key": "plain-looking-value"})
    training = started()
    training["config"] = {**training["config"], "hub_token": "hf-hub-value-in-trainconfig", "author": "Ada"}
    run.attempt(1, [training, train(1, loss=1.0), run_end(1)], ends="finished")
    secrets = [*ENV_SECRETS.values(), NOTE.split()[1], "plain-looking-value", "hf-hub-value-in-trainconfig"]

    params = run.mlflow_run().data.params
    assert {key: params[f"spec.config.{key}"] for key in INNOCENT} == {
        key: value if isinstance(value, str) else json.dumps(value) for key, value in INNOCENT.items()}
    assert params["config.author"] == "Ada" and "config.hub_token" not in params  # the TrainConfig, filtered too
    assert not [key for key in params if key.startswith("spec.env") or key in ("spec.config.note",
                                                                               "spec.config.api_key")]
    config = run.wandb_config()
    assert config["spec"]["spec.config.author"] == "Ada Lovelace" and config["config"]["author"] == "Ada"
    assert "spec.config.note" not in config["spec"] and "hub_token" not in config["config"]
    assert not [key for key in config["spec"] if key.startswith("spec.env")]
    lifecycle = json.loads((run.paths.run_dir / "tracking" / "lifecycle.json").read_text())
    assert lifecycle["params"]["spec.config.tokenizer"] == "gpt2" and "spec.env.OMP_NUM_THREADS" not in lifecycle["params"]
    sent = [json.dumps(params), json.dumps(run.mlflow_run().data.tags)]
    sent += [path.read_bytes().decode("utf-8", "replace") for path in (run.paths.run_dir / "tracking").rglob("*")
             if path.is_file()]  # the lifecycle, the mirrors' states, W&B's offline logs
    sent.append(Path(store.removeprefix("sqlite:///")).read_bytes().decode("utf-8", "replace"))
    leaked = [secret for secret in secrets for text in sent if secret in text]
    assert leaked == []


def test_a_spec_parameter_that_mlflow_refuses_keeps_out_neither_the_others_nor_the_status(tmp_path, store):
    from mlflow.tracking import MlflowClient

    from elfes.launcher.job.tracker_publishing import send_lifecycle
    from elfes.records.tracker_lifecycle import Lifecycle, write_lifecycle

    run = Run(tmp_path, store, "refused")
    lifecycle = Lifecycle(status="FINISHED", attempt_ends={1: "finished"},
                          params={"spec.config.lr@warmup": "1", "spec.config." + "x" * 300: "2", "spec.name": "refused"})
    write_lifecycle(run.paths.run_dir, lifecycle)
    assert send_lifecycle(run.paths.run_dir, run.spec.tracking) == []
    mlflow = MlflowClient(tracking_uri=store).get_run(read_mirror_state(run.paths.run_dir, "mlflow").run_id)
    assert mlflow.info.status == "FINISHED" and mlflow.data.tags["elfes.attempt.1.end"] == "finished"
    assert mlflow.data.params == {"spec.name": "refused"}
