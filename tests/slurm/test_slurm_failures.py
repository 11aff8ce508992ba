"""Failed and hung attempts on a real (private) SLURM cluster: rank 1 raises at step 7 in the first attempt
and sleeps for good at step 7 in the second; each time the first rank that failed (or whose hang watchdog
fired) records it and runs `scontrol requeue`, SLURM starts the same job id again, and the third attempt
resumes from `last` and ends bitwise equal to an uninterrupted run. The rules and the local executor's
part: tests/launcher/test_failure_rules.py and test_failure_retries.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from cluster import SlurmCluster, wait_for
from slurm_runs import (
    CONFIG,
    PLANNED_STEPS,
    assert_bitwise_equal_to,
    diagnostics,
    elfes,
    outcomes,
    wait_ended,
    write_spec,
)

from elfes.launcher.rundir import state as run_state
from elfes.launcher.rundir.paths import RunPaths


def test_a_failed_and_a_hung_attempt_requeue_themselves_and_resume_bitwise(
    slurm: SlurmCluster, tmp_path: Path, reference: Callable[[int], Path]  # noqa: F811
):
    tasks = 2
    expected = reference(tasks)
    spec_file = write_spec(tmp_path, "fails-once", tasks=tasks, step_delay_s=0.05)
    spec = json.loads(spec_file.read_text())
    spec["entrypoint"] = "tests.launcher.fault_entrypoints:raises_then_sleeps_at_step_7"
    spec["config"] = {**CONFIG, "step_delay_s": 0.05, "fault_rank": 1, "fault_attempts": [1, 2]}
    # One node: excluding it would leave the requeue nowhere to go (tests/slurm/test_two_hosts.py has that case).
    spec["requeue"] = {"max_requeues": 3, "max_failures": 2, "hang_timeout_s": 10, "exclude_failed_nodes": False}
    spec_file.write_text(json.dumps(spec))
    assert "as slurm job" in elfes(slurm, "submit", str(spec_file), "--executor", "slurm").stdout
    run_dir = tmp_path / "fails-once"

    state = wait_ended(run_dir, "finished")
    assert outcomes(state) == [("failed", None, "submit"), ("failed", None, "requeue"),
                               ("finished", None, "requeue")], diagnostics(run_dir)
    raised, hung = (attempt.failure for attempt in state.attempts[:2])
    assert raised.retried and (raised.cause, raised.rank, raised.step) == ("RuntimeError: the loss is NaN at step 7", 1, 7)
    assert hung.retried and hung.category == "hang" and hung.step == 7
    assert raised.nodes == hung.nodes == state.attempts[0].hosts and state.excluded_nodes == ()
    assert state.failures_used == 2 and state.requeues_used == 0
    for rank in range(tasks):  # every rank's stacks are in its log
        assert "elfes: hang: " in RunPaths(run_dir).rank_log(2, rank, "err").read_text()
    assert {attempt.job_id for attempt in state.attempts} == {state.job_id}  # SLURM started the same job again
    assert f"requeued SLURM job {state.job_id} (scontrol requeue)" in RunPaths(run_dir).rank_log(1, 1).read_text()
    assert state.attempts[2].step == PLANNED_STEPS // tasks
    assert_bitwise_equal_to(run_dir, expected, tasks)


def _job_tasks(run_dir: Path) -> list[int]:
    """The pids of the processes running the run's tasks (submitit's ``_submit`` of its folder), on this machine."""
    folder = str(RunPaths(run_dir).submitit).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"submitit.core._submit" in command and folder in command:
                found.append(int(entry.name))
    return found


def test_a_failure_not_retried_ends_the_whole_job_at_once(slurm: SlurmCluster, tmp_path: Path):
    """Rank 1 raises before the process group forms, and no retry is left (``max_failures: 0``): rank 0, waiting for it
    in the group's rendezvous, would never learn that it is gone. The deciding rank ends the job (scancel): rank 0 is
    stopped too, the allocation freed, and the run stays failed with rank 1's cause."""
    spec_file = write_spec(tmp_path, "fails-for-good", tasks=2, step_delay_s=0.05)
    spec = json.loads(spec_file.read_text())
    spec["entrypoint"] = "tests.launcher.fault_entrypoints:raises_before_the_group_forms"
    spec["config"] = {**CONFIG, "step_delay_s": 0.05, "fault_rank": 1}
    spec["requeue"] = {"max_requeues": 3, "max_failures": 0, "exclude_failed_nodes": False}
    spec_file.write_text(json.dumps(spec))
    assert "as slurm job" in elfes(slurm, "submit", str(spec_file), "--executor", "slurm").stdout
    run_dir = tmp_path / "fails-for-good"

    def failed() -> run_state.RunState | None:
        state = run_state.load_state(RunPaths(run_dir))
        return state if state is not None and state.status in run_state.ENDED else None

    state = wait_for(failed, timeout_s=240, what=f"the run to end\n{diagnostics(run_dir)}", interval_s=0.2)
    assert state.status == "failed", diagnostics(run_dir)
    failure = state.attempts[-1].failure
    assert failure is not None and not failure.retried and failure.rank == 1, diagnostics(run_dir)
    assert failure.cause == "RuntimeError: rank 1 cannot read its data"
    assert "failure limit reached" in (failure.reason or "")
    # Once the failure is recorded, the job leaves the queue and no task of it is left, within SLURM's kill time.
    job_id = str(state.job_id)
    wait_for(lambda: not slurm.run("squeue", "-h", "-j", job_id, check=False).stdout.strip(), timeout_s=60,
             what=f"SLURM job {job_id} to leave the queue\n{diagnostics(run_dir)}", interval_s=0.2)
    wait_for(lambda: not _job_tasks(run_dir), timeout_s=30, what="the job's tasks to end")
    state = run_state.load_state(RunPaths(run_dir))
    assert state is not None and state.status == "failed" and len(state.attempts) == 1, diagnostics(run_dir)
    shown = json.loads(elfes(slurm, "status", str(run_dir), "--json").stdout)
    assert shown["status"] == "failed" and "rank 1 cannot read its data" in shown["error"]
    assert f"ended SLURM job {job_id} (scancel" in RunPaths(run_dir).rank_log(1, 1).read_text()
