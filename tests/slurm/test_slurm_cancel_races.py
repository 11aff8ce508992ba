"""`elfes cancel` against a requeue on a real (private) SLURM cluster: a cancel wins, and a run never wedges.

Small `command:` jobs (no torch) whose command takes SAVE_S to "save" on its first stop signal, as a
trainer does at its window boundary. A requeue and a cancel meet in three ways:

- `elfes cancel` right after `elfes preempt`, at several delays: before rank 0's `scontrol requeue` (rank 0
  sees the cancel marker and does not requeue), during the requeue, or once the job is pending again.
  Every timing ends with the run cancelled, the job out of the queue, and the run resumable;
- the requeue lands after the cancel (`scontrol requeue` also requeues a job that `scancel` is ending, or
  has ended): the job comes back, its attempt sees the marker, ends cancelled and `scancel`s the job;
- the cancel lands during the requeue: SLURM (22.05) forgets the job while `sacct` says REQUEUED for good;
  `elfes status` trusts squeue (cancelled, not "requeued"), and `elfes resume` and `elfes submit` work.

And a node that fails while the job runs (its processes and slurmd killed, the node set DOWN): SLURM
requeues the job, and `elfes status` shows it requeued and pending with SLURM's reason, not running.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from cluster import SlurmCluster, wait_for

from elfes.launcher.commands.signalling import cancel, preempt
from elfes.launcher.rundir import state as run_state
from elfes.launcher.rundir.liveness import liveness
from elfes.launcher.rundir.paths import RunPaths
from elfes.launcher.slurm import queue_entry

ELFES = str(Path(sys.executable).with_name("elfes"))
REPOSITORY = Path(__file__).resolve().parents[2]
SAVE_S = 1.5  # the command's "save" on its first stop signal
# Seconds from `elfes preempt` to `elfes cancel`: during the save (before the requeue), about when rank 0
# requeues, and after it (the job pending again).
CANCEL_DELAYS_S = (0.0, 0.8, 1.6, 2.4)
END_TIMEOUT_S = 90.0  # to the job out of the queue: a relaunch (~12 s after a requeue) and its start, loaded
SAVING = (
    "import signal, sys, time\n"
    "first = []\n"
    "def stop(signum, frame):\n"
    "    if first:\n"
    "        return  # saving already: a later signal changes nothing\n"
    "    first.append(signum)\n"
    "    print('saving', flush=True)\n"
    f"    time.sleep({SAVE_S})\n"
    "    sys.exit(128 + signum)\n"
    "signal.signal(signal.SIGTERM, stop)\n"
    "signal.signal(signal.SIGUSR2, stop)\n"
    "print('waiting', flush=True)\n"
    "time.sleep(600)\n"
)


def write_spec(folder: Path, name: str) -> Path:
    spec = folder / f"{name}.yaml"
    spec.write_text(json.dumps({
        "name": name, "command": ["{python}", "-c", SAVING], "run_dir": str(folder / name),
        "resources": {"tasks_per_node": 1, "timeout_min": 10, "mem_gb": 0.5},
        "slurm": {"partition": "low", "signal_delay_s": 60}, "requeue": {"max_requeues": 3},
        "env": {"PYTHONPATH": str(REPOSITORY)},
    }))
    return spec


def elfes(cluster: SlurmCluster, *argv: str) -> subprocess.CompletedProcess:
    completed = subprocess.run([ELFES, *argv], env=cluster.env, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, f"elfes {' '.join(argv)} exited {completed.returncode}: {completed.stderr}"
    return completed


def status(cluster: SlurmCluster, run_dir: Path) -> dict[str, Any]:
    return json.loads(elfes(cluster, "status", str(run_dir), "--json").stdout)


def state_of(run_dir: Path) -> run_state.RunState | None:
    return run_state.load_state(RunPaths(run_dir))


def log_of(run_dir: Path, attempt: int) -> str:
    log = RunPaths(run_dir).rank_log(attempt, 0)
    return log.read_text() if log.exists() else ""


def diagnostics(run_dir: Path) -> str:
    paths = RunPaths(run_dir)
    files = [paths.state, *sorted(paths.logs.glob("attempt-*/rank-*.*")), *sorted(paths.submitit.glob("*_log.*"))]
    return "\n".join(f"--- {file} ---\n{file.read_text(errors='replace')[-2000:]}" for file in files if file.is_file())


def wait_run(run_dir: Path, condition, what: str, timeout_s: float = END_TIMEOUT_S) -> Any:
    try:
        return wait_for(condition, timeout_s=timeout_s, what=what, interval_s=0.2)
    except TimeoutError as error:
        pytest.fail(f"{error}\nSLURM: {queue_entry(str(state_of(run_dir).job_id))}\n{diagnostics(run_dir)}")


def submit_waiting(cluster: SlurmCluster, folder: Path, name: str) -> tuple[Path, str]:
    """Submit the job, wait until its command catches the stop signals; returns (run_dir, job_id)."""
    assert "as slurm job" in elfes(cluster, "submit", str(write_spec(folder, name)), "--executor", "slurm").stdout
    run_dir = folder / name
    wait_run(run_dir, lambda: "waiting" in log_of(run_dir, 1), f"{name}: attempt 1's command to wait")
    return run_dir, str(state_of(run_dir).job_id)


def ended_for_good(run_dir: Path) -> bool:
    """The run's status (as `elfes status` sees it) is cancelled and SLURM holds no job of it."""
    paths = RunPaths(run_dir)
    state = state_of(run_dir)
    live = liveness(paths, state)
    from elfes.launcher.rundir.liveness import effective_state

    return live.alive is False and effective_state(paths, state, live).status == "cancelled"


def accounted(cluster: SlurmCluster, job_id: str) -> str:
    lines = cluster.run("sacct", "-n", "-X", "-P", "-o", "State", "-j", job_id, check=False).stdout.split()
    return lines[0] if lines else ""


def queued(cluster: SlurmCluster, job_id: str) -> str:
    """squeue's state of the job ("" once the controller no longer has it or it has ended)."""
    shown = cluster.run("squeue", "-h", "-j", job_id, "-o", "%T", check=False).stdout.strip()
    return "" if shown in ("COMPLETED", "CANCELLED", "FAILED") else shown


def resume_then_cancel(cluster: SlurmCluster, run_dirs: list[Path]) -> None:
    """Each run resumes (a new job, a new attempt) and is then cancelled for good."""
    for run_dir in run_dirs:
        assert "resumed as slurm job" in elfes(cluster, "resume", str(run_dir)).stdout, run_dir
    for run_dir in run_dirs:
        elfes(cluster, "cancel", str(run_dir))
    for run_dir in run_dirs:
        wait_run(run_dir, lambda run_dir=run_dir: ended_for_good(run_dir), f"{run_dir.name}: the resumed job cancelled")


# -- the tests -----------------------------------------------------------------------------------------------------
def test_cancel_right_after_preempt_wins_at_every_timing(slurm_env: SlurmCluster, tmp_path: Path):
    """`elfes preempt`, then `elfes cancel` after each delay: whatever phase it hits (the save, rank 0's
    `scontrol requeue`, the pending requeue), the run ends cancelled, no job of it stays queued or
    running (none idles until its time limit), and the run can be resumed."""
    slurm, run_dirs, phases = slurm_env, [], {}
    for delay in CANCEL_DELAYS_S:
        run_dir, job_id = submit_waiting(slurm, tmp_path, f"delay-{delay}")
        preempt(run_dir)
        time.sleep(delay)  # the timing under test, not a wait for a condition
        cancel(run_dir)
        wait_run(run_dir, lambda run_dir=run_dir: ended_for_good(run_dir),
                 f"delay {delay}: the run cancelled, its job out of the queue")
        state = state_of(run_dir)
        phases[delay] = ([(a.outcome, a.signal) for a in state.attempts], accounted(slurm, job_id))
        assert queued(slurm, job_id) == "", phases[delay]
        assert state.attempts[0].outcome in ("cancelled", "requeued"), phases[delay]
        assert all(attempt.outcome == "cancelled" for attempt in state.attempts[1:]), phases[delay]
        if state.attempts[0].outcome == "cancelled":  # rank 0 saw the marker: no requeue
            assert "requeued SLURM job" not in log_of(run_dir, 1) and len(state.attempts) == 1, phases[delay]
        run_dirs.append(run_dir)
    print(f"cancel after preempt, by delay: {phases}")
    # The earliest cancel landed during the save: rank 0 saw the marker before `scontrol requeue`.
    assert phases[CANCEL_DELAYS_S[0]][0] == [("cancelled", "SIGUSR2")], phases
    resume_then_cancel(slurm, run_dirs)


def test_a_cancelled_job_that_slurm_requeues_anyway_cancels_itself(slurm_env: SlurmCluster, tmp_path: Path):
    """`scontrol requeue` also requeues a job that `scancel` ended or is ending (as rank 0's own requeue does
    when it lands just after `elfes cancel`): the job comes back, its attempt sees the cancel marker, ends
    cancelled, `scancel`s the job and exits, so the allocation is released at once and the job stays CANCELLED
    (before, the attempt waited for SLURM to end it: until the time limit)."""
    slurm = slurm_env
    run_dir, job_id = submit_waiting(slurm, tmp_path, "requeued-after-cancel")
    cancel(run_dir)
    wait_run(run_dir, lambda: state_of(run_dir).status == "cancelled" and queued(slurm, job_id) == "",
             "attempt 1 to end cancelled and its job to end")
    slurm.run("scontrol", "requeue", job_id)  # SLURM requeues a job that scancel ended
    wait_run(run_dir, lambda: len(state_of(run_dir).attempts) == 2, "SLURM's relaunch to start attempt 2")

    wait_run(run_dir, lambda: ended_for_good(run_dir) and queued(slurm, job_id) == "",
             "the relaunched, cancelled job to leave the queue (not to wait for its time limit)")
    state = state_of(run_dir)
    assert [(a.outcome, a.signal, a.launch) for a in state.attempts] == [
        ("cancelled", "SIGTERM", "submit"), ("cancelled", "SIGTERM", "requeue")], diagnostics(run_dir)
    assert f"elfes: cancelled SLURM job {job_id} (scancel" in log_of(run_dir, 2)
    assert "waiting for SLURM to end the job" not in log_of(run_dir, 2)
    wait_for(lambda: accounted(slurm, job_id) == "CANCELLED", timeout_s=30, what=f"sacct: job {job_id} CANCELLED")
    report = status(slurm, run_dir)
    assert report["status"] == "cancelled" and not report["notes"], report


def test_a_cancel_during_the_requeue_does_not_wedge_the_run(slurm_env: SlurmCluster, tmp_path: Path):
    """Two runs side by side. SLURM requeues each job (`scontrol requeue`, as rank 0 does) and `elfes cancel`
    lands while the requeue is under way: SLURM forgets the job, yet `sacct` says REQUEUED for good.
    `elfes status` says cancelled (the job is gone), `elfes cancel` has nothing left to do, and the runs go on:
    one with `elfes resume`, the other with `elfes submit` of the same spec."""
    slurm = slurm_env
    runs = [submit_waiting(slurm, tmp_path, name) for name in ("resumed", "resubmitted")]
    for run_dir, job_id in runs:
        slurm.run("scontrol", "requeue", job_id)
        cancel(run_dir)
    for run_dir, job_id in runs:
        # The premise (Slurm 22.05): the controller no longer has the job, its accounting says REQUEUED.
        wait_run(run_dir, lambda job_id=job_id: slurm.run("squeue", "-h", "-j", job_id, check=False).stdout == ""
                 and accounted(slurm, job_id) == "REQUEUED", f"job {job_id}: gone from squeue, REQUEUED in sacct")
        report = status(slurm, run_dir)
        assert (report["status"], report["queue_state"]) == ("cancelled", "GONE"), report
        assert report["queue_reason"] == "sacct still says REQUEUED", report
        assert "nothing to cancel" in elfes(slurm, "cancel", str(run_dir)).stdout

    (resumed, _), (resubmitted, _) = runs
    assert "resumed as slurm job" in elfes(slurm, "resume", str(resumed)).stdout
    submitted = elfes(slurm, "submit", str(tmp_path / "resubmitted.yaml"), "--executor", "slurm").stdout
    assert "resubmitted: continues as slurm job" in submitted
    for run_dir, job_id in runs:
        wait_run(run_dir, lambda run_dir=run_dir: "waiting" in log_of(run_dir, 2), f"{run_dir.name}: attempt 2 to run")
        state = state_of(run_dir)
        assert state.status == "running" and state.job_id != job_id, diagnostics(run_dir)
        assert state.attempts[0].outcome == "cancelled", diagnostics(run_dir)
    for run_dir, _ in runs:
        elfes(slurm, "cancel", str(run_dir))
    for run_dir, _ in runs:
        wait_run(run_dir, lambda run_dir=run_dir: ended_for_good(run_dir), f"{run_dir.name}: attempt 2 cancelled")


def test_a_job_requeued_after_its_node_failed_shows_requeued_and_pending(slurm_env: SlurmCluster, tmp_path: Path):
    """The node fails while attempt 1 runs (its processes and slurmd die; the node is set DOWN): SLURM
    requeues the job. `elfes status` says requeued, with squeue's PENDING, its reason and the restart
    count, and that attempt 1 never recorded its end; once the node is back the relaunch runs (attempt 1
    closed as lost) and `elfes cancel` ends it."""
    slurm = slurm_env
    run_dir, job_id = submit_waiting(slurm, tmp_path, "node-failure")
    with slurm.node_failure(job_id):
        before = wait_run(run_dir, lambda: (entry := queue_entry(job_id)).state == "PENDING" and entry.reason
                          and entry, "SLURM to requeue the job and say why it waits")
        report = status(slurm, run_dir)
        after = queue_entry(job_id)
        assert (report["status"], report["queue_state"], report["restart_count"]) == ("requeued", "PENDING", 1), report
        assert report["queue_reason"] in (before.reason, after.reason), (report, before, after)  # BeginTime first
        assert [a["outcome"] for a in report["attempts"]] == [None], report
        assert any(f"SLURM requeued job {job_id} (restart 1) while attempt 1 was running" in note
                   for note in report["notes"]), report
        assert state_of(run_dir).status == "running"  # status reads; it writes nothing

    wait_run(run_dir, lambda: "waiting" in log_of(run_dir, 2), "the relaunch on the restored node to run")
    state = state_of(run_dir)
    assert [(a.outcome, a.launch) for a in state.attempts] == [("lost", "submit"), (None, "requeue")]
    assert state.job_id == job_id and state.requeues_used == 1
    cancel(run_dir)
    wait_run(run_dir, lambda: ended_for_good(run_dir), "the relaunch cancelled")


def test_a_cancel_while_a_failure_is_requeued_ends_the_run_cancelled_in_state_json(slurm_env: SlurmCluster,
                                                                                   tmp_path: Path):
    """Attempt 1 failed and its retry is under way (the run "requeued", its job pending again, held here so that
    it stays so): `elfes cancel` takes the job, and since no attempt will record that, state.json itself says
    cancelled, as `elfes status` does; status offers what a cancelled run takes (`elfes resume`), with no note
    of a job gone "without recording its end"."""
    from elfes.files import write_text_atomically
    from elfes.launcher.spec import load_spec

    slurm = slurm_env
    paths = RunPaths(tmp_path / "retrying")
    paths.run_dir.mkdir()
    write_text_atomically(paths.spec, load_spec(write_spec(tmp_path, "retrying")).to_yaml())
    job_id = slurm.run("sbatch", "--parsable", "--hold", "-p", "low", "--wrap", "sleep 300",
                       f"--output={tmp_path / 'held.out'}").stdout.strip()
    token = f"{job_id}:0"
    for change in (lambda s: run_state.record_submission(s, executor="slurm", kind="submit", max_requeues=3,
                                                         run_dir=str(paths.run_dir)),
                   lambda s: run_state.mark_pending(s, job_id=job_id),
                   lambda s: run_state.begin_attempt(s, token=token, job_id=job_id, launch="submit",
                                                     hosts=["node"], world_size=1),
                   lambda s: run_state.end_attempt(s, token=token, outcome="failed", error="RuntimeError: boom",
                                                   failure=run_state.Failure("exception", "RuntimeError: boom", True))):
        run_state.update_state(paths, change)
    assert state_of(paths.run_dir).status == "requeued" and queued(slurm, job_id) == "PENDING"

    cancel(paths.run_dir)
    assert state_of(paths.run_dir).status == "cancelled"
    wait_run(paths.run_dir, lambda: queued(slurm, job_id) == "", f"job {job_id} to leave the queue")
    report = status(slurm, paths.run_dir)
    assert report["status"] == "cancelled", report
    assert not any("without recording its end" in note for note in report["notes"]), report
    shown = elfes(slurm, "status", str(paths.run_dir)).stdout
    assert "cancelled" in shown and "requeued" not in shown.replace("failed (retrying)", ""), shown
