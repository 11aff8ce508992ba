"""`command:` jobs under faults, end to end on the local executor: a wrapper's trainer never outlives
its attempt or goes unseen, a command that catches only SIGINT and SIGTERM is still preempted, an exit 0
after a stop is not a finish, and a command that ignores SIGTERM is killed after resources.kill_wait_s.

The commands are torch-free (tests/launcher/protocol_command.py, optionally behind the wrapper
tests/launcher/forwarding_nothing.sh), except one run of the real engine; the tests wait on what the
job writes, never on bare sleeps.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from local_runs import (
    CONFIG,
    PLANNED_STEPS,
    REPOSITORY,
    STEP_DELAY_S,
    Runs,
    diagnostics,
    outcomes,
    state_of,
    tasks_running,
    trained_to,
    wait_ended,
    wait_for,
    write_spec,
)
from run_comparison import assert_runs_bitwise_equal

from elfes.launcher.cli.main import main as elfes
from elfes.launcher.commands import signalling
from elfes.launcher.rundir import state as run_state
from elfes.launcher.rundir.command_group import process_stat
from elfes.launcher.rundir.paths import RunPaths

WRAPPER = str(REPOSITORY / "tests" / "launcher" / "forwarding_nothing.sh")


def protocol_command(*options: str, units: int = 200, unit_s: float = 0.05, wrapped: bool = False) -> list[str]:
    command = ["{python}", "-m", "tests.launcher.protocol_command", "--run-dir", "{run_dir}", "--units", str(units),
               "--unit-s", str(unit_s), *options]
    return ["sh", WRAPPER, *command] if wrapped else command


class CommandRuns(Runs):
    """Runs whose teardown also ends what their commands' process groups left running."""

    def submit_command(self, name: str, command: list[str], **fields: Any) -> Path:
        return self.submit(name, entrypoint=None, command=command, config={}, **fields)

    def kill_leftovers(self) -> None:
        for run_dir in self.run_dirs:
            for trainer in trainer_pids(run_dir):
                with contextlib.suppress(ProcessLookupError):
                    group = os.getpgid(trainer)
                    os.kill(trainer, signal.SIGKILL)
                    if group != os.getpgrp():
                        os.killpg(group, signal.SIGKILL)  # the wrapper, if it is still there
        super().kill_leftovers()


@pytest.fixture
def command_runs(tmp_path: Path) -> Iterator[CommandRuns]:
    """Like conftest.py's ``runs``, with :class:`CommandRuns`: teardown also ends the commands' process groups."""
    runs = CommandRuns(tmp_path)
    yield runs
    runs.kill_leftovers()


# -- what the command's processes left --------------------------------------------------------------------------
def alive(pid: int) -> bool:
    stat = process_stat(pid)
    return stat is not None and stat.live


def trainer_pids(run_dir: Path) -> list[int]:
    file = run_dir / "trainer.pid"
    return [int(file.read_text())] if file.exists() else []


def trainer_counting(run_dir: Path, units: int = 1) -> int | None:
    """The trainer's pid once its handlers are in and it counted ``units``, else None."""
    count = run_dir / "count.txt"
    if not trainer_pids(run_dir) or units > 0 and (not count.exists() or int(count.read_text() or 0) < units):
        return None
    return trainer_pids(run_dir)[0]


def cli(*argv: str) -> tuple[int, str]:
    """Run the CLI; its exit code and what it printed (stdout and stderr)."""
    stream = io.StringIO()
    with contextlib.redirect_stdout(stream), contextlib.redirect_stderr(stream):
        code = elfes(list(argv))
    return code, stream.getvalue()


def status_json(run_dir: Path) -> dict[str, Any]:
    code, output = cli("status", str(run_dir), "--json")
    assert code == 0, output
    data = json.loads(output)
    return data[0] if isinstance(data, list) else data


def run_log(run_dir: Path, attempt: int = 1) -> str:
    paths = RunPaths(run_dir)
    return "".join(paths.rank_log(attempt, 0, stream).read_text(errors="replace")
                   for stream in ("out", "err") if paths.rank_log(attempt, 0, stream).exists())


def ended_with_nothing_left(run_dir: Path, status: str) -> run_state.RunState:
    """Wait for the run to end ``status``; at that moment, no process of its command may be left."""
    state = wait_for(lambda: (s := state_of(run_dir)) is not None and s.status in run_state.ENDED and s,
                     what=f"the run to end {status}", run_dir=run_dir, may_end=True)
    left = [pid for pid in trainer_pids(run_dir) if alive(pid)]
    assert not left, f"the trainer {left} outlived its attempt ({state.status})\n{diagnostics(run_dir)}"
    assert state.status == status, f"the run ended {state.status} ({state.error}), not {status}\n{diagnostics(run_dir)}"
    return wait_ended(run_dir, status)


# -- 2: a wrapper's trainer --------------------------------------------------------------------------------------
@pytest.mark.parametrize("after_units", [1, 8, 30])
def test_a_killed_wrapper_takes_its_trainer_with_it(command_runs: CommandRuns, after_units: int) -> None:
    """The wrapper (which forwards nothing) is SIGKILLed at several points of the training: its trainer,
    re-parented to the task, gets SIGTERM and saves; the attempt fails only once no process of the
    command is left, and its retry (requeue.max_failures) then runs one trainer, from the saved count."""
    run_dir = command_runs.submit_command(f"wrapper-killed-{after_units}", protocol_command(wrapped=True, units=200))
    trainer = wait_for(lambda: tasks_running(run_dir, 1, 1) and trainer_counting(run_dir, after_units),
                       what=f"the trainer to count to {after_units}", run_dir=run_dir)
    wrapper = process_stat(trainer).parent
    assert Path(f"/proc/{wrapper}/cmdline").read_bytes().split(b"\0")[1] == WRAPPER.encode()  # a real wrapper
    os.kill(wrapper, signal.SIGKILL)

    state = ended_with_nothing_left(run_dir, "finished")
    assert [(a.outcome, a.launch) for a in state.attempts] == [("failed", "submit"), ("finished", "requeue")]
    assert "killed by SIGKILL" in state.attempts[0].error and state.attempts[0].failure.retried
    assert f"leaving processes [{trainer}] of its group running: sent SIGTERM" in run_log(run_dir)
    saved = re.search(r"stopping at (\d+)", run_log(run_dir))  # the trainer caught the SIGTERM and saved its count
    assert saved and int(saved.group(1)) >= after_units
    assert f"counting from {saved.group(1)} to 200" in run_log(run_dir, attempt=2)
    assert (run_dir / "count.txt").read_text() == "200"


def test_a_trainer_whose_task_was_killed_keeps_the_run_alive(command_runs: CommandRuns) -> None:
    """The task is SIGKILLed: the wrapper goes with it, its trainer (re-parented to pid 1) trains on. The
    run is alive for status, resume and submit while it does; `elfes cancel` ends it, after which the run
    resumes with one trainer."""
    finish_now = command_runs.folder / "task-killed-finishes"  # counting never ends before the test says so
    spec_fields = {"entrypoint": None, "config": {},
                   "command": protocol_command("--finish-when", str(finish_now), wrapped=True, units=100_000)}
    run_dir = command_runs.submit("task-killed", **spec_fields)
    trainer = wait_for(lambda: tasks_running(run_dir, 1, 1) and trainer_counting(run_dir, 2),
                       what="the trainer to count", run_dir=run_dir)
    task = json.loads(RunPaths(run_dir).pid_file(0).read_text())["pid"]
    os.kill(task, signal.SIGKILL)
    wait_for(lambda: not alive(task), what="the task to die", run_dir=run_dir)
    counted = int((run_dir / "count.txt").read_text())
    wait_for(lambda: int((run_dir / "count.txt").read_text()) > counted + 2, what="the orphaned trainer to count on",
             run_dir=run_dir)
    assert alive(trainer)

    status = status_json(run_dir)
    assert status["status"] == "running" and status["queue_state"] == "RUNNING", status
    code, output = cli("resume", str(run_dir))
    assert code != 0 and "the run is running" in output
    spec = write_spec(command_runs.folder, "task-killed", **spec_fields)
    code, output = cli("submit", str(spec), "--executor", "local")
    assert code != 0 and "while the run is running" in output
    assert alive(trainer) and trainer_pids(run_dir) == [trainer]  # no second trainer started

    code, output = cli("cancel", str(run_dir))
    assert code == 0 and f"pids [{trainer}]" in output and "whose task is gone" in output, output
    wait_for(lambda: not alive(trainer), what="the trainer to stop on SIGTERM", run_dir=run_dir, may_end=True)
    wait_for(lambda: status_json(run_dir)["status"] == "cancelled", what="the run to read cancelled",
             run_dir=run_dir, may_end=True)
    finish_now.touch()
    assert cli("resume", str(run_dir))[0] == 0
    ended_with_nothing_left(run_dir, "finished")
    assert (run_dir / "count.txt").read_text() == "100000"


# -- 3: a command that catches SIGINT and SIGTERM only -------------------------------------------------------------
@pytest.mark.parametrize("after_units, wrapped", [(None, False), (0, True), (5, False), (25, True)],
                         ids=["starting-direct", "handlers-in-wrapped", "counted-5-direct", "counted-25-wrapped"])
def test_a_command_catching_only_sigterm_is_preempted_through_it(
    command_runs: CommandRuns, wrapped: bool, after_units: int | None
) -> None:
    """`elfes preempt` of a command catching SIGINT and SIGTERM (StopRequest().catch_signals()'s default),
    from before the command catches anything to mid-run: preempt says the task sends SIGTERM instead
    (once the command catches it); the command saves and exits 143; the attempt is requeued as SIGUSR2
    asked; the relaunch counts on to the end."""
    command = protocol_command("--catch", "SIGINT,SIGTERM", wrapped=wrapped, units=400, unit_s=0.02)
    run_dir = command_runs.submit_command(f"term-only-{after_units}-{wrapped}", command)
    wait_for(lambda: tasks_running(run_dir, 1, 1) and (after_units is None or trainer_counting(run_dir, after_units)),
             what=f"the command to count to {after_units}", run_dir=run_dir)
    code, output = cli("preempt", str(run_dir))
    assert code == 0, output
    if after_units is not None:
        assert "catches SIGTERM but not SIGUSR2" in output, output

    state = ended_with_nothing_left(run_dir, "finished")
    assert outcomes(state)[:2] == [("requeued", "SIGUSR2", "submit"), ("finished", None, "requeue")], outcomes(state)
    assert "sent SIGTERM for SIGUSR2" in run_log(run_dir)
    assert "stopping at" in run_log(run_dir) and "on SIGTERM" in run_log(run_dir)
    assert (run_dir / "count.txt").read_text() == "400"


def test_preempt_says_what_the_command_did_with_the_signal_when_it_was_sent(
    command_runs: CommandRuns, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The note of `elfes preempt` describes the command as the signal found it. Here the preempt is
    held, after signalling, until the task has sent SIGTERM on and the command has saved and exited
    (as on a loaded machine): the note still says the command catches SIGTERM but not SIGUSR2."""
    run_dir = command_runs.submit_command("note-before-signal",
                                          protocol_command("--catch", "SIGINT,SIGTERM", units=400, unit_s=0.02))
    trainer = wait_for(lambda: tasks_running(run_dir, 1, 1) and trainer_counting(run_dir, 1),
                       what="the command to count", run_dir=run_dir)
    send = signalling._signal_pids

    def send_then_let_the_command_exit(records: list[dict[str, Any]], signum: int) -> list[str]:
        targets = send(records, signum)
        wait_for(lambda: "sent SIGTERM for SIGUSR2" in run_log(run_dir) and not alive(trainer),
                 what="the task to send SIGTERM on and the command to exit", run_dir=run_dir, may_end=True)
        return targets

    monkeypatch.setattr(signalling, "_signal_pids", send_then_let_the_command_exit)
    code, output = cli("preempt", str(run_dir))
    assert code == 0 and f"pids [{trainer}]) catches SIGTERM but not SIGUSR2" in output, output
    state = ended_with_nothing_left(run_dir, "finished")
    assert outcomes(state)[:2] == [("requeued", "SIGUSR2", "submit"), ("finished", None, "requeue")], outcomes(state)


def test_a_command_catching_nothing_says_so_at_once(command_runs: CommandRuns) -> None:
    """A command that catches neither SIGUSR2 nor SIGTERM: preempt's output, the run's log and
    `elfes status` say at once that the signal is held and why; when the command then ends by itself,
    the run is finished and its record says the preemption was never delivered."""
    finish_now = command_runs.folder / "catches-nothing-finishes"
    run_dir = command_runs.submit_command("catches-nothing", protocol_command("--catch", "", "--finish-when",
                                                                              str(finish_now), units=100_000))
    wait_for(lambda: tasks_running(run_dir, 1, 1) and trainer_counting(run_dir, 1), what="the command to count",
             run_dir=run_dir)
    code, output = cli("preempt", str(run_dir))
    assert code == 0 and "catches neither SIGUSR2 nor SIGTERM" in output, output
    wait_for(lambda: "SIGUSR2 is held" in run_log(run_dir), what="the run's log to say the signal is held",
             run_dir=run_dir)
    notes = wait_for(lambda: [n for n in status_json(run_dir)["notes"] if "SIGUSR2 is held" in n],
                     what="`elfes status` to say the signal is held", run_dir=run_dir)
    assert "catches SIGUSR2 nor SIGTERM" in notes[0]

    finish_now.touch()  # the command ends by itself, well inside the hold
    state = ended_with_nothing_left(run_dir, "finished")
    assert outcomes(state) == [("finished", None, "submit")]
    assert "SIGUSR2 was never delivered" in state.error


def test_an_engine_command_as_the_docs_write_it_is_preempted_bitwise(
    command_runs: CommandRuns, references: Callable[[int], Path]
) -> None:
    """The real engine in a command that uses `StopRequest().catch_signals()` (SIGINT and SIGTERM): a
    preemption saves `last` at a window boundary, requeues and resumes; the end is bitwise the
    uninterrupted run's."""
    reference = references(1)
    command = ["{python}", "-m", "tests.launcher.command_train", "--run-dir", "{run_dir}", "--epochs",
               str(CONFIG["epochs"]), "--train-samples", str(CONFIG["train_samples"]), "--step-delay-s",
               str(STEP_DELAY_S), "--default-signals"]
    run_dir = command_runs.submit_command("engine-default-signals", command)
    wait_for(lambda: tasks_running(run_dir, 1, 1) and trained_to(run_dir, 2), what="attempt 1 to train to step 2",
             run_dir=run_dir)
    code, output = cli("preempt", str(run_dir))
    assert code == 0 and "catches SIGTERM but not SIGUSR2" in output, output
    state = wait_ended(run_dir, "finished")
    assert outcomes(state) == [("requeued", "SIGUSR2", "submit"), ("finished", None, "requeue")]
    assert 2 <= state.attempts[0].step < PLANNED_STEPS and state.attempts[1].step == PLANNED_STEPS
    wait_ended(reference, "finished")
    assert_runs_bitwise_equal(run_dir, reference)


# -- 4: exit 0 after a stop --------------------------------------------------------------------------------------
@pytest.mark.parametrize("records", [True, False], ids=["records", "no-records"])
@pytest.mark.parametrize("verb, outcome, signal_name", [("cancel", "cancelled", "SIGTERM"),
                                                         ("preempt", "requeued", "SIGUSR2")])
def test_an_exit_zero_after_a_stop_is_the_stops_outcome(
    command_runs: CommandRuns, records: bool, verb: str, outcome: str, signal_name: str
) -> None:
    """A command that exits 0 on a stop signal, whether or not it records `stopped`: the attempt takes
    the stop's outcome with a warning naming the protocol, and `elfes resume` (or the relaunch) trains on."""
    options = ["--on-stop", "exit-zero", *(["--records"] if records else [])]
    run_dir = command_runs.submit_command(f"exit-zero-{verb}-{records}",
                                          protocol_command(*options, units=300, unit_s=0.02))
    wait_for(lambda: tasks_running(run_dir, 1, 1) and trainer_counting(run_dir, 5), what="the command to count",
             run_dir=run_dir)
    assert cli(verb, str(run_dir))[0] == 0
    if verb == "cancel":
        state = ended_with_nothing_left(run_dir, "cancelled")
        assert cli("resume", str(run_dir))[0] == 0
    state = ended_with_nothing_left(run_dir, "finished")
    first = state.attempts[0]
    assert (first.outcome, first.signal) == (outcome, signal_name)
    assert f"the command exited 0 after {signal_name}" in first.error
    assert f"exits 128 + the signal's number ({128 + signal.Signals[signal_name]} for {signal_name})" in first.error
    assert "WARNING elfes: the command exited 0" in run_log(run_dir)  # the level once
    assert (run_dir / "count.txt").read_text() == "300"


def test_an_exit_zero_after_a_stop_that_finished_is_finished(command_runs: CommandRuns) -> None:
    """A command that finishes its training on SIGTERM and records `finished`: the run is finished."""
    run_dir = command_runs.submit_command("finishes-on-stop", protocol_command("--on-stop", "finish", "--records"))
    wait_for(lambda: tasks_running(run_dir, 1, 1) and trainer_counting(run_dir, 3), what="the command to count",
             run_dir=run_dir)
    assert cli("cancel", str(run_dir))[0] == 0
    state = ended_with_nothing_left(run_dir, "finished")
    assert outcomes(state) == [("finished", None, "submit")] and state.error is None
    # where the command computes is not looked into: its rank's place names the host only
    assert [(place.rank, place.device) for place in state.attempts[0].rank_places] == [(0, None)]


# -- 5: a command that ignores SIGTERM -----------------------------------------------------------------------------
@pytest.mark.parametrize("how, wrapped", [("SIG_IGN", False), ("handler", False), ("SIG_IGN", True)],
                         ids=["ignored", "caught-and-disregarded", "ignored-behind-a-wrapper"])
@pytest.mark.parametrize("cancels", [1, 2])
def test_a_command_ignoring_sigterm_is_killed_after_kill_wait(
    command_runs: CommandRuns, how: str, wrapped: bool, cancels: int
) -> None:
    """`elfes cancel` (once, or twice) of a command that ignores SIGTERM: cancel says SIGKILL follows after
    resources.kill_wait_s; the command is killed then and the run ends cancelled, saying so."""
    options = (["--catch", "SIGINT", "--ignore", "SIGTERM"] if how == "SIG_IGN"
               else ["--catch", "SIGINT,SIGTERM", "--on-stop", "carry-on"])
    run_dir = command_runs.submit_command(f"ignores-{how}-{wrapped}-{cancels}",
                                          protocol_command(*options, wrapped=wrapped, units=100000),
                                          resources={"nodes": 1, "tasks_per_node": 1, "gpus_per_node": 0,
                                                     "cpus_per_task": 1, "mem_gb": 1, "timeout_min": 10,
                                                     "kill_wait_s": 3})
    trainer = wait_for(lambda: tasks_running(run_dir, 1, 1) and trainer_counting(run_dir, 2),
                       what="the command to count", run_dir=run_dir)
    code, output = cli("cancel", str(run_dir))
    assert code == 0 and "SIGKILL 3 s later (resources.kill_wait_s)" in output, output
    wait_for(lambda: "SIGKILL follows in 3 s" in run_log(run_dir), what="the log to name the kill", run_dir=run_dir)
    if cancels == 2:
        assert cli("cancel", str(run_dir))[0] == 0
    state = wait_for(lambda: (s := state_of(run_dir)) is not None and s.status in run_state.ENDED and s,
                     what="the run to end", run_dir=run_dir, may_end=True, timeout_s=60)
    assert not alive(trainer)
    assert outcomes(state) == [("cancelled", "SIGTERM", "submit")], (outcomes(state), state.error)
    assert "did not exit within resources.kill_wait_s=3 s of SIGTERM and was killed (SIGKILL)" in state.error
    assert "sent SIGKILL" in run_log(run_dir)
    wait_ended(run_dir, "cancelled")


def test_kill_wait_s_is_a_spec_field_of_at_least_one_second(tmp_path: Path) -> None:
    """resources.kill_wait_s: 30 s by default (SLURM's KillWait default), any integer >= 1; 0 is refused,
    naming the field, the value and what is allowed."""
    from elfes.launcher.spec import load_spec

    assert load_spec(write_spec(tmp_path, "default-kill-wait")).resources.kill_wait_s == 30
    spec = write_spec(tmp_path, "kill-wait", resources={"kill_wait_s": 5})
    assert cli("validate", str(spec))[0] == 0 and load_spec(spec).resources.kill_wait_s == 5
    code, output = cli("validate", str(write_spec(tmp_path, "bad-kill-wait", resources={"kill_wait_s": 0})))
    assert code == 2 and "resources.kill_wait_s = 0" in output and "greater than or equal to 1" in output, output


def test_cancelling_a_command_that_catches_nothing_ends_it_cancelled_at_once(command_runs: CommandRuns) -> None:
    """`elfes cancel` of a command that catches no signal: the SIGTERM is not held for the command to start
    catching (a preemption's would be), its default action ends the command, and the run ends cancelled,
    well inside resources.kill_wait_s, saying that nothing was saved."""
    run_dir = command_runs.submit_command("cancel-catches-nothing", protocol_command("--catch", "", units=100_000),
                                          resources={"nodes": 1, "tasks_per_node": 1, "gpus_per_node": 0,
                                                     "cpus_per_task": 1, "mem_gb": 1, "timeout_min": 10,
                                                     "kill_wait_s": 20})
    wait_for(lambda: tasks_running(run_dir, 1, 1) and trainer_counting(run_dir, 1), what="the command to count",
             run_dir=run_dir)
    asked = time.monotonic()
    assert cli("cancel", str(run_dir))[0] == 0
    state = ended_with_nothing_left(run_dir, "cancelled")
    assert time.monotonic() - asked < 20, "ended by the kill after kill_wait_s, not by the SIGTERM"
    assert outcomes(state) == [("cancelled", "SIGTERM", "submit")], (outcomes(state), state.error)
    assert "the command did not catch SIGTERM and was killed by it" in state.error
    assert "(elfes cancel): no process of the command catches it; sent at once" in run_log(run_dir)
