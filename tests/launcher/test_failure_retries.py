"""Past preemption, end to end on the local executor: a failed attempt is retried from `last`
(requeue.max_failures), a failure that repeats is not, and a hung rank is found by the hang watchdog
(requeue.hang_timeout_s), its stacks logged, its attempt killed and retried; every run that finishes
ends bitwise equal (torch.equal) to an uninterrupted run. The rules themselves are tested without jobs
in test_failure_rules.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest
from local_runs import CONFIG, Runs, diagnostics, events, wait_ended
from run_comparison import assert_runs_bitwise_equal

from elfes.launcher.cli.main import main as elfes
from elfes.launcher.rundir.paths import RunPaths

HANG_TIMEOUT_S = 10  # the hung run's requeue.hang_timeout_s: well past a step, even on a loaded machine


@pytest.fixture
def reference(references: Callable[[int], Path]) -> Callable[[], Path]:
    """The run directory of an uninterrupted 2-rank run (conftest.py's, shared by the session)."""
    return lambda: references(2)


def _status_json(run_dir: Path) -> dict:
    import contextlib
    import io

    stream = io.StringIO()
    with contextlib.redirect_stdout(stream):
        assert elfes(["status", str(run_dir), "--json"]) == 0
    return json.loads(stream.getvalue())


def test_a_failure_is_retried_from_last_and_one_that_repeats_is_not(runs: Runs, reference: Callable[[], Path]) -> None:
    """Rank 1 raises at step 7 in the first attempt only (requeue.max_failures: 1): the failure is retried
    from `last` and the run ends bitwise equal to a straight run. The same error at the same step in every
    attempt (max_failures: 3) ends the run failed after two attempts, with the cause."""
    straight = reference()
    config = {**CONFIG, "step_delay_s": 0.05, "fault_rank": 1}
    once = runs.submit("once", tasks=2, entrypoint="tests.launcher.fault_entrypoints:raises_at_step_7",
                       config={**config, "fault_attempts": [1]}, requeue={"max_requeues": 5, "max_failures": 1})
    always = runs.submit("always", tasks=2, entrypoint="tests.launcher.fault_entrypoints:raises_at_step_7",
                         config=config, requeue={"max_requeues": 5, "max_failures": 3})

    state = wait_ended(once, "finished")
    assert [(a.outcome, a.launch) for a in state.attempts] == [("failed", "submit"), ("finished", "requeue")], \
        diagnostics(once)
    failure = state.attempts[0].failure
    assert failure is not None and failure.retried and failure.category == "exception"
    assert (failure.cause, failure.rank, failure.step) == ("RuntimeError: the loss is NaN at step 7", 1, 7)
    assert state.failures_used == 1 and state.requeues_used == 0  # counted apart from the requeues
    status = _status_json(once)
    assert status["attempts"][0]["failure"]["retried"] is True and status["failures_used"] == 1
    wait_ended(straight, "finished")
    assert_runs_bitwise_equal(once, straight)

    state = wait_ended(always, "failed")
    assert [(a.outcome, a.launch) for a in state.attempts] == [("failed", "submit"), ("failed", "requeue")], \
        diagnostics(always)
    first, second = (attempt.failure for attempt in state.attempts)
    assert first.retried and not second.retried and second.reason == "failed twice at step 7: not retried"
    assert state.error.startswith("RuntimeError: the loss is NaN at step 7 (rank 1 on ")
    assert state.error.endswith("failed twice at step 7: not retried")
    status = _status_json(always)
    assert status["status"] == "failed" and "failed twice at step 7: not retried" in status["error"]


def _time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_a_hung_rank_is_killed_with_its_stacks_logged_and_retried(runs: Runs, reference: Callable[[], Path]) -> None:
    """Rank 1 sleeps for good at step 7 in the first attempt (requeue.hang_timeout_s: 10): no update boundary
    for 10 s, so every rank's stacks go to its log and the attempt is killed within the timeout plus the
    watchdog's grace, then retried; the run ends bitwise equal to a straight run. Meanwhile a job whose
    evaluations take longer than its hang timeout (a beat per batch) is never taken for hung."""
    from elfes.launcher.job.watchdog import GRACE_S, PEER_EXIT_S, POLL_S

    straight = reference()
    hung = runs.submit("hung", tasks=2, entrypoint="tests.launcher.fault_entrypoints:sleeps_at_step_7",
                       config={**CONFIG, "step_delay_s": 0.05, "fault_rank": 1, "fault_attempts": [1]},
                       requeue={"max_requeues": 5, "max_failures": 1, "hang_timeout_s": HANG_TIMEOUT_S})
    evaluating = runs.submit("evaluating", tasks=1, entrypoint="tests.launcher.fault_entrypoints:slow_evaluation",
                             config={**CONFIG, "validation_samples": 192, "eval_delay_s": 2.0},
                             requeue={"max_requeues": 5, "hang_timeout_s": 5})

    state = wait_ended(hung, "finished")
    assert [(a.outcome, a.launch) for a in state.attempts] == [("failed", "submit"), ("finished", "requeue")], \
        diagnostics(hung)
    failure = state.attempts[0].failure
    assert failure.category == "hang" and failure.retried and failure.step == 7, diagnostics(hung)
    assert failure.cause == f"hang: no update boundary within requeue.hang_timeout_s = {HANG_TIMEOUT_S} s"
    # attempt 1 logged step 6 first (attempt 2 trains it again)
    step_6 = min(_time(e["time"]) for e in events(hung) if e.get("event") == "train" and e.get("step") == 6)
    silent_s = _time(state.attempts[0].ended_at) - step_6
    assert HANG_TIMEOUT_S <= silent_s <= HANG_TIMEOUT_S + 2 * POLL_S + GRACE_S + PEER_EXIT_S, (silent_s,
                                                                                         diagnostics(hung))
    logs = RunPaths(hung).attempt_logs(1)
    for rank in (0, 1):
        text = (logs / f"rank-{rank}.err").read_text()
        assert "elfes: hang: " in text and "Thread 0x" in text, text  # faulthandler: every thread's stack
    sleeping = (logs / "rank-1.err").read_text()
    assert 'fault_entrypoints.py", line' in sleeping and " in fault" in sleeping, sleeping
    wait_ended(straight, "finished")
    assert_runs_bitwise_equal(hung, straight)

    state = wait_ended(evaluating, "finished")
    assert [a.outcome for a in state.attempts] == ["finished"], diagnostics(evaluating)
    durations = [e["duration_s"] for e in events(evaluating) if e.get("event") == "evaluation"]
    assert durations and max(durations) > 5, durations  # longer than the timeout, and not a hang


def test_a_healthy_run_with_every_slow_part_is_never_taken_for_hung(runs: Runs) -> None:
    """requeue.hang_timeout_s at 2x the step (2 s, steps of 1 s) and the run's slow parts, each past the old
    rules: rank 1 starts 20 s after rank 0 (which waits in the rendezvous meanwhile: the start-up has its own
    allowance, requeue.startup_timeout_s), the first step of each epoch and the first evaluation batch take 4x a
    step (5x the timeout is allowed), and 14 s of work after train() returns (not watched). One attempt, finished,
    every step trained once, the code after train() done on both ranks, no hang logged."""
    run = runs.submit("slow-but-healthy", tasks=2, entrypoint="tests.launcher.fault_entrypoints:slow_but_healthy",
                      config={**CONFIG, "step_delay_s": 0.5, "late_start_s": 20, "first_factor": 4,
                              "after_train_s": 14},
                      requeue={"max_requeues": 5, "max_failures": 1, "hang_timeout_s": 2})
    state = wait_ended(run, "finished")
    assert [a.outcome for a in state.attempts] == ["finished"], diagnostics(run)
    steps = [e["step"] for e in events(run) if e.get("event") == "train"]
    assert steps == list(range(1, 9)), steps  # 8 steps on two ranks, none trained again
    assert all((run / f"after-train-{rank}").exists() for rank in (0, 1))
    for rank in (0, 1):
        log = (RunPaths(run).attempt_logs(1) / f"rank-{rank}.err").read_text()
        assert "elfes: hang" not in log, log
