"""The rules past preemption, without jobs: which failure is retried (launcher/job/failures.py), how
state.json counts retries apart from requeues, what `elfes status` and the plot say of a failure. When the
hang watchdog fires: test_hang_watchdog.py. The jobs themselves: test_failure_retries.py."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from elfes.launcher.cli.status import print_status
from elfes.launcher.commands.status import run_status
from elfes.launcher.job.failures import (
    FailureReport,
    cause_of,
    decide_failure,
    failure_error,
    read_reports,
    the_rank_that_failed,
    write_report,
)
from elfes.launcher.rundir import state as run_state
from elfes.launcher.rundir.paths import RunPaths
from elfes.records.timeline import build_timeline

ERROR = RuntimeError("the loss is NaN")


def report(rank: int = 1, *, step: int | None = 7, updated: bool = True, at: float = 100.0,
           error: BaseException = ERROR) -> FailureReport:
    return FailureReport.of_exception(error, rank=rank, host="node1", at=at, step=step, updated=updated)


def failed_attempt(failure: run_state.Failure) -> run_state.Attempt:
    return run_state.Attempt(number=1, token="1:0/1", job_id="1", launch="submit", started_at=run_state.now(),
                             outcome="failed", failure=failure)


# -- which failure is retried -------------------------------------------------------------------------------
def test_a_first_failure_is_retried_and_the_same_one_again_at_the_same_step_is_not() -> None:
    first = decide_failure(report(), previous=None, failures_used=0, max_failures=3)
    assert first.retried and (first.category, first.cause, first.step) == ("exception", "RuntimeError: the loss is NaN", 7)
    again = decide_failure(report(), previous=failed_attempt(first), failures_used=1, max_failures=3)
    assert not again.retried and again.reason == "failed twice at step 7: not retried"
    elsewhere = decide_failure(report(step=9), previous=failed_attempt(first), failures_used=1, max_failures=3)
    assert elsewhere.retried  # another step: not the same failure
    other = decide_failure(report(error=ValueError("bad batch")), previous=failed_attempt(first), failures_used=1,
                           max_failures=3)
    assert other.retried


def test_two_crashes_in_a_row_before_the_first_update_are_not_retried() -> None:
    first = decide_failure(report(step=None, updated=False, error=ImportError("no module named model")),
                           previous=None, failures_used=0, max_failures=3)
    assert first.retried
    second = decide_failure(report(step=None, updated=False, error=OSError("data folder missing")),
                            previous=failed_attempt(first), failures_used=1, max_failures=3)
    assert not second.retried and second.reason == "failed twice before its first update: not retried"


def test_the_failure_budget_is_counted_apart_and_ends_the_retries() -> None:
    spent = decide_failure(report(), previous=None, failures_used=2, max_failures=2)
    assert not spent.retried and "2 of requeue.max_failures=2" in spent.reason and "elfes resume" in spent.reason
    assert not decide_failure(report(), previous=None, failures_used=0, max_failures=0).retried


def test_a_failure_a_retry_cannot_pass_is_not_retried() -> None:
    refused = dataclasses.replace(report(step=None, updated=False), final="the checkpoint to resume from was refused")
    failure = decide_failure(refused, previous=None, failures_used=0, max_failures=3)
    assert not failure.retried and failure.reason == "not retried: the checkpoint to resume from was refused"


def test_the_cause_is_the_first_hand_error_not_a_peers_lost_connection() -> None:
    lost = report(0, at=99.0, error=RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:1234"))
    assert lost.peer_lost and lost.category == "lost"
    assert cause_of([lost, report(1, at=100.0)]).rank == 1
    assert cause_of([lost]).rank == 0  # only the consequence is known: a rank was lost
    assert failure_error(decide_failure(lost, previous=None, failures_used=0, max_failures=1), lost).startswith(
        "a peer rank was lost: RuntimeError: [pair.cc:553] Connection closed by peer")


def test_a_silent_rank_is_named_with_how_its_parent_saw_it_end() -> None:
    """Rank 0 only lost its peer; rank 1 never reported: its recorded exit status names the signal or the code,
    and without one the cause still names rank 1 (SLURM, where srun is the parent)."""
    lost = report(0, step=12, error=RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:1234"))

    def named(status: int | None, gone: bool = True) -> FailureReport:
        return the_rank_that_failed(cause_of([lost]), [lost], world_size=2, hosts={1: "node2"},
                                    gone=lambda rank: gone, exit_status=lambda rank: status)

    killed = named(-9)
    assert (killed.rank, killed.host, killed.category, killed.peer_lost) == (1, "node2", "lost", False)
    assert killed.cause == "rank 1 was killed by SIGKILL at step 12"
    assert failure_error(decide_failure(killed, previous=None, failures_used=0, max_failures=1), killed) == (
        "rank 1 was killed by SIGKILL at step 12 (rank 1 on node2, step 12); retried from `last`")
    exited = named(7)
    assert (exited.category, exited.cause) == ("exit", "rank 1 exited with code 7 at step 12")
    assert named(-77).cause == "rank 1 was killed by signal 77 at step 12"
    assert named(None).cause.startswith("rank 1 was lost: its process ended without reporting an error: killed by")
    assert named(None, gone=False).cause == ("rank 1 was lost: it ended without reporting an error: killed, or its "
                                             "node failed")


def test_the_exit_status_a_local_controller_recorded_is_read_for_that_task_only(tmp_path: Path, monkeypatch) -> None:
    """A real child killed by SIGKILL, recorded as a local controller records it: the deciding rank reads its
    status for the task of the rank's pid record, in that job; nothing for another job (after the bounded
    wait), a task still running (no wait), another host or a SLURM job."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from elfes.launcher.job import failed_attempt
    from elfes.launcher.job.distributed_env import Start
    from elfes.launcher.job.failed_attempt import awaited_exit_status
    from elfes.launcher.rundir.task_files import write_task_exit


    paths = RunPaths(tmp_path)
    start = Start(executor="local", job_id="4242", restart=0, rank=0, local_rank=0, world_size=2, host="node1",
                  hosts=("node1",))
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    record = {"rank": 1, "pid": child.pid, "host": "node1", "attempt": 1}
    try:
        monkeypatch.setattr(failed_attempt, "EXIT_STATUS_WAIT_S", 60.0)
        began = time.monotonic()
        assert awaited_exit_status(paths, start, record) is None  # alive: nothing will be recorded, no wait
        assert time.monotonic() - began < 30.0
    finally:
        os.kill(child.pid, signal.SIGKILL)
    assert child.wait() == -signal.SIGKILL
    write_task_exit(paths, job_id="4242", rank=1, pid=child.pid, returncode=child.returncode)
    assert json.loads(paths.task_exit(1).read_text())["returncode"] == -9
    assert awaited_exit_status(paths, start, record) == -9
    monkeypatch.setattr(failed_attempt, "EXIT_STATUS_WAIT_S", 0.3)  # exited, not recorded: waits out its bound
    began = time.monotonic()
    assert awaited_exit_status(paths, dataclasses.replace(start, job_id="4243"), record) is None
    assert time.monotonic() - began >= 0.3
    assert awaited_exit_status(paths, start, {**record, "host": "node2"}) is None
    assert awaited_exit_status(paths, dataclasses.replace(start, executor="slurm"), record) is None
    assert awaited_exit_status(paths, start, None) is None


def test_failure_reports_round_trip_through_the_run_directory(tmp_path: Path) -> None:
    from elfes.launcher.job.failures import write_report

    paths = RunPaths(tmp_path)
    write_report(paths, 2, report(1))
    write_report(paths, 2, report(0, at=101.0))
    paths.failure_report(2, 3).write_text("{torn")  # a report being written, or damaged: skipped
    assert [r.rank for r in read_reports(paths, 2)] == [0, 1] and read_reports(paths, 2)[1] == report(1)


# -- state.json ---------------------------------------------------------------------------------------------
def _running(state: run_state.RunState | None, token: str, launch: str) -> run_state.RunState:
    return run_state.begin_attempt(state, token=token, job_id="7", launch=launch, hosts=("node1",), world_size=2)


def test_a_retried_failure_requeues_the_run_and_counts_against_max_failures_not_max_requeues() -> None:
    state = run_state.record_submission(None, executor="slurm", kind="submit", max_requeues=5, job_id="7",
                                        run_dir="runs/failing")
    state = _running(state, "7:0/1", "submit")
    retried = decide_failure(report(), previous=None, failures_used=0, max_failures=3)
    state = run_state.end_attempt(state, token="7:0/1", outcome="failed", error="boom", failure=retried)
    assert state.status == "requeued" and state.failures_used == 1
    assert run_state.requeues_used_by(state, "7:1/1", "requeue") == 0
    state = _running(state, "7:1/1", "requeue")
    assert state.requeues_used == 0 and state.requeues_left == 5
    state = run_state.end_attempt(state, token="7:1/1", outcome="requeued", signal="SIGUSR2")
    state = _running(state, "7:2/1", "requeue")
    assert state.requeues_used == 1 and state.failures_used == 1  # a preemption's relaunch is a requeue
    again = run_state.RunState.from_json(json.loads(json.dumps(state.to_json())))
    assert again == state and state.to_json()["failures_used"] == 1
    assert run_state.previous_attempt(state, "7:2/1").outcome == "requeued"


def test_a_retry_that_cannot_be_carried_out_ends_the_run_failed_saying_why() -> None:
    state = _running(run_state.record_submission(None, executor="slurm", kind="submit", max_requeues=5, job_id="7",
                                                 run_dir="runs/failing"),
                     "7:0/1", "submit")
    retried = decide_failure(report(), previous=None, failures_used=0, max_failures=3)
    state = run_state.end_attempt(state, token="7:0/1", outcome="failed", error="boom", failure=retried)
    state = run_state.refuse_retry(state, token="7:0/1", reason="`scontrol requeue 7` failed: disabled")
    assert state.status == "failed" and not state.last_attempt.failure.retried
    assert state.error == "boom; but not retried: `scontrol requeue 7` failed: disabled"


def test_a_damaged_failure_is_refused_naming_the_field() -> None:
    state = _running(run_state.record_submission(None, executor="local", kind="submit", max_requeues=5, job_id="7",
                                                 run_dir="runs/failing"),
                     "7:0/1", "submit")
    data = json.loads(json.dumps(run_state.end_attempt(state, token="7:0/1", outcome="failed", failure=decide_failure(
        report(), previous=None, failures_used=0, max_failures=3)).to_json()))
    data["attempts"][0]["failure"]["retried"] = "yes"
    with pytest.raises(ValueError, match=r"attempts\[0\].failure.retried is 'yes' \(a string\), not true or false"):
        run_state.RunState.from_json(data)
    data["attempts"][0]["failure"].update(retried=True, category="oops")
    with pytest.raises(ValueError, match=r"attempts\[0\].failure.category is 'oops'.*not one of exception, exit"):
        run_state.RunState.from_json(data)


def test_a_failure_category_is_an_enum_member_in_memory_and_its_word_in_state_json(tmp_path: Path) -> None:
    """The category travels as run_state.FailureCategory, from the rank's report to state.json and back; the files
    hold its word, as before it was an enum."""
    FailureCategory = run_state.FailureCategory
    assert run_state.FAILURE_CATEGORIES == tuple(FailureCategory) == ("exception", "exit", "lost", "hang")
    cause = report()
    assert type(cause.category) is FailureCategory and cause.category is FailureCategory.EXCEPTION
    paths = RunPaths(tmp_path / "run")
    write_report(paths, 1, dataclasses.replace(cause, category=FailureCategory.HANG))
    assert '"category": "hang"' in paths.failure_report(1, cause.rank).read_text()
    assert read_reports(paths, 1)[0].category is FailureCategory.HANG
    state = _running(run_state.record_submission(None, executor="local", kind="submit", max_requeues=5, job_id="7",
                                                 run_dir="runs/failing"),
                     "7:0/1", "submit")
    state = run_state.end_attempt(state, token="7:0/1", outcome="failed", failure=decide_failure(
        cause, previous=None, failures_used=0, max_failures=3))
    text = json.dumps(state.to_json())
    assert '"category": "exception"' in text
    assert run_state.RunState.from_json(json.loads(text)).attempts[0].failure.category is FailureCategory.EXCEPTION


# -- what status and the plot say -----------------------------------------------------------------------------
def test_status_names_each_failures_cause_and_whether_it_was_retried(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "run")
    state = _running(run_state.record_submission(None, executor="local", kind="submit", max_requeues=5, job_id="7",
                                                 run_dir="runs/failing"),
                     "7:0/1", "submit")
    first = decide_failure(report(), previous=None, failures_used=0, max_failures=3)
    state = run_state.end_attempt(state, token="7:0/1", outcome="failed", failure=first,
                                  error=failure_error(first, report()))
    paths.run_dir.mkdir()
    run_state.save_state(paths, state)
    console = Console(file=io.StringIO(), width=400)
    # No job runs here: status would count the run lost; show it as the job's relaunch still sees it.
    result = dataclasses.replace(run_status(paths.run_dir), status="requeued", notes=[])
    print_status(console, [result])
    shown = console.file.getvalue()
    assert "requeued" in result.status and result.failures_used == 1
    assert "failed (retrying)" in shown and "failed (retried)" in shown and "1 failure retried" in shown

    state = _running(state, "7:1/1", "requeue")
    second = decide_failure(report(), previous=state.attempts[0], failures_used=1, max_failures=3)
    state = run_state.end_attempt(state, token="7:1/1", outcome="failed", failure=second,
                                  error=failure_error(second, report()))
    run_state.save_state(paths, state)
    console = Console(file=io.StringIO(), width=400)
    print_status(console, [run_status(paths.run_dir)])
    shown = console.file.getvalue()
    assert "failed (not retried)" in shown
    assert "attempt 1 failed: RuntimeError: the loss is NaN (rank 1 on node1, step 7); retried from `last`" in shown
    assert "error: RuntimeError: the loss is NaN (rank 1 on node1, step 7); failed twice at step 7: not retried" in shown


def test_the_plot_marks_a_failure_with_the_launchers_cause_and_a_hang_as_a_failure() -> None:
    events = [{"event": "started", "state": {"step": 0}}, {"event": "train", "step": 6},
              {"event": "failed", "step": 6, "exception": "RuntimeError", "message": "Connection closed by peer"},
              {"event": "resumed", "state": {"step": 4}}, {"event": "train", "step": 6},  # killed for a hang: no end
              {"event": "resumed", "state": {"step": 4}}, {"event": "train", "step": 8}]
    timeline = build_timeline(events, launches=["submit", "requeue", "requeue"],
                              failures=["ValueError, retried", "hang, retried", None])
    failed = [(m.kind, m.label) for m in timeline.markers if m.kind == "failed"]
    assert failed == [("failed", "failed (ValueError, retried)"), ("failed", "failed (hang, retried)")]


def test_a_retry_that_leaves_no_node_out_says_so_in_status(tmp_path: Path) -> None:
    """The node-exclusion fallback (the requeued job cannot be placed without the failed node) allows every host
    again and appends why to the failed attempt's error, which `elfes status` prints once the retry runs."""
    paths = RunPaths(tmp_path / "run")
    state = _running(run_state.record_submission(None, executor="slurm", kind="submit", max_requeues=5, job_id="7",
                                                 run_dir="runs/failing"),
                     "7:0/1", "submit")
    failure = decide_failure(report(), previous=None, failures_used=0, max_failures=3)
    state = run_state.end_attempt(state, token="7:0/1", outcome="failed", failure=failure,
                                  error=failure_error(failure, report()))
    state = run_state.exclude_nodes(state, hosts=["node1"], attempt=1, cause=failure.cause)
    why = "the requeued job cannot be placed without node1: partition low has 1 node (node1) ..."
    state = _running(run_state.include_nodes_after(state, token="7:0/1", why=why), "7:1/1", "requeue")
    assert state.excluded_nodes == () and state.attempts[0].error.endswith(f"retried from `last`; {why}")
    paths.run_dir.mkdir()
    run_state.save_state(paths, state)
    console = Console(file=io.StringIO(), width=400)
    print_status(console, [dataclasses.replace(run_status(paths.run_dir), notes=[])])
    assert f"attempt 1 failed: RuntimeError: the loss is NaN (rank 1 on node1, step 7); retried from `last`; {why}" \
        in console.file.getvalue()


def test_a_checkpoint_the_run_cannot_continue_is_recorded_with_every_reason_and_not_retried() -> None:
    from elfes.engine.payload import UnusableCheckpointError

    refusal = UnusableCheckpointError(
        "Checkpoint /runs/a/checkpoints/step-4.pt does not match this run:\n"
        "  - world_size: the checkpoint was written on 2 ranks x accumulation 2 (a window of 4 microbatches per update) "
        "and this run has 1 rank x accumulation 2 (2); continuing needs the same window, so that every update trains "
        "on the same samples: 1 rank x accumulation 4 keeps the window of 4 microbatches\n"
        "Resume with the same batching; to change it, start a new run from its weights (load_weights).")
    cause = report(step=4, error=refusal)
    assert cause.cause == ("UnusableCheckpointError: Checkpoint /runs/a/checkpoints/step-4.pt does not match this run: - "
                           "world_size: the checkpoint was written on 2 ranks x accumulation 2 (a window of 4 "
                           "microbatches per update) and this run has 1 rank x accumulation 2 (2); continuing needs the "
                           "same window, so that every update trains on the same samples: 1 rank x accumulation 4 keeps "
                           "the window of 4 microbatches Resume with the same batching; to change it, start a new run "
                           "from its weights (load_weights).")
    decided = decide_failure(cause, previous=None, failures_used=0, max_failures=3)
    assert not decided.retried and "1 rank x accumulation 4 keeps the window" in decided.cause
    dump = RuntimeError("first line\n" + "x" * 3000 + "\nlast line")  # a message with a dump keeps its ends
    assert report(error=dump).cause == "RuntimeError: first line ... last line"
