"""A local sweep that never stalls unnoticed: a sweep folder left without a live scheduler (its submitter
killed before it started one, or the scheduler killed) is called stalled by every look at it and healed by
`elfes resume SWEEP_DIR`; a damaged member record is shown as such and costs the scheduler nothing; a
`sweep.json` of the wrong shape is refused by every verb with the file and the fix. The members are
torch-free `command:` jobs that end at once, so nothing trains."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from local_runs import REPOSITORY

from elfes.launcher.cli.main import main as elfes
from elfes.launcher.rundir import state as run_state
from elfes.launcher.rundir.liveness import local_processes
from elfes.launcher.rundir.paths import RunPaths, SweepPaths
from elfes.launcher.rundir.sweep_record import load_sweep, update_sweep
from elfes.launcher.spec.sweep import plan_sweep

GONE_PID = 4194999  # above any kernel's pid_max: no process has it
TIMEOUT_S = 120


def command_sweep(folder: Path, name: str = "heal", *, members: int = 2) -> Path:
    """A sweep spec of ``members`` torch-free command jobs that exit 0 at once, one at a time."""
    spec = {
        "name": name, "command": ["{python}", "-c", "pass"], "workdir": str(REPOSITORY), "run_dir": str(folder / name),
        "resources": {"nodes": 1, "tasks_per_node": 1, "gpus_per_node": 0, "cpus_per_task": 1, "mem_gb": 1,
                      "timeout_min": 5},
        "sweep": {"grid": {"env.MEMBER": [str(k) for k in range(members)]}, "max_parallel": 1},
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def created_without_scheduler(spec: Path) -> SweepPaths:
    """The sweep folder as `elfes submit` leaves it when killed right after writing sweep.json: every member
    queued, no scheduler started."""
    from elfes.launcher.commands.sweep.verbs import _code_plan, _create

    plan = plan_sweep(spec)
    plan.sweep_dir.mkdir(parents=True)
    _create(plan, "local", _code_plan(plan))
    return SweepPaths(plan.sweep_dir)


def wait_until(condition, what: str, paths: SweepPaths) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            log = paths.scheduler_log.read_text() if paths.scheduler_log.exists() else "(no scheduler.log)"
            pytest.fail(f"timed out waiting for {what}\nsweep.json: {paths.record.read_text()}\nscheduler.log:\n{log}")
        time.sleep(0.05)


@pytest.fixture
def leftovers() -> Iterator[list[SweepPaths]]:
    """Sweeps whose scheduler and members are killed at teardown, whatever the test left running."""
    sweeps: list[SweepPaths] = []
    yield sweeps
    for paths in sweeps:
        try:
            record = load_sweep(paths)
        except run_state.RunDamaged:
            continue
        pid = (record.scheduler or {}).get("pid")
        try:
            if pid and b"commands.sweep.local" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass
        for member in record.members:
            processes = local_processes(RunPaths(member.run_dir))
            for found in processes["controller"] + processes["task"]:
                try:
                    os.kill(found, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def test_a_sweep_without_a_live_scheduler_is_called_stalled_and_resume_starts_one(
    tmp_path: Path, capsys, leftovers: list[SweepPaths]
) -> None:
    paths = created_without_scheduler(command_sweep(tmp_path))
    leftovers.append(paths)
    update_sweep(paths, lambda r: __import__("dataclasses").replace(
        r, scheduler={"pid": GONE_PID, "host": "here", "started_at": run_state.now()}))  # a scheduler SIGKILLed

    assert elfes(["status", str(paths.sweep_dir)]) == 0
    shown = capsys.readouterr().out
    assert f"stalled: 2 member(s) wait for a slot and its scheduler (pid {GONE_PID} on here) is gone" in shown
    assert f"elfes resume {paths.sweep_dir}" in shown
    assert "n/a" not in shown  # a waiting member has no step yet: "-"
    assert json.loads(_json_status(paths, capsys))["stalled"].startswith("stalled: 2 member(s)")
    # A wait on a stalled sweep would never end: it says why at once (exit 3).
    assert elfes(["status", str(paths.sweep_dir), "--until", "ended"]) == 3
    assert "stalled: 2 member(s) wait for a slot" in capsys.readouterr().err

    assert elfes(["resume", str(paths.sweep_dir)]) == 0
    said = capsys.readouterr().out
    assert "no scheduler was alive; started one for the 2 waiting member(s)" in said
    # --until ended waits for every member (it returned at once before).
    assert elfes(["status", str(paths.sweep_dir), "--until", "ended", "--timeout-s", str(TIMEOUT_S)]) == 0, \
        capsys.readouterr()
    record = load_sweep(paths)
    states = [run_state.load_state(RunPaths(member.run_dir)) for member in record.members]
    assert [state.status for state in states] == ["finished", "finished"]
    assert [len(state.submissions) for state in states] == [1, 1]  # each handed over once
    wait_until(lambda: load_sweep(paths).scheduler is None, "the scheduler to exit", paths)
    assert not load_sweep(paths).queue and json.loads(_json_status(paths, capsys))["stalled"] is None


def _json_status(paths: SweepPaths, capsys) -> str:
    capsys.readouterr()
    elfes(["status", str(paths.sweep_dir), "--json"])
    return capsys.readouterr().out


def test_a_damaged_member_record_is_shown_unreadable_and_the_scheduler_goes_on_past_it(
    tmp_path: Path, capsys, leftovers: list[SweepPaths]
) -> None:
    from elfes.launcher.commands.sweep.local import run_scheduler

    paths = created_without_scheduler(command_sweep(tmp_path))
    leftovers.append(paths)
    record = load_sweep(paths)
    damaged, good = (RunPaths(member.run_dir) for member in record.members)
    damaged.state.write_text('{"status": 5}')

    assert elfes(["status", str(paths.sweep_dir)]) == 8  # a damaged run directory
    shown = capsys.readouterr().out
    assert "unreadable: " in shown and "status is 5 (an integer), not a string" in shown
    data = json.loads(_json_status(paths, capsys))
    (member,) = [m for m in data["members"] if m["run_dir"] == str(damaged.run_dir)]
    assert member["status"] == "unreadable" and "state.json" in member["error"]
    assert data["counts"] == {"unreadable": 1, "waiting": 1, "total": 2}

    # The scheduler works the queue (the damaged member first): it records that member's problem and goes on.
    assert run_scheduler(str(paths.sweep_dir)) == 0
    capsys.readouterr()
    after = load_sweep(paths)
    assert not after.queue and list(after.problems) == [record.members[0].name]
    assert "RunDamaged" in after.problems[record.members[0].name]
    assert run_state.load_state(good).submissions  # the good one was handed over
    assert elfes(["status", str(paths.sweep_dir), "--until", "ended", "--timeout-s", "1"]) == 8
    assert "unreadable" in capsys.readouterr().err

    # `elfes resume SWEEP_DIR` leaves the damaged member alone and says so (exit 8).
    assert elfes(["resume", str(paths.sweep_dir)]) == 8
    said = capsys.readouterr().out
    assert f"left alone: {record.members[0].name} (unreadable: " in said


def test_a_sweep_whose_submitter_was_killed_while_it_created_the_members_is_submitted_again(
    tmp_path: Path, capsys, leftovers: list[SweepPaths]
) -> None:
    """`elfes submit` SIGKILLed after it wrote some members' job.yaml, before sweep.json: the folder is named
    for what it is, and the same submit again creates the sweep (no member of it had been handed over)."""
    from elfes.files import write_text_atomically

    spec = command_sweep(tmp_path)
    plan = plan_sweep(spec)
    first = plan.members[0].spec
    first.run_dir.mkdir(parents=True)
    write_text_atomically(RunPaths(first.run_dir).spec, first.to_yaml())
    write_text_atomically(RunPaths(first.run_dir).code_record, "{}")  # written beside job.yaml, before sweep.json
    for verb in ("status", "resume"):
        assert elfes([verb, str(plan.sweep_dir)]) == 2
        said = capsys.readouterr().err
        assert "but no sweep.json: an `elfes submit` of a sweep was interrupted" in said, said
        assert "submit the sweep again" in said, said
    paths = SweepPaths(plan.sweep_dir)
    leftovers.append(paths)
    assert elfes(["submit", str(spec), "--executor", "local"]) == 0, capsys.readouterr().err
    assert elfes(["status", str(plan.sweep_dir), "--until", "ended", "--timeout-s", str(TIMEOUT_S)]) == 0
    states = [run_state.load_state(RunPaths(member.run_dir)) for member in load_sweep(paths).members]
    assert [len(state.submissions) for state in states] == [1, 1]

    # A member folder that holds more than the job.yaml of an interrupted creation is still refused.
    other = command_sweep(tmp_path, "other")
    member = plan_sweep(other).members[0].spec.run_dir
    member.mkdir(parents=True)
    (member / "state.json").write_text("{}")
    assert elfes(["submit", str(other), "--executor", "local"]) == 2
    assert "exists and is not empty" in capsys.readouterr().err


def test_a_look_at_the_sweep_while_resume_starts_its_scheduler_neither_writes_nor_keeps_it_from_starting(
    tmp_path: Path, capsys, leftovers: list[SweepPaths]
) -> None:
    """`elfes status` asks whether a scheduler lives by taking the scheduler lock for a moment; a resume that
    starts one in that moment must still start it (it said "started one" and left the sweep stalled)."""
    import subprocess

    paths = created_without_scheduler(command_sweep(tmp_path))
    leftovers.append(paths)
    assert elfes(["status", str(paths.sweep_dir)]) == 0
    assert not paths.scheduler_lock.exists()  # status writes nothing
    capsys.readouterr()
    paths.scheduler_lock.touch()
    hold = ("import fcntl, os, sys, time; lock = os.open(sys.argv[1], os.O_RDONLY); fcntl.flock(lock, fcntl.LOCK_SH); "
            "print('held', flush=True); time.sleep(0.5)")  # as a look at the sweep holds it, a moment longer
    looking = subprocess.Popen([sys.executable, "-c", hold, str(paths.scheduler_lock)], stdout=subprocess.PIPE,
                               text=True)
    try:
        assert looking.stdout.readline() == "held\n"
        assert elfes(["resume", str(paths.sweep_dir)]) == 0
    finally:
        looking.wait(timeout=TIMEOUT_S)
    assert "started one for the 2 waiting member(s)" in capsys.readouterr().out
    assert elfes(["status", str(paths.sweep_dir), "--until", "ended", "--timeout-s", str(TIMEOUT_S)]) == 0, \
        capsys.readouterr()


def test_a_scheduler_killed_mid_hand_over_leaves_no_member_holding_a_slot_for_good(
    tmp_path: Path, capsys, leftovers: list[SweepPaths]
) -> None:
    """The scheduler SIGKILLed after it recorded a member's hand-over ahead, before the member's job started:
    that member ("submitted") neither holds the only slot for good nor is taken off the queue as handed over;
    `elfes resume SWEEP_DIR` settles it and every member runs once."""
    import socket

    paths = created_without_scheduler(command_sweep(tmp_path))
    leftovers.append(paths)
    first = RunPaths(load_sweep(paths).members[0].run_dir)
    run_state.update_state(first, lambda s: run_state.record_submission(
        s, executor="local", kind="submit", max_requeues=3, host=socket.gethostname(), pid=GONE_PID,
        run_dir=str(first.run_dir)))
    update_sweep(paths, lambda r: __import__("dataclasses").replace(
        r, scheduler={"pid": GONE_PID, "host": socket.gethostname(), "started_at": run_state.now()}))

    assert elfes(["resume", str(paths.sweep_dir)]) == 0
    assert elfes(["status", str(paths.sweep_dir), "--until", "ended", "--timeout-s", str(TIMEOUT_S)]) == 0, \
        capsys.readouterr()
    states = [run_state.load_state(RunPaths(member.run_dir)) for member in load_sweep(paths).members]
    assert [state.status for state in states] == ["finished", "finished"]
    assert [len(state.attempts) for state in states] == [1, 1]  # each ran once


def test_a_slurm_sweep_member_whose_hand_over_was_cut_short_is_called_stalled(tmp_path: Path, capsys) -> None:
    """`elfes submit` of a SLURM sweep SIGKILLed between recording the hand-over ahead and sbatch's answer: the
    members say "submitted" and nothing will ever change that but `elfes resume SWEEP_DIR`; status says so and
    a wait stops at once (it waited forever)."""
    import socket

    from elfes.launcher.commands.sweep.verbs import _code_plan, _create

    plan = plan_sweep(command_sweep(tmp_path))
    plan.sweep_dir.mkdir(parents=True)
    _create(plan, "slurm", _code_plan(plan))
    paths = SweepPaths(plan.sweep_dir)
    first = RunPaths(load_sweep(paths).members[0].run_dir)
    run_state.update_state(first, lambda s: run_state.record_submission(
        s, executor="slurm", kind="submit", max_requeues=3, host=socket.gethostname(), pid=GONE_PID,
        submitit_folder=str(paths.submitit), array_task=0, run_dir=str(first.run_dir)))

    assert elfes(["status", str(paths.sweep_dir)]) == 0
    shown = capsys.readouterr().out
    said = (f"stalled: member {first.run_dir.name}'s hand-over was cut short (its submitter, pid {GONE_PID} on "
            f"{socket.gethostname()}, is gone)")
    assert said in shown and f"`elfes resume {paths.sweep_dir}` settles it" in shown, shown
    began = time.monotonic()
    assert elfes(["status", str(paths.sweep_dir), "--until", "ended", "--timeout-s", "60"]) == 3
    assert time.monotonic() - began < 30 and said in capsys.readouterr().err
    # Once submitit wrote the task's pickle, the queued task may run and record its start: not stalled.
    paths.submitit.mkdir()
    (paths.submitit / "7_0_submitted.pkl").touch()
    assert elfes(["status", str(paths.sweep_dir)]) == 0 and "stalled" not in capsys.readouterr().out


@pytest.mark.parametrize("content", [[], None, "members-run-dir", "queue-entry", "not-json"])
def test_a_sweep_json_of_the_wrong_shape_is_refused_by_every_verb(tmp_path: Path, capsys, content) -> None:
    paths = created_without_scheduler(command_sweep(tmp_path))
    good = json.loads(paths.record.read_text())
    if content == "members-run-dir":
        good["members"][0]["run_dir"] = 7
        text = json.dumps(good)
    elif content == "queue-entry":
        good["queue"] = [1]
        text = json.dumps(good)
    elif content == "not-json":
        text = "{"
    else:
        text = json.dumps(content)
    paths.record.write_text(text)
    for verb in (["status"], ["status", "--json"], ["resume"], ["cancel"], ["plot"]):
        assert elfes([verb[0], str(paths.sweep_dir), *verb[1:]]) == 8, verb  # a damaged run directory
        error = capsys.readouterr().err
        assert f"{paths.record} cannot be read" in error and "restore it" in error, (verb, error)
        assert "Traceback" not in error


def test_a_requeue_under_way_counts_before_the_relaunch() -> None:
    state = run_state.record_submission(None, executor="slurm", kind="submit", max_requeues=3, run_dir="runs/requeued")
    state = run_state.mark_pending(state, job_id="7_1")
    state = run_state.begin_attempt(state, token="7_1:0/1", job_id="7_1", launch="submit", hosts=["h"], world_size=1)
    state = run_state.end_attempt(state, token="7_1:0/1", outcome="requeued", signal="SIGUSR2", step=3)
    assert (state.status, state.requeues_used, state.requeues_left) == ("requeued", 1, 2)
    state = run_state.begin_attempt(state, token="7_1:1/1", job_id="7_1", launch="requeue", hosts=["h"], world_size=1)
    assert state.requeues_used == 1  # the relaunch is the same requeue


def test_a_member_whose_state_json_is_a_dangling_link_is_unreadable_and_the_advice_resumes_the_sweep(
    tmp_path: Path, capsys, leftovers: list[SweepPaths]
) -> None:
    """A dangling symbolic link is no run that never started: `unreadable: <why>` (exit 8), with the repair of a
    sweep member (`elfes resume SWEEP_DIR`, not `elfes submit MEMBER/job.yaml`), and the repair works."""
    spec = command_sweep(tmp_path)
    assert elfes(["submit", str(spec), "--executor", "local"]) == 0
    paths = SweepPaths(tmp_path / "heal")
    leftovers.append(paths)
    assert elfes(["status", str(paths.sweep_dir), "--until", "ended", "--timeout-s", str(TIMEOUT_S)]) == 0
    damaged, good = (RunPaths(member.run_dir) for member in load_sweep(paths).members)
    damaged.state.unlink()
    damaged.state.symlink_to(tmp_path / "gone.json")
    capsys.readouterr()

    assert elfes(["status", str(paths.sweep_dir)]) == 8
    shown = capsys.readouterr().out
    assert f"unreadable: {damaged.state} cannot be read: it is a symbolic link to {tmp_path / 'gone.json'}" in shown
    (member,) = [m for m in json.loads(_json_status(paths, capsys))["members"] if m["run_dir"] == str(damaged.run_dir)]
    assert member["status"] == "unreadable"
    assert f"elfes resume {paths.sweep_dir}" in member["error"] and "elfes submit" not in member["error"]
    assert elfes(["status", str(damaged.run_dir)]) == 8  # the member alone, as any run
    assert "symbolic link" in capsys.readouterr().out

    damaged.state.rename(f"{damaged.state}.damaged")  # the advice, followed
    assert elfes(["resume", str(paths.sweep_dir)]) == 0
    said = capsys.readouterr().out
    assert "resumed 1 member(s)" in said and f"left alone: {load_sweep(paths).members[1].name} (finished)" in said
    assert elfes(["status", str(paths.sweep_dir), "--until", "ended", "--timeout-s", str(TIMEOUT_S)]) == 0
    assert run_state.load_state(damaged).status == "finished" and len(run_state.load_state(good).submissions) == 1


def test_a_state_json_that_is_not_a_regular_file_is_unreadable_not_missing(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "run")
    paths.state.mkdir(parents=True)
    with pytest.raises(run_state.RunDamaged, match=r"cannot be read: it is a folder .*\(elfes submit "):
        run_state.load_state(paths)
    paths.state.rmdir()
    os.mkfifo(paths.state)  # reading it would block
    with pytest.raises(run_state.RunDamaged, match="it is not a regular file"):
        run_state.load_state(paths)


def test_cancelling_a_slurm_sweep_reaches_the_later_arrays_first(tmp_path: Path, monkeypatch) -> None:
    """Arrays 10 and 20 chained (`afterany:10`), a member resumed alone (job 30): the cancel reaches array 20 before
    array 10, whose end would let 20 start, and each array's last task first (a throttled task waits for a running
    one). Unit level: which order would make SLURM start a dependent is a race the cluster cannot show on demand."""
    from types import SimpleNamespace

    from elfes.launcher.commands.sweep import verbs as sweep_commands
    from elfes.launcher.rundir.sweep_record import MemberRecord, SweepJob, SweepRecord, save_sweep

    paths = SweepPaths(tmp_path / "sweep")
    paths.sweep_dir.mkdir()
    jobs = {"a": "10_0", "b": "10_1", "c": "20_0", "d": "20_1", "e": "30", "f": "10_2"}
    members = tuple(MemberRecord(k, name, str(paths.sweep_dir / name), {}) for k, name in enumerate(jobs))
    save_sweep(paths, SweepRecord(name="sweep", executor="slurm", max_parallel=2, members=members, jobs=(
        SweepJob(job_id="10", kind="submit", members=("a", "b", "f"), at="t", max_parallel=2),
        SweepJob(job_id="20", kind="submit", members=("c", "d"), at="t", max_parallel=2))))
    statuses = {"a": "running", "b": "running", "c": "pending", "d": "pending", "e": "running", "f": "finished"}
    shown = [SimpleNamespace(name=name, run_dir=paths.sweep_dir / name, status=statuses[name], executor="slurm",
                             job_id=job_id) for name, job_id in jobs.items()]
    monkeypatch.setattr(sweep_commands, "sweep_status", lambda sweep_dir, record: SimpleNamespace(members=shown))
    reached: list[str] = []
    monkeypatch.setattr(sweep_commands, "cancel", lambda run_dir: reached.append(Path(run_dir).name))
    sweep_commands.cancel_sweep(paths.sweep_dir)
    assert reached == ["e", "d", "c", "b", "a"]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-n", "0"]))
