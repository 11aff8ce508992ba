"""Failed and hung attempts on a real (private) SLURM cluster: rank 1 raises at step 7 in the first attempt
and sleeps for good at step 7 in the second; each time the first rank that failed (or whose hang watchdog
fired) records it and runs `scontrol requeue`, SLURM starts the same job id again, and the third attempt
resumes from `last` and ends bitwise equal to an uninterrupted run. The rules and the local executor's
part: tests/launcher/test_failure_rules.py and test_failure_retries.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from cluster import SlurmCluster
from test_slurm_preemption import (
    CONFIG,
    PLANNED_STEPS,
    assert_bitwise_equal_to,
    diagnostics,
    elfes,
    outcomes,
    reference,  # noqa: F401 (the module's fixture)
    wait_ended,
    write_spec,
)

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
