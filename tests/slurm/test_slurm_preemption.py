"""ELFES jobs preempted, timed out and cancelled on a real (private) SLURM cluster, end to end.

Real jobs through the `elfes` CLI (the quickstart model, slowed in its first attempt so that a signal lands
mid-run), real preemption by a job in the `high` partition, real time limits, real `scancel`. Each
interrupted run ends bitwise equal (torch.equal on every tensor of the final checkpoint and of the exported
model) to an uninterrupted run of the same job (the local executor, started on first use, trains it while
the SLURM jobs wait).

- the user signal (`preempt_send_user_signal`, 2 tasks in one gloo group): USR2, `last` saved, rank 0 runs
  `scontrol requeue`, every rank exits, `elfes status` shows `PENDING (BeginTime)` and the restart count,
  the relaunch resumes; the per-task logs of both starts are kept (`--open-mode=append`);
- plain SIGTERM (the parameter off): `last` saved, the job stays alive (a resume is refused meanwhile) until
  SLURM kills it at the end of GraceTime and requeues it itself;
- the time limit: a first attempt whose training would outlast its 3-minute limit gets USR2 before the
  limit, requeues itself, and the relaunch finishes; side by side with it (one test, to keep the suite
  short), `elfes cancel`: `last` saved, the job stays cancelled; `elfes resume` finishes it;
- `elfes doctor` against both preemption configurations.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from cluster import SlurmCluster, wait_for
from run_comparison import assert_runs_bitwise_equal
from slurm_runs import (
    PLANNED_STEPS,
    RUN_TIMEOUT_S,
    SHARDED_CHARLM,
    accounted,
    assert_bitwise_equal_to,
    diagnostics,
    elfes,
    ended_at,
    events,
    final_accounted,
    outcomes,
    preempt_with_a_high_job,
    queue,
    started_at,
    state_of,
    status,
    submit,
    submitit_starts,
    training_from,
    wait_ended,
    wait_run,
    write_spec,
)

from elfes.launcher.rundir.paths import RunPaths


def test_preempted_with_the_user_signal_requeues_itself_and_resumes_bitwise(
    slurm_user_signal: SlurmCluster, tmp_path: Path, reference: Callable[[int], Path]
):
    """Two tasks (one gloo group) in `low` on both CPUs; a one-CPU job in `high` preempts them: both get USR2,
    stop at one window boundary, `last` is saved, rank 0 runs `scontrol requeue` and every rank exits; the
    preemptor runs; `elfes status` shows the job PENDING (BeginTime) with one restart; the relaunch resumes."""
    slurm, tasks = slurm_user_signal, 2
    expected = reference(tasks)
    run_dir = submit(slurm, tmp_path, "user-signal", tasks=tasks)
    wait_run(run_dir, lambda: training_from(run_dir, 2), "attempt 1 to train to step 2")
    preemptor = preempt_with_a_high_job(slurm, tmp_path)
    job_id = state_of(run_dir).job_id

    report = wait_run(run_dir, lambda: (r := status(slurm, run_dir))["queue_state"] == "PENDING" and r,
                      "elfes status to show the requeued job pending")
    assert (report["status"], report["queue_reason"], report["restart_count"]) == ("requeued", "BeginTime", 1), report
    assert report["attempts"][0]["outcome"] == "requeued" and report["job_id"] == job_id
    state = wait_ended(run_dir, "finished")

    assert outcomes(state) == [("requeued", "SIGUSR2", "submit"), ("finished", None, "requeue")]
    assert 2 <= state.attempts[0].step < PLANNED_STEPS // tasks and state.attempts[1].step == PLANNED_STEPS // tasks
    assert f"elfes: requeued SLURM job {job_id} (scontrol requeue)" in RunPaths(run_dir).rank_log(1, 0).read_text()
    for rank in range(tasks):  # every rank stopped at the same boundary and left for the requeue
        log = RunPaths(run_dir).rank_log(1, rank).read_text()
        assert f"elfes: attempt 1 ended requeued (SIGUSR2) at step {state.attempts[0].step}" in log
    assert {attempt.job_id for attempt in state.attempts} == {job_id}  # SLURM started the same job again
    assert accounted(slurm, preemptor) == "COMPLETED" and "preemptor ran" in (tmp_path / "preemptor.out").read_text()
    assert submitit_starts(run_dir, job_id) == 2  # --open-mode=append: the relaunch kept the first start's log
    assert [e["world_size"] for e in events(run_dir) if e["event"] in ("started", "resumed")] == [tasks, tasks]
    assert_bitwise_equal_to(run_dir, expected, tasks)

    # Goodput with SLURM's accounting: after the requeue, the job's BeginTime hold (until sacct's Eligible of its
    # second start) is time between attempts, and from then to the relaunch, time in the queue.
    accounting = slurm.run("sacct", "-n", "-X", "-D", "-P", "-o", "Eligible", "-j", job_id).stdout.split()
    eligible = sorted(datetime.fromisoformat(text).astimezone() for text in accounting)
    assert len(eligible) == 2, accounting  # the submission's start and the requeue's
    relaunch = status(slurm, run_dir)["goodput"]["attempts"][1]
    requeued_at, launched_at = (datetime.fromisoformat(time) for time in (relaunch["begins_at"], state.attempts[1].started_at))
    assert requeued_at < eligible[1] <= launched_at, (requeued_at, eligible, launched_at)
    assert relaunch["parts"]["between_s"] == pytest.approx((eligible[1] - requeued_at).total_seconds(), abs=1e-3)
    assert relaunch["parts"]["queue_s"] == pytest.approx((launched_at - eligible[1]).total_seconds(), abs=1e-3)


def test_a_sharded_model_preempted_on_slurm_resumes_bitwise_from_its_folder_of_shards(
    slurm_user_signal: SlurmCluster, tmp_path: Path, straight_runs: Callable[..., Path]
):
    """examples/charlm with its model sharded over two tasks (FSDP2 over gloo), preempted by a `high` job: both
    ranks write their shards of `last` into one folder, rank 0 requeues, and the relaunch, reading its shards
    back, ends bitwise equal (every tensor, the shards read whole) to a straight run on the local executor (the
    session's, shared with test_two_hosts.py's sharded job)."""
    slurm, tasks = slurm_user_signal, 2
    straight = straight_runs(tasks=tasks, **SHARDED_CHARLM)
    run_dir = submit(slurm, tmp_path, "sharded", tasks=tasks, step_delay_s=0.1, **SHARDED_CHARLM)
    wait_run(run_dir, lambda: training_from(run_dir, 2), "attempt 1 to train to step 2")
    preempt_with_a_high_job(slurm, tmp_path)
    state = wait_ended(run_dir, "finished")

    assert outcomes(state) == [("requeued", "SIGUSR2", "submit"), ("finished", None, "requeue")]
    final = state.attempts[1].step
    assert 2 <= state.attempts[0].step < final
    resumed = [e for e in events(run_dir) if e["event"] == "resumed"]
    assert [Path(e["resumed_from"]).suffix for e in resumed] == [".dcp"]
    shards = sorted(entry.name for entry in RunPaths(run_dir).final.resolve().iterdir())
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp", "state.pt"], shards
    assert wait_ended(straight, "finished").attempts[-1].step == final
    assert_runs_bitwise_equal(run_dir, straight)


def test_an_edit_before_a_preemption_does_not_reach_the_relaunch_on_slurm(slurm_user_signal: SlurmCluster,
                                                                         tmp_path: Path):
    """The job's train.py (a project of its own, a git work tree) is edited while the job runs, then `elfes
    preempt`: SLURM's relaunch runs the code snapshot taken at submission, not the edited file, and ends bitwise
    equal to a straight (local) run of the submitted code."""
    from snapshot_project import make_project, set_scale

    project = make_project(tmp_path / "project")
    specs = {}
    # A second a step: `elfes preempt` reaches SLURM seconds after step 2 on a loaded machine (5 s beside a CPU
    # burner, when 0.3 s a step left the run 4 s: it finished first), and the signal must land before step 16.
    for name, delay in (("straight", 0.0), ("edited", 1.0)):
        specs[name] = tmp_path / f"{name}.yaml"
        specs[name].write_text(json.dumps({
            "name": name, "entrypoint": "train:main", "workdir": str(project), "run_dir": str(tmp_path / name),
            "config": {"epochs": 2, "step_delay_s": delay},
            "resources": {"tasks_per_node": 1, "cpus_per_task": 1, "mem_gb": 1, "timeout_min": 10},
            "slurm": {"partition": "low", "signal_delay_s": 60}, "env": {"OMP_NUM_THREADS": "1"}}))
    assert "as local job" in elfes(None, "submit", str(specs["straight"]), "--executor", "local").stdout
    assert "as slurm job" in elfes(slurm_user_signal, "submit", str(specs["edited"]), "--executor", "slurm").stdout
    run_dir = tmp_path / "edited"
    wait_run(run_dir, lambda: training_from(run_dir, 2), "attempt 1 to train to step 2")
    set_scale(project, 3.0)  # the author edits the code while the job runs
    elfes(slurm_user_signal, "preempt", str(run_dir))
    state = wait_ended(run_dir, "finished")
    assert outcomes(state) == [("requeued", "SIGUSR2", "submit"), ("finished", None, "requeue")], diagnostics(run_dir)
    assert "SCALE = 1.0" in RunPaths(run_dir).rank_log(2, 0).read_text()  # the submitted code, not the edit
    snapshot = str(RunPaths(run_dir).code / "1")
    assert [attempt.provenance.code.path for attempt in state.attempts] == [snapshot, snapshot]
    assert all(attempt.provenance.threads == 1 and attempt.provenance.torch for attempt in state.attempts)
    wait_ended(tmp_path / "straight", "finished")
    assert_runs_bitwise_equal(run_dir, tmp_path / "straight")


def test_preempted_with_plain_sigterm_waits_and_is_requeued_by_slurm_bitwise(
    slurm_plain_sigterm: SlurmCluster, tmp_path: Path, reference: Callable[[int], Path]
):
    """Without `preempt_send_user_signal` the preempted job gets SIGTERM: it saves `last` and stays alive
    (a job that exits during GraceTime is not requeued; `elfes resume` is refused meanwhile), SLURM kills it
    at the end of GraceTime and requeues it, and the relaunch resumes to the uninterrupted run's end."""
    slurm = slurm_plain_sigterm
    expected = reference(1)
    run_dir = submit(slurm, tmp_path, "plain-sigterm", cpus_per_task=2)
    wait_run(run_dir, lambda: training_from(run_dir, 2), "attempt 1 to train to step 2")
    preempt_with_a_high_job(slurm, tmp_path)
    preempted = time.time()
    job_id = state_of(run_dir).job_id

    wait_run(run_dir, lambda: state_of(run_dir).attempts[0].ended, "attempt 1 to save `last` and record its end")
    assert RunPaths(run_dir).last.exists() and queue(slurm, job_id).startswith("RUNNING")
    refused = elfes(slurm, "resume", str(run_dir), check=False)
    assert refused.returncode == 3 and f"SLURM job {job_id} of this run is still RUNNING" in refused.stderr
    assert any(f"SLURM job {job_id} is still RUNNING: it saved `last`" in note for note in status(slurm, run_dir)["notes"])
    log = RunPaths(run_dir).rank_log(1, 0)
    wait_run(run_dir, lambda: "waiting for SLURM to end the job" in log.read_text(), "the saved job to wait")
    # At the end of GraceTime SLURM kills and requeues it; `elfes status` tells so before the relaunch starts.
    report = wait_run(run_dir, lambda: (r := status(slurm, run_dir))["status"] != "stopped" and r,
                      "elfes status to show that SLURM requeued the job")
    assert report["attempts"][0]["outcome"] == "requeued" and report["restart_count"] == 1, report
    assert report["status"] in ("requeued", "running"), report  # "running" once the relaunch recorded itself
    wait_run(run_dir, lambda: len(state_of(run_dir).attempts) == 2, "SLURM's relaunch to start attempt 2")
    state = wait_ended(run_dir, "finished")

    assert outcomes(state) == [("requeued", "SIGTERM", "submit"), ("finished", None, "requeue")]
    assert 2 <= state.attempts[0].step < PLANNED_STEPS and state.attempts[1].step == PLANNED_STEPS
    # SLURM, not the job, requeued it: only after GraceTime (and the job never said it requeued itself).
    assert started_at(state.attempts[1]) - preempted >= slurm.grace_time_s
    assert "ended stopped (SIGTERM)" in log.read_text() and "requeued SLURM job" not in log.read_text()
    assert {attempt.job_id for attempt in state.attempts} == {job_id} and state.requeues_used == 1
    assert_bitwise_equal_to(run_dir, expected, 1)


def test_time_limit_requeues_before_the_limit_and_a_cancelled_job_stays_cancelled_then_resumes(
    slurm: SlurmCluster, tmp_path: Path, reference: Callable[[int], Path]
):
    """Two one-CPU jobs side by side (one test, to keep the suite short).

    Time limit: a 3-minute limit with `--signal=USR2@140`, and a first attempt whose training would take
    longer than the limit (16 steps of 2 batches, 6 s each): USR2 comes before the limit, the job saves,
    requeues itself (it never ends TIMEOUT), and its relaunch (a fresh limit, full speed; on a loaded machine
    requeued the same way again, its USR2 coming 40 s after it starts) finishes bitwise.

    Cancel: `elfes cancel` (a marker, then scancel) sends SIGTERM; `last` is saved within KillWait, the job
    ends CANCELLED and is not requeued; `elfes resume` submits it again and it finishes bitwise."""
    expected = reference(1)
    limit_s = 180
    timed = submit(slurm, tmp_path, "time-limit", timeout_min=limit_s // 60, signal_delay_s=140, step_delay_s=6.0)
    cancelled = submit(slurm, tmp_path, "cancelled")

    wait_run(cancelled, lambda: training_from(cancelled, 2), "attempt 1 to train to step 2")
    job_id = state_of(cancelled).job_id
    assert f"SLURM job {job_id} (scancel)" in elfes(slurm, "cancel", str(cancelled)).stdout
    state = wait_ended(cancelled, "cancelled")
    assert outcomes(state) == [("cancelled", "SIGTERM", "submit")] and 2 <= state.attempts[0].step < PLANNED_STEPS
    assert RunPaths(cancelled).last.exists()
    wait_for(lambda: queue(slurm, job_id) == "", timeout_s=slurm.kill_wait_s + 60, what=f"job {job_id} to leave the queue")
    assert accounted(slurm, job_id) == "CANCELLED" and len(state_of(cancelled).attempts) == 1  # never came back
    assert "resumed as slurm job" in elfes(slurm, "resume", str(cancelled)).stdout

    state = wait_ended(timed, "finished", timeout_s=2 * RUN_TIMEOUT_S)
    # Every attempt gets USR2 140 s before its limit, 40 s after it starts: on a loaded machine a relaunch may
    # not finish in those 40 s either, and requeues itself again (never TIMEOUT) to finish in the next.
    *requeued, last = outcomes(state)
    assert requeued[:1] == [("requeued", "SIGUSR2", "submit")] and last == ("finished", None, "requeue"), requeued
    assert all(outcome == ("requeued", "SIGUSR2", "requeue") for outcome in requeued[1:]), requeued
    for attempt in state.attempts[:-1]:
        assert ended_at(attempt) - started_at(attempt) < limit_s - 60, "USR2 came at the limit, not before it"
    first = state.attempts[0]
    assert 0 <= first.step < PLANNED_STEPS and state.attempts[-1].step == PLANNED_STEPS
    signalled = [e for e in events(timed) if e["event"] in ("stop_signal", "stop_requested")][0]
    assert signalled["signal"] == "SIGUSR2"
    # The accounting database learns of the job's end after the run's state.json does (the batch script's exit,
    # the epilogue, slurmdbd's queue): wait for a final state, then read which.
    final = wait_for(lambda: final_accounted(slurm, state.job_id), timeout_s=slurm.kill_wait_s + 180, interval_s=1.0,
                     what=f"sacct to record the end of job {state.job_id}")
    assert final == "COMPLETED", f"sacct: job {state.job_id} ended {final}, not COMPLETED"
    assert_bitwise_equal_to(timed, expected, 1)

    state = wait_ended(cancelled, "finished")
    assert outcomes(state) == [("cancelled", "SIGTERM", "submit"), ("finished", None, "resume")]
    assert state.attempts[1].job_id != job_id and state.requeues_used == 0
    assert_bitwise_equal_to(cancelled, expected, 1)


def doctor(cluster: SlurmCluster, *argv: str) -> dict[str, Any]:
    report = json.loads(elfes(cluster, "doctor", *argv, "--json").stdout)
    report["by_topic"] = {}
    for finding in report["findings"]:
        report["by_topic"].setdefault(finding["topic"], []).append(finding)
    return report


def test_doctor_tells_what_preemption_time_limit_and_cancel_do_in_both_configurations(
    slurm: SlurmCluster, tmp_path: Path
):
    spec = write_spec(tmp_path, "doctored", signal_delay_s=60)
    if not slurm.user_signal:
        slurm.reconfigure(user_signal=True)
    report = doctor(slurm, str(spec), "--test-job")
    topics = report["by_topic"]
    assert report["partition"] == "low" and report["settings"]["partition.GraceTime"] == str(slurm.grace_time_s)
    assert "gets USR2 (preempt_send_user_signal is set)" in topics["preemption"][0]["says"]
    assert topics["preemption"][0]["level"] == "ok" and topics["preemption"][0]["change"] is None
    budget = slurm.grace_time_s + slurm.kill_wait_s
    assert f"= {budget} s to save before SIGKILL" in topics["grace time"][0]["says"]
    assert f"SIGKILL KillWait ({slurm.kill_wait_s} s) later" in topics["cancel"][0]["says"]
    assert "JobRequeue=1" in topics["requeue"][0]["says"]
    assert "USR2 comes 60 s (slurm.signal_delay_s) before the 10 min limit" in topics["time limit"][0]["says"]
    assert topics["save time"][0]["level"] == "note"  # nothing measured yet
    assert topics["scontrol in a job"][0]["level"] == "ok", topics["scontrol in a job"]
    assert not [finding for finding in report["findings"] if finding["level"] == "problem"]

    # An earlier attempt recorded a save longer than signal_delay_s (and than KillWait and the grace budget).
    paths = RunPaths(tmp_path / "doctored")
    paths.run_dir.mkdir()
    paths.events.write_text("".join(json.dumps(event) + "\n" for event in (
        {"event": "stop_signal", "time": "2026-01-01T00:00:00+00:00", "signal": "SIGTERM"},
        {"event": "checkpoint", "time": "2026-01-01T00:01:15+00:00", "reason": "stop", "duration_s": 70.0},
    )))
    slurm.reconfigure(user_signal=False)
    report = doctor(slurm, str(spec))
    topics = report["by_topic"]
    assert "gets SIGTERM (preempt_send_user_signal is not set)" in topics["preemption"][0]["says"]
    assert "preempt_send_user_signal" in topics["preemption"][0]["change"]
    problems = {finding["topic"]: finding for finding in report["findings"] if finding["level"] == "problem"}
    assert set(problems) == {"grace time", "cancel", "save time"}, problems
    assert "a stop took 75.0 s" in problems["save time"]["says"]
    assert problems["save time"]["change"] == "set slurm.signal_delay_s to at least 160"
    assert "--test-job" in topics["scontrol in a job"][0]["change"]

    # Without a spec: the default partition, no job-specific findings. `high` is not preempted; an unknown
    # partition is named with the ones that exist.
    anyone = doctor(slurm)
    assert anyone["partition"] == "low" and "time limit" not in anyone["by_topic"] and anyone["job"] is None
    high = json.loads(spec.read_text())
    high["slurm"]["partition"] = "high"
    (tmp_path / "high.yaml").write_text(json.dumps(high))
    assert "not preempted (PreemptMode=OFF)" in doctor(slurm, str(tmp_path / "high.yaml"))["by_topic"]["preemption"][0][
        "says"]
    # --set changes the spec doctor reads, as for the other verbs (here: another partition, a longer signal delay).
    changed = doctor(slurm, str(spec), "--set", "slurm.partition=high", "--set", "slurm.signal_delay_s=200")
    assert changed["partition"] == "high" and "not preempted (PreemptMode=OFF)" in changed["by_topic"]["preemption"][0][
        "says"]
    assert "USR2 comes 200 s (slurm.signal_delay_s)" in changed["by_topic"]["time limit"][0]["says"]
    high["slurm"]["partition"] = "nowhere"
    (tmp_path / "nowhere.yaml").write_text(json.dumps(high))
    unknown = elfes(slurm, "doctor", str(tmp_path / "nowhere.yaml"), check=False)
    assert unknown.returncode == 2 and "slurm.partition = 'nowhere': no such partition (partitions: high, low, shared)" in (
        unknown.stderr)
