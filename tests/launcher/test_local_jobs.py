"""End to end on the local executor: real jobs through `elfes submit`, `preempt`, `cancel`, `resume`.

Every job is a real submitit local job (a detached controller and one process per rank, gloo between
ranks); the tests wait on what the job writes (state.json, pid files, events.jsonl), never on bare
sleeps. Interrupted runs end bitwise equal (torch.equal on every tensor of the final checkpoint and of
the exported model) to an uninterrupted run of the same spec.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from local_runs import (
    CONFIG,
    PLANNED_STEPS,
    STEP_DELAY_S,
    Runs,
    events,
    outcomes,
    preempt,
    tasks_running,
    trained_to,
    wait_ended,
    wait_for,
)
from run_comparison import assert_runs_bitwise_equal

from elfes.launcher.cli.main import main as elfes
from elfes.launcher.rundir.paths import RunPaths


# -- the tests --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tasks", [1, 2])
def test_preempted_twice_resumes_bitwise(runs: Runs, references: Callable[[int], Path], tasks: int) -> None:
    """`elfes preempt` mid-training and again while the relaunch imports torch: each time the job
    saves `last`, is relaunched by itself and resumes; the end is bitwise the uninterrupted run's."""
    reference = references(tasks)
    run_dir = runs.submit(f"preempted-{tasks}", tasks=tasks)

    wait_for(lambda: tasks_running(run_dir, 1, tasks) and trained_to(run_dir, 2),
             what="attempt 1 to train to step 2", run_dir=run_dir)
    preempt(run_dir)  # mid-training: stops at the end of the current window
    # The relaunch's ranks record their pids once their handlers are in, before the engine import.
    wait_for(lambda: tasks_running(run_dir, 2, tasks), what="attempt 2 to start", run_dir=run_dir)
    preempt(run_dir)  # during the import: the handlers keep the signal for the StopRequest
    state = wait_ended(run_dir, "finished")

    assert outcomes(state) == [("requeued", "SIGUSR2", "submit"), ("requeued", "SIGUSR2", "requeue"),
                               ("finished", None, "requeue")]
    assert [attempt.number for attempt in state.attempts] == [1, 2, 3]
    assert state.requeues_used == 2 and state.requeues_left == 3
    saved = [attempt.step for attempt in state.attempts]
    # The second signal came before training resumed: the trainer stopped at its first boundary.
    assert 2 <= saved[0] <= saved[1] <= saved[0] + 1 and saved[2] == PLANNED_STEPS // tasks, saved
    assert "SIGUSR2 arrived while the engine was being imported" in RunPaths(run_dir).rank_log(2, 0).read_text()
    assert all(attempt.world_size == tasks for attempt in state.attempts)
    assert len({attempt.job_id for attempt in state.attempts}) == 1  # relaunched by submitit's controller
    starts = [e for e in events(run_dir) if e["event"] in ("started", "resumed")]
    assert [e["event"] for e in starts] == ["started", "resumed", "resumed"]
    assert {e["world_size"] for e in starts} == {tasks}  # one gloo group of all the tasks, every attempt
    for attempt in (1, 2, 3):
        for rank in range(tasks):
            log = RunPaths(run_dir).rank_log(attempt, rank, "out").read_text()
            assert f"elfes: attempt {attempt} " in log
            # the runtime's lines carry a time and a level (launcher/job/job_log.py)
            stamped = rf"^\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d,\d{{3}} INFO elfes: attempt {attempt} "
            assert re.search(stamped, log, re.M), log
    assert wait_ended(reference, "finished").attempts[-1].step == PLANNED_STEPS // tasks
    assert_runs_bitwise_equal(run_dir, reference)


def test_cancel_then_resume(runs: Runs, references: Callable[[int], Path]) -> None:
    """`elfes cancel` saves `last` and ends the run cancelled (not requeued); `elfes resume` continues
    it to the uninterrupted run's exact end."""
    reference = references(1)
    run_dir = runs.submit("cancelled")
    wait_for(lambda: tasks_running(run_dir, 1, 1) and trained_to(run_dir, 2),
             what="attempt 1 to train to step 2", run_dir=run_dir)
    assert elfes(["cancel", str(run_dir)]) == 0
    state = wait_ended(run_dir, "cancelled")
    assert outcomes(state) == [("cancelled", "SIGTERM", "submit")]
    assert 2 <= state.attempts[0].step < PLANNED_STEPS
    assert RunPaths(run_dir).last.exists()

    assert elfes(["resume", str(run_dir)]) == 0
    state = wait_ended(run_dir, "finished")
    assert outcomes(state) == [("cancelled", "SIGTERM", "submit"), ("finished", None, "resume")]
    assert state.attempts[1].number == 2 and state.requeues_used == 0
    assert [s.kind for s in state.submissions] == ["submit", "resume"]
    wait_ended(reference, "finished")
    assert_runs_bitwise_equal(run_dir, reference)


def test_failing_entrypoint_is_retried_once_and_then_failed(runs: Runs) -> None:
    """An exception in user code fails the attempt with its message; a crash before the first update is
    retried once (requeue.max_failures), and a second one in a row ends the run failed, not retried."""
    run_dir = runs.submit("failing", tasks=2, entrypoint="tests.launcher.entrypoints:failing")
    state = wait_ended(run_dir, "failed")
    assert outcomes(state) == [("failed", None, "submit"), ("failed", None, "requeue")]
    assert state.error.startswith("RuntimeError: the data folder /nonexistent/")
    assert state.error.endswith("failed twice before its first update: not retried")
    assert state.requeues_used == 0 and state.failures_used == 1
    assert not RunPaths(run_dir).attempt_logs(3).exists()  # no third start
    status = json.loads(_captured_status(run_dir))
    assert status["status"] == "failed" and "the data folder /nonexistent/" in status["error"]


def _captured_status(run_dir: Path) -> str:
    import contextlib
    import io

    stream = io.StringIO()
    with contextlib.redirect_stdout(stream):
        assert elfes(["status", str(run_dir), "--json"]) == 0
    return stream.getvalue()


def test_requeue_cap_holds(runs: Runs, references: Callable[[int], Path]) -> None:
    """With requeue.max_requeues: 1, the first preemption requeues and the second stops the run
    (`last` saved, the reason recorded); `elfes resume` then finishes it exactly."""
    reference = references(1)
    run_dir = runs.submit("capped", max_requeues=1)
    wait_for(lambda: tasks_running(run_dir, 1, 1) and trained_to(run_dir, 2),
             what="attempt 1 to train to step 2", run_dir=run_dir)
    preempt(run_dir)
    wait_for(lambda: tasks_running(run_dir, 2, 1), what="attempt 2 to start", run_dir=run_dir)
    preempt(run_dir)
    state = wait_ended(run_dir, "stopped")
    assert outcomes(state) == [("requeued", "SIGUSR2", "submit"), ("stopped", "SIGUSR2", "requeue")]
    assert state.requeues_used == 1 and state.requeues_left == 0
    assert "requeue limit reached (1 of requeue.max_requeues=1 used)" in state.error
    assert state.attempts[1].step is not None and state.attempts[1].step < PLANNED_STEPS

    assert elfes(["resume", str(run_dir)]) == 0
    state = wait_ended(run_dir, "finished")
    assert [a.outcome for a in state.attempts] == ["requeued", "stopped", "finished"]
    wait_ended(reference, "finished")
    assert_runs_bitwise_equal(run_dir, reference)


def test_command_job_pauses_and_resumes(runs: Runs, references: Callable[[int], Path]) -> None:
    """A `command:` job gets the requeue signal forwarded (once its own handlers catch it, even when it
    arrives while the command imports torch), exits 128 + SIGUSR2 after saving, is relaunched and
    resumes; a cancel forwards SIGTERM. The end is bitwise the entrypoint job's uninterrupted run."""
    reference = references(1)
    command = ["{python}", "-m", "tests.launcher.command_train", "--run-dir", "{run_dir}",
               "--epochs", str(CONFIG["epochs"]), "--train-samples", str(CONFIG["train_samples"]),
               "--step-delay-s", str(STEP_DELAY_S)]
    run_dir = runs.submit("command", entrypoint=None, command=command, config={})
    wait_for(lambda: tasks_running(run_dir, 1, 1) and trained_to(run_dir, 2),
             what="attempt 1 to train to step 2", run_dir=run_dir)
    preempt(run_dir)
    wait_for(lambda: tasks_running(run_dir, 2, 1), what="attempt 2 to start", run_dir=run_dir)
    preempt(run_dir)  # the command is starting: the runtime holds the signal until the command catches it
    # Attempt 3 resumed (the third start record): cancel it while most of the run is still ahead.
    wait_for(lambda: tasks_running(run_dir, 3, 1) and
             [e["event"] for e in events(run_dir)].count("resumed") == 2, what="attempt 3 to resume", run_dir=run_dir)
    assert elfes(["cancel", str(run_dir)]) == 0
    state = wait_ended(run_dir, "cancelled")
    assert outcomes(state) == [("requeued", "SIGUSR2", "submit"), ("requeued", "SIGUSR2", "requeue"),
                               ("cancelled", "SIGTERM", "requeue")]
    steps = [attempt.step for attempt in state.attempts]
    assert 2 <= steps[0] <= steps[1] <= steps[0] + 1 and steps[1] <= steps[2] < PLANNED_STEPS, steps

    assert elfes(["resume", str(run_dir)]) == 0
    state = wait_ended(run_dir, "finished")
    assert state.attempts[-1].outcome == "finished" and state.attempts[-1].step == PLANNED_STEPS
    wait_ended(reference, "finished")
    assert_runs_bitwise_equal(run_dir, reference)


def test_local_requeues_past_six_starts_resubmit(runs: Runs) -> None:
    """submitit's local controller starts a job at most six times: the seventh start is a resubmission
    into the same run directory (a new job id), still counted as a requeue. Torch-free command, fast."""
    finish_now = runs.folder / "counting-finishes"  # the count ends when the test says, never before a preempt
    command = ["{python}", "-m", "tests.launcher.protocol_command", "--run-dir", "{run_dir}", "--units", "100000",
               "--unit-s", "0.01", "--finish-when", str(finish_now)]
    run_dir = runs.submit("counting", entrypoint=None, command=command, config={}, max_requeues=7)
    for attempt in range(1, 8):
        wait_for(lambda attempt=attempt: tasks_running(run_dir, attempt, 1), what=f"attempt {attempt} to start",
                 run_dir=run_dir)
        preempt(run_dir)
    wait_for(lambda: tasks_running(run_dir, 8, 1), what="attempt 8 to start", run_dir=run_dir)
    finish_now.touch()
    state = wait_ended(run_dir, "finished")
    assert [a.outcome for a in state.attempts] == ["requeued"] * 7 + ["finished"]
    assert [a.launch for a in state.attempts] == ["submit"] + ["requeue"] * 7
    assert state.requeues_used == 7 and state.requeues_left == 0
    assert [s.kind for s in state.submissions] == ["submit", "requeue"]
    first, second = state.submissions[0].job_id, state.submissions[1].job_id
    assert [a.job_id for a in state.attempts] == [first] * 6 + [second] * 2
    assert (run_dir / "count.txt").read_text() == "100000"


def test_cancel_before_the_handlers_are_in_still_cancels(runs: Runs) -> None:
    """A cancel marker left while the job was between starts makes the next start stop at once
    (saving `last`), so a cancel is never lost to a relaunch."""
    command = [sys.executable, "-m", "tests.launcher.counting_command", "--run-dir", "{run_dir}", "--units", "100000"]
    run_dir = runs.submit("cancel-early", entrypoint=None, command=command, config={})
    paths = RunPaths(run_dir)
    wait_for(lambda: tasks_running(run_dir, 1, 1), what="attempt 1 to start", run_dir=run_dir)
    # The command counts only once the runtime has looked for a marker and started it; a marker left
    # before that look cancels attempt 1 itself (also right, but not what this test is about).
    wait_for(lambda: (run_dir / "count.txt").exists(), what="attempt 1's command to count", run_dir=run_dir)
    paths.cancel_marker.write_text("{}\n")  # as `elfes cancel` leaves it, without the signal
    preempt(run_dir)  # the requeue goes ahead; the relaunch sees the marker
    state = wait_ended(run_dir, "cancelled")
    assert outcomes(state) == [("requeued", "SIGUSR2", "submit"), ("cancelled", "SIGTERM", "requeue")]
