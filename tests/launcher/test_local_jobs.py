"""End to end on the local executor: real jobs through `elfes submit`, `preempt`, `cancel`, `resume`.

Every job is a real submitit local job (a detached controller and one process per rank, gloo between
ranks); the tests wait on what the job writes (state.json, pid files, events.jsonl), never on bare
sleeps. Interrupted runs end bitwise equal (torch.equal on every tensor of the final checkpoint and of
the exported model) to an uninterrupted run of the same spec.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from run_comparison import assert_runs_bitwise_equal

from elfes.launcher.cli.main import main as elfes
from elfes.launcher.rundir import state as run_state
from elfes.launcher.rundir.paths import RunPaths

REPOSITORY = Path(__file__).resolve().parents[2]
# 256 samples, batches of 16, accumulation 2: 8 optimizer steps per epoch on one rank, 16 in all (8 on two
# ranks); a train record every step.
CONFIG = {"epochs": 2, "train_samples": 256, "log_every": 1}
PLANNED_STEPS = 16
STEP_DELAY_S = 0.08  # per batch and rank (times the ranks): about 2.6 s of training, so signals land mid-run
JOB_TIMEOUT_S = 150.0


# -- specs and runs ---------------------------------------------------------------------------------------------
def write_spec(folder: Path, name: str, *, tasks: int = 1, max_requeues: int = 5, **fields: Any) -> Path:
    """A job spec in ``folder`` whose run directory is ``folder/name``; ``fields`` override the defaults."""
    spec: dict[str, Any] = {
        "name": name,
        "entrypoint": "tests.launcher.entrypoints:slow_quickstart",
        "workdir": str(REPOSITORY),
        "run_dir": str(folder / name),
        "config": {**CONFIG, "step_delay_s": STEP_DELAY_S * tasks},
        "resources": {"nodes": 1, "tasks_per_node": tasks, "gpus_per_node": 0, "cpus_per_task": 1,
                      "mem_gb": 1, "timeout_min": 10},
        "slurm": {"signal_delay_s": 60},
        "requeue": {"max_requeues": max_requeues},
        "env": {"OMP_NUM_THREADS": "1"},
    }
    spec.update(fields)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


class Runs:
    """Submits runs through the CLI and, at teardown, ends whatever of them is still alive."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.run_dirs: list[Path] = []

    def submit(self, name: str, **spec_fields: Any) -> Path:
        spec = write_spec(self.folder, name, **spec_fields)
        run_dir = self.folder / name
        self.run_dirs.append(run_dir)
        assert elfes(["submit", str(spec), "--executor", "local"]) == 0
        return run_dir

    def kill_leftovers(self) -> None:
        from elfes.launcher.rundir.liveness import local_processes

        for run_dir in self.run_dirs:
            processes = local_processes(RunPaths(run_dir))
            for pid in processes["controller"] + processes["task"]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[Runs]:
    runs = Runs(tmp_path)
    yield runs
    runs.kill_leftovers()


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[int], Path]]:
    """``references(tasks)``: the run directory of an uninterrupted run on ``tasks`` ranks (started on
    first use, shared by the tests of this module; call early so that it trains alongside the test's run)."""
    runs = Runs(tmp_path_factory.mktemp("references"))
    started: dict[int, Path] = {}

    def reference(tasks: int) -> Path:
        if tasks not in started:
            started[tasks] = runs.submit(f"reference-{tasks}", tasks=tasks,
                                         config={**CONFIG, "step_delay_s": 0.0})
        return started[tasks]

    yield reference
    runs.kill_leftovers()


# -- waiting on what the job writes -----------------------------------------------------------------------------
def diagnostics(run_dir: Path) -> str:
    paths = RunPaths(run_dir)
    parts = [f"--- {paths.state} ---", paths.state.read_text() if paths.state.exists() else "(none)"]
    files = sorted(paths.logs.glob("attempt-*/rank-*.*")) + sorted(paths.submitit.glob("*_log.*"))
    for file in [*files, paths.controller_log]:
        if file.is_file():
            parts += [f"--- {file} (tail) ---", file.read_text(errors="replace")[-3000:]]
    return "\n".join(parts)


def wait_for(
    condition: Callable[[], Any], *, what: str, run_dir: Path, timeout_s: float = JOB_TIMEOUT_S, may_end: bool = False
) -> Any:
    """Poll ``condition`` until it returns something truthy; fail with the run's files after ``timeout_s``,
    or at once when the run ended meanwhile (unless ``may_end``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        state = None if may_end else state_of(run_dir)
        if state is not None and state.status in run_state.ENDED and not condition():
            pytest.fail(f"the run ended {state.status} ({state.error}) while waiting for {what}\n{diagnostics(run_dir)}")
        if time.monotonic() > deadline:
            processes = ""
            if RunPaths(run_dir).run_dir.is_dir():
                from elfes.launcher.rundir.liveness import local_processes

                processes = f"live processes of the run: {local_processes(RunPaths(run_dir))}\n"
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}\n{processes}{diagnostics(run_dir)}")
        time.sleep(0.05)


def state_of(run_dir: Path) -> run_state.RunState | None:
    return run_state.load_state(RunPaths(run_dir))


def events(run_dir: Path) -> list[dict[str, Any]]:
    file = RunPaths(run_dir).events
    if not file.exists():
        return []
    found = []
    for line in file.read_text().splitlines():
        try:
            found.append(json.loads(line))
        except ValueError:
            pass  # a line being written
    return found


def trained_to(run_dir: Path, step: int) -> bool:
    """Whether the run logged a train record at ``step`` or later (in any attempt)."""
    return any(event.get("event") == "train" and event.get("step", -1) >= step for event in events(run_dir))


def tasks_running(run_dir: Path, attempt: int, tasks: int) -> bool:
    """Whether every rank recorded its pid for ``attempt`` (its handlers are in) and the run is running."""
    paths = RunPaths(run_dir)
    for rank in range(tasks):
        try:
            record = json.loads(paths.pid_file(rank).read_text())
        except (FileNotFoundError, ValueError):
            return False
        if record.get("attempt") != attempt:
            return False
    state = state_of(run_dir)
    return state is not None and state.status in ("running", "stopping")


def job_gone(run_dir: Path) -> bool:
    from elfes.launcher.rundir.liveness import local_processes

    processes = local_processes(RunPaths(run_dir))
    return not processes["controller"] and not processes["task"]


def wait_ended(run_dir: Path, status: str) -> run_state.RunState:
    """Wait until the run's state is ``status`` and no process of its job is left; return the state."""
    state = wait_for(lambda: (s := state_of(run_dir)) is not None and s.status in run_state.ENDED and s,
                     what=f"the run to end {status}", run_dir=run_dir, may_end=True)
    assert state.status == status, f"the run ended {state.status}, not {status}\n{diagnostics(run_dir)}"
    wait_for(lambda: job_gone(run_dir), what="the job's processes to exit", run_dir=run_dir,
             may_end=True)
    return state_of(run_dir)


def preempt(run_dir: Path) -> None:
    assert elfes(["preempt", str(run_dir)]) == 0


def outcomes(state: run_state.RunState) -> list[tuple[str, str | None, str]]:
    return [(attempt.outcome, attempt.signal, attempt.launch) for attempt in state.attempts]


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
            assert f"elfes: attempt {attempt} " in RunPaths(run_dir).rank_log(attempt, rank, "out").read_text()
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
