"""What a failed attempt names as its cause, end to end on the local executor (two gloo ranks): the rank that
failed, not the survivor whose connection to it broke; an engine refusal of the run's own settings ends the run
at once, without a retry; `elfes resume` after the failure allowance was spent has the allowance again; and
`elfes logs` of a failed attempt opens the rank that failed. The rules alone: test_failure_rules.py.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
from pathlib import Path

from local_runs import CONFIG, Runs, diagnostics, trained_to, wait_ended, wait_for

from elfes.launcher.cli.main import main as elfes
from elfes.launcher.rundir.paths import RunPaths


def _cli(*args: str) -> str:
    stream = io.StringIO()
    with contextlib.redirect_stdout(stream):
        assert elfes(list(args)) == 0
    return stream.getvalue()


def _rank_record(run_dir: Path, rank: int) -> dict | None:
    try:
        return json.loads(RunPaths(run_dir).pid_file(rank).read_text())
    except (FileNotFoundError, ValueError):
        return None


def test_the_cause_names_the_rank_that_exited_or_was_killed_and_logs_open_it(runs: Runs) -> None:
    """Rank 0 calls sys.exit(3) at step 7: the cause is rank 0's exit, with its code and step, not rank 1's
    lost connection. Rank 1 is SIGKILLed from outside mid-run: the cause names rank 1 and the signal, as the local
    controller recorded it, not the survivor, and `elfes logs RUN_DIR` shows rank 1's log (the rank that failed)
    without --rank."""
    config = {**CONFIG, "step_delay_s": 0.1}
    exits = runs.submit("exits", tasks=2, entrypoint="tests.launcher.fault_entrypoints:exits_at_step_7",
                        config={**config, "fault_rank": 0}, requeue={"max_requeues": 5, "max_failures": 0})
    killed = runs.submit("killed", tasks=2, config=config, requeue={"max_requeues": 5, "max_failures": 0})
    record = wait_for(lambda: trained_to(killed, 2) and _rank_record(killed, 1), what="rank 1 training",
                      run_dir=killed)
    os.kill(record["pid"], signal.SIGKILL)

    state = wait_ended(exits, "failed")
    assert [a.outcome for a in state.attempts] == ["failed"], diagnostics(exits)
    failure = state.attempts[0].failure
    assert (failure.category, failure.rank, failure.step) == ("exit", 0, 7), diagnostics(exits)
    assert failure.cause == "rank 0 exited with code 3 (SystemExit) at step 7"
    assert "rank 0 exited with code 3 (SystemExit) at step 7" in (RunPaths(exits).rank_log(1, 0, "err")).read_text()

    state = wait_ended(killed, "failed")
    failure = state.attempts[0].failure
    assert (failure.category, failure.rank) == ("lost", 1), diagnostics(killed)
    assert failure.cause == f"rank 1 was killed by SIGKILL at step {failure.step}", failure.cause
    assert failure.step is not None and failure.step >= 2, failure
    assert state.error.startswith("rank 1 was killed by SIGKILL at step ") and "Connection closed" not in state.error
    recorded = json.loads(RunPaths(killed).task_exit(1).read_text())
    assert (recorded["pid"], recorded["returncode"]) == (record["pid"], -signal.SIGKILL), recorded
    status = json.loads(_cli("status", str(killed), "--json"))
    assert status["error"].startswith("rank 1 was killed by SIGKILL at step "), status
    shown = _cli("logs", str(killed))
    assert f"==> {RunPaths(killed).rank_log(1, 1, 'out')} <==" in shown and "rank 1 of 2" in shown, shown
    assert "rank 0 of 2" not in shown


def test_a_configuration_refusal_is_not_retried_and_resume_grants_the_failure_allowance_again(runs: Runs) -> None:
    """48 samples make 3 batches, which 2 ranks cannot share: the engine refuses it (a ConfigurationError), and
    with failures allowed the run ends failed after one attempt, the engine's message in its error. A run whose
    one allowed failure was retried and whose next failure ended it has, after `elfes resume`, its allowance
    again: the failure after the resume is retried, and status counts the failures since the resume."""
    refused = runs.submit("refused", tasks=2, config={**CONFIG, "train_samples": 48},
                          requeue={"max_requeues": 5, "max_failures": 3})
    config = {**CONFIG, "step_delay_s": 0.02, "fault_attempts": [1, 2, 3]}
    resumed = runs.submit("resumed", tasks=1, entrypoint="tests.launcher.fault_entrypoints:raises_at_its_second_update",
                          config=config, requeue={"max_requeues": 5, "max_failures": 1})

    state = wait_ended(refused, "failed")
    assert [a.outcome for a in state.attempts] == ["failed"], diagnostics(refused)
    failure = state.attempts[0].failure
    assert not failure.retried and failure.cause.startswith("ConfigurationError: The training DataLoader has 3 "
                                                            "batches, which 2 ranks cannot share equally")
    assert failure.reason.startswith("not retried: the engine refused the run's configuration")
    status = json.loads(_cli("status", str(refused), "--json"))
    assert "which 2 ranks cannot share equally" in status["error"]

    state = wait_ended(resumed, "failed")
    assert [(a.outcome, a.failure.retried) for a in state.attempts] == [("failed", True), ("failed", False)], \
        diagnostics(resumed)
    assert state.attempts[1].failure.reason.startswith("failure limit reached (1 of requeue.max_failures=1")
    assert elfes(["resume", str(resumed)]) == 0
    state = wait_ended(resumed, "finished")
    assert [(a.outcome, a.launch, a.failure.retried if a.failure else None) for a in state.attempts] == [
        ("failed", "submit", True), ("failed", "requeue", False), ("failed", "resume", True),
        ("finished", "requeue", None)], diagnostics(resumed)
    assert state.failures_used == 1 and state.failures_counted_since == "resume"
    shown = _cli("status", str(resumed))
    assert "1 failure retried since the resume (1 before it)" in " ".join(shown.split()), shown
