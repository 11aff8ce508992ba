"""state.json: the run's state machine, attempts and requeue counting (pure transitions), and its file."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from elfes.launcher.rundir import state as S
from elfes.launcher.rundir.paths import RunPaths


def submitted(max_requeues: int = 2) -> S.RunState:
    state = S.record_submission(None, executor="local", kind="submit", max_requeues=max_requeues, run_dir="runs/a")
    return S.mark_pending(state, job_id="41")


def begin(state: S.RunState, token: str, launch: str = "submit") -> S.RunState:
    return S.begin_attempt(state, token=token, job_id=token.split(":")[0], launch=launch, hosts=["node1"], world_size=2)


def test_a_run_goes_through_requeues_to_finished_and_counts_them():
    state = submitted()
    assert (state.status, state.job_id, state.requeues_used, state.requeues_left) == ("pending", "41", 0, 2)
    state = begin(state, "41:0")
    assert state.status == "running" and state.attempts[0].number == 1
    state = S.mark_stopping(state, signal="SIGUSR2")
    assert (state.status, state.stopping_signal) == ("stopping", "SIGUSR2")
    state = S.end_attempt(state, token="41:0", outcome="requeued", signal="SIGUSR2", step=7)
    assert state.status == "requeued" and state.stopping_signal is None
    state = begin(state, "41:1", launch="requeue")
    state = S.end_attempt(state, token="41:1", outcome="finished", step=20)
    assert state.status == "finished"
    assert [(a.number, a.launch, a.outcome, a.step) for a in state.attempts] == [
        (1, "submit", "requeued", 7), (2, "requeue", "finished", 20)]
    assert (state.requeues_used, state.requeues_left, state.error) == (1, 1, None)


def test_every_rank_derives_the_same_attempt_number_and_requeues_before_or_after_rank_0_records_it():
    state = begin(submitted(), "41:0")
    state = S.end_attempt(state, token="41:0", outcome="requeued", signal="SIGUSR2", step=3)
    recorded = begin(state, "41:1", launch="requeue")
    for seen in (state, recorded):  # a rank that read state.json before, and one that read it after, rank 0 wrote
        assert S.attempt_number(seen, "41:1") == 2
        assert S.requeues_used_by(seen, "41:1", "requeue") == 1
    assert S.attempt_number(None, "41:0") == 1 and S.requeues_used_by(None, "41:0", "submit") == 0
    assert S.latest_submission_kind(recorded) == "submit" and S.latest_submission_kind(None) == "submit"


def test_a_start_after_an_attempt_that_recorded_no_end_closes_it_as_lost_and_recording_twice_is_a_no_op():
    state = begin(submitted(), "41:0")
    state = begin(state, "41:1", launch="requeue")  # SLURM requeued after a node failure
    assert [a.outcome for a in state.attempts] == ["lost", None]
    assert "without recording an outcome" in state.attempts[0].error
    assert begin(state, "41:1", launch="requeue") is state


def test_an_attempt_stopped_by_sigterm_that_slurm_requeued_is_counted_requeued():
    """Under SLURM a preempted job saves on SIGTERM, records "stopped" and waits; SLURM kills and requeues
    it. `elfes status` sees the restart count grow (requeued_by_slurm); the relaunch records it for good."""
    state = S.end_attempt(begin(submitted(), "41:0/1"), token="41:0/1", outcome="stopped", signal="SIGTERM", step=5)
    assert S.token_restart("41:0/1") == 0 and S.token_restart("41:3/2") == 3 and S.token_restart("submission") is None
    seen = S.requeued_by_slurm(state)
    assert (seen.status, seen.attempts[0].outcome, seen.attempts[0].signal) == ("requeued", "requeued", "SIGTERM")
    assert S.requeued_by_slurm(seen) is seen  # no-op unless stopped
    state = begin(state, "41:1/1", launch="requeue")
    assert [(a.outcome, a.launch) for a in state.attempts] == [("requeued", "submit"), (None, "requeue")]
    assert state.requeues_used == 1
    # A relaunch of another job (elfes resume) leaves a stopped attempt stopped.
    other = S.end_attempt(begin(submitted(), "41:0/1"), token="41:0/1", outcome="stopped", signal="SIGTERM")
    other = S.begin_attempt(other, token="42:0/2", job_id="42", launch="resume", hosts=["node1"], world_size=2)
    assert other.attempts[0].outcome == "stopped"


def test_a_running_attempt_whose_job_slurm_requeued_shows_the_run_requeued_until_the_relaunch_closes_it_lost():
    """A node failure: SLURM requeued the job while attempt 1 ran, and attempt 1 recorded nothing. `elfes
    status` sees the restart count grow: the run is "requeued" (its attempt still open, how it ended unknown);
    the relaunch closes it as lost."""
    for running in (begin(submitted(), "41:0/1"), S.mark_stopping(begin(submitted(), "41:0/1"), signal="SIGUSR2")):
        seen = S.requeued_by_slurm(running)
        assert (seen.status, seen.stopping_signal, [a.outcome for a in seen.attempts]) == ("requeued", None, [None])
        relaunched = begin(running, "41:1/1", launch="requeue")
        assert [(a.outcome, a.launch) for a in relaunched.attempts] == [("lost", "submit"), (None, "requeue")]


def test_a_job_gone_without_an_outcome_ends_failed_or_cancelled():
    running = begin(submitted(), "41:0")
    failed = S.mark_lost(running, cancelled=False)
    assert failed.status == "failed" and failed.attempts[0].outcome == "lost" and "elfes logs" in failed.error
    assert S.mark_lost(running, cancelled=True).status == "cancelled"
    assert S.mark_lost(failed, cancelled=True) is failed  # an ended run is left alone


def test_impossible_transitions_are_refused_saying_what_to_do():
    running = begin(submitted(), "41:0")
    with pytest.raises(S.NotNow, match="cannot record a submit while the run is running .*elfes cancel"):
        S.record_submission(running, executor="local", kind="submit", max_requeues=2, run_dir="runs/a")
    with pytest.raises(S.NotNow, match="only a stopped, cancelled, failed or finished run can be resumed"):
        S.record_submission(running, executor="local", kind="resume", max_requeues=2, run_dir="runs/a")
    with pytest.raises(S.NotNow, match="only a requeued run is resubmitted"):
        S.record_submission(running, executor="local", kind="requeue", max_requeues=2, run_dir="runs/a")
    with pytest.raises(S.NotNow, match="needs an existing run"):
        S.record_submission(None, executor="local", kind="resume", max_requeues=2, run_dir="runs/a")
    with pytest.raises(S.NotNow, match="outcome must be one of"):
        S.end_attempt(running, token="41:0", outcome="done")
    with pytest.raises(S.NotNow, match="no attempt with token '9:0'"):
        S.end_attempt(running, token="9:0", outcome="finished")
    ended = S.end_attempt(running, token="41:0", outcome="stopped", signal="SIGTERM", step=4)
    with pytest.raises(S.NotNow, match="attempt 1 already ended \\(stopped\\)"):
        S.end_attempt(ended, token="41:0", outcome="finished")
    resumed = S.record_submission(ended, executor="local", kind="resume", max_requeues=2, run_dir="runs/a")
    assert resumed.status == "submitted" and [s.kind for s in resumed.submissions] == ["submit", "resume"]


def test_a_failed_attempt_carries_its_message_and_a_refused_submission_fails_the_run():
    state = S.end_attempt(begin(submitted(), "41:0"), token="41:0", outcome="failed", error="ValueError: bad lr")
    assert (state.status, state.error) == ("failed", "ValueError: bad lr")
    refused = S.mark_submission_failed(S.record_submission(None, executor="slurm", kind="submit", max_requeues=1,
                                                           run_dir="runs/a"),
                                       error="sbatch: invalid partition")
    assert (refused.status, refused.error) == ("failed", "sbatch: invalid partition")


def test_state_json_round_trips_and_a_damaged_file_is_reported_by_name(tmp_path: Path):
    paths = RunPaths(tmp_path / "run")
    assert S.load_state(paths) is None
    state = S.update_state(paths, lambda s: S.record_submission(s, executor="local", kind="submit", max_requeues=3,
                                                                run_dir=str(paths.run_dir)))
    state = S.update_state(paths, lambda s: begin(S.mark_pending(s, job_id="7"), "7:0"))
    assert S.load_state(paths) == state
    raw = json.loads(paths.state.read_text())
    assert (raw["status"], raw["requeues_used"], raw["requeues_left"], raw["version"]) == ("running", 0, 3, 1)
    assert S.update_state(paths, lambda s: s) == state  # unchanged: nothing rewritten
    paths.state.write_text("{not json")
    with pytest.raises(S.RunDamaged, match="state.json cannot be read"):
        S.load_state(paths)


def test_concurrent_writers_lose_no_update(tmp_path: Path):
    paths = RunPaths(tmp_path)
    S.update_state(paths, lambda s: S.record_submission(s, executor="local", kind="submit", max_requeues=0,
                                                        run_dir=str(paths.run_dir)))

    def writer(name: str) -> None:
        for index in range(15):
            S.update_state(paths, lambda s, index=index: begin(s, f"{name}:{index}"))

    threads = [threading.Thread(target=writer, args=(f"w{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    state = S.load_state(paths)
    assert len(state.attempts) == 60 and [a.number for a in state.attempts] == list(range(1, 61))


def test_a_submission_recorded_after_its_run_finished_meanwhile_is_refused_with_the_submitters_reason():
    # The submitter read the run as running; its job finished before the submission was recorded, under
    # the state lock. The refusal is decided there, so no second job starts for a finished run.
    finished = S.end_attempt(begin(submitted(), "41:0"), token="41:0", outcome="finished", step=20)
    reason = "the run is finished; submitting it again would train nothing"
    with pytest.raises(S.NotNow, match=reason):
        S.record_submission(finished, executor="local", kind="submit", max_requeues=2, refuse_finished=reason,
                            run_dir="runs/a")
    again = S.record_submission(finished, executor="local", kind="submit", max_requeues=2,
                                run_dir="runs/a")  # a raised budget
    assert again.status == "submitted" and len(again.submissions) == 2


def test_a_resume_of_a_run_retrying_a_failure_says_it_retries_from_last_and_points_at_status():
    failure = S.Failure(category="exception", cause="RuntimeError: the loss is NaN", retried=True, step=7)
    requeued = S.end_attempt(begin(submitted(), "41:0"), token="41:0", outcome="failed", error="boom", failure=failure)
    running = begin(requeued, "41:1", launch="requeue")
    for state in (requeued, running):  # waiting for its retry, and running it
        with pytest.raises(S.NotNow) as refused:
            S.record_submission(state, executor="local", kind="resume", max_requeues=2, run_dir="runs/a")
        said = str(refused.value)
        assert said.startswith("the run is retrying itself from `last` after attempt 1 failed (RuntimeError: the "
                               "loss is NaN)"), said
        assert "`elfes status runs/a --until ended`" in said
    stopped = S.end_attempt(begin(submitted(), "41:0"), token="41:0", outcome="requeued", signal="SIGUSR2", step=3)
    with pytest.raises(S.NotNow, match="cannot record a resume while the run is requeued"):  # a requeue, not a retry
        S.record_submission(stopped, executor="local", kind="resume", max_requeues=2, run_dir="runs/a")
