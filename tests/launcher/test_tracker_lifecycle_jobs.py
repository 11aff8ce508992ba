"""The tracker run's lifecycle of a real local job: a failure retried from `last`, then the finish, leaves the
MLflow run FINISHED with both attempts' ends tagged and the attempt's provenance; the lifecycle file says the
same as `elfes status`. The lifecycle's rules against the real libraries without jobs:
tests/records/test_tracker_lifecycle.py; a run preempted, killed and resumed: tests/plot/test_interrupted_run_trackers.py."""

from __future__ import annotations

import pytest
from local_runs import CONFIG, Runs, wait_ended

from elfes.records.tracker_lifecycle import read_lifecycle
from elfes.records.tracker_sender import read_mirror_state

pytest.importorskip("mlflow", reason="the mlflow extra: pip install -e '.[test]' installs it")


def test_a_retried_failure_then_the_finish_leaves_the_mlflow_run_finished_with_each_attempts_end(runs: Runs, tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_dir = runs.submit("retried", entrypoint="tests.launcher.fault_entrypoints:raises_at_step_7",
                          config={**CONFIG, "step_delay_s": 0.0, "fault_rank": 0, "fault_attempts": [1]},
                          requeue={"max_requeues": 2, "max_failures": 1},
                          tracking={"mlflow": {"tracking_uri": store, "experiment": "lifecycle"}})
    state = wait_ended(run_dir, "finished")
    assert [attempt.outcome for attempt in state.attempts] == ["failed", "finished"]

    from mlflow.tracking import MlflowClient

    run = MlflowClient(tracking_uri=store).get_run(read_mirror_state(run_dir, "mlflow").run_id)
    assert run.info.status == "FINISHED"
    tags = run.data.tags
    assert (tags["elfes.status"], tags["elfes.attempt.1.end"], tags["elfes.attempt.2.end"]) == (
        "FINISHED", "failed (retried)", "finished")
    provenance = state.attempts[-1].provenance
    assert tags["elfes.version.torch"] == provenance.torch and tags["elfes.version.python"] == provenance.python
    assert tags["elfes.code.fingerprint"] == provenance.code.fingerprint
    assert run.data.params["spec.name"] == "retried" and run.data.params["spec.requeue.max_failures"] == "1"
    assert read_lifecycle(run_dir).status == "FINISHED"
