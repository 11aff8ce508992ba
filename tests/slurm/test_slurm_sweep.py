"""A sweep as one SLURM job array on the private cluster: three members in `low` (two CPUs: two run, one
waits), one preempted by a job in `high`, one by `elfes preempt`; only those two requeue (each its own
array task, `scontrol requeue <array>_<task>`), and all three end bitwise equal to their twins run alone."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from cluster import SlurmCluster, wait_for
from run_comparison import assert_runs_bitwise_equal
from slurm_runs import (
    ELFES,
    REPOSITORY,
    diagnostics,
    elfes,
    preempt_with_a_high_job,
    state_of,
    training_from,
    wait_ended,
    wait_run,
    write_spec,
)

from elfes.launcher.rundir.paths import RunPaths, SweepPaths
from elfes.launcher.rundir.sweep_record import load_sweep

LRS = (0.01, 0.02, 0.03)


def sweep_spec(folder: Path, name: str, *, step_delay_s: float) -> Path:
    spec = write_spec(folder, name, step_delay_s=step_delay_s)
    data = json.loads(spec.read_text())
    data["sweep"] = {"grid": {"config.lr": list(LRS)}, "max_parallel": 3}
    spec.write_text(json.dumps(data))
    return spec


@pytest.fixture
def twins(tmp_path: Path) -> Iterator[Callable[[float], Path]]:
    """``twins(lr)``: the same job with that lr run alone (the local executor, unslowed), all started at once."""
    folder = tmp_path / "twins"
    folder.mkdir()
    spec = write_spec(folder, "twin", step_delay_s=0.0)
    run_dirs = {}
    for lr in LRS:
        run_dirs[lr] = folder / f"twin-{lr}"
        elfes(None, "submit", str(spec), "--executor", "local", "--set", f"run_dir={run_dirs[lr]}",
              "--set", f"config.lr={lr}")
    yield run_dirs.__getitem__
    from elfes.launcher.rundir.liveness import local_processes

    for run_dir in run_dirs.values():
        for pid in sum(local_processes(RunPaths(run_dir)).values(), []):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_an_array_member_preempted_requeues_alone_and_all_end_bitwise(
    slurm_user_signal: SlurmCluster, tmp_path: Path, twins: Callable[[float], Path]
) -> None:
    slurm = slurm_user_signal
    twins(LRS[0])
    submitted = elfes(slurm, "submit", str(sweep_spec(tmp_path, "sweep", step_delay_s=0.4)), "--executor", "slurm")
    assert "sweep of 3 member(s), at most 3 at once, as SLURM job array" in submitted.stdout
    sweep_dir = tmp_path / "sweep"
    record = load_sweep(SweepPaths(sweep_dir))
    (array,) = record.jobs
    members = [Path(member.run_dir) for member in record.members]
    assert [state_of(run_dir).job_id for run_dir in members] == [f"{array.job_id}_{k}" for k in range(3)]
    assert any("#SBATCH --array=0-2%3" in script.read_text() for script in (sweep_dir / "submitit").rglob("*.sh"))

    # Two CPUs: two members train, the third waits. A one-CPU job in `high` preempts one of the two.
    running = wait_run(members[0], lambda: [m for m in members if training_from(m, 2)] if sum(
        training_from(m, 2) for m in members) >= 2 else None, "two members to train to step 2")
    preemptor = preempt_with_a_high_job(slurm, tmp_path)
    by_high = wait_run(members[0], lambda: next((m for m in running if state_of(m).attempts[0].outcome == "requeued"),
                                                None), "the high job to preempt one member")
    # `elfes preempt` the other one once it trains (it may have to wait no longer than the preemptor's run).
    other = next(m for m in running if m != by_high)
    elfes(slurm, "preempt", str(other))
    by_hand = wait_run(other, lambda: state_of(other).attempts[0].outcome == "requeued" and other,
                       "`elfes preempt` to requeue the member")
    untouched = next(m for m in members if m not in (by_high, by_hand))

    for run_dir in members:
        wait_ended(run_dir, "finished")
    for run_dir in (by_high, by_hand):
        state = state_of(run_dir)
        assert state.requeues_used == 1 and [a.outcome for a in state.attempts] == ["requeued", "finished"]
        assert {a.job_id for a in state.attempts} == {state.job_id}  # the same array task came back
    state = state_of(untouched)
    assert state.requeues_used == 0 and [a.outcome for a in state.attempts] == ["finished"]
    status = json.loads(elfes(slurm, "status", str(sweep_dir), "--json").stdout)
    assert status["counts"] == {"finished": 3, "total": 3}
    assert sorted(m["requeues_used"] for m in status["members"]) == [0, 1, 1]
    assert preemptor
    for run_dir, lr in zip(members, LRS):
        wait_ended(twins(lr), "finished")
        assert_runs_bitwise_equal(run_dir, twins(lr))
    # The sweep's one code snapshot, taken at its submission, is what every attempt of every member ran.
    snapshot = str(SweepPaths(sweep_dir).code / "1")
    assert [entry.name for entry in SweepPaths(sweep_dir).code.iterdir()] == ["1"]
    assert {a.provenance.code.path for run_dir in members for a in state_of(run_dir).attempts} == {snapshot}


# -- a hand-over of the array cut short by a SIGKILL -----------------------------------------------------------
KILL_SUBMITTER = """#!/bin/bash
# sbatch, then the submitter (its parent, `elfes submit`) is SIGKILLed {when}: between sbatch's answer and
# elfes recording the job ids in the members' state.json.
answer=$({sbatch} "$@") || {{ code=$?; echo "$answer"; exit $code; }}
job=$(echo "$answer" | grep -o '[0-9][0-9]*' | tail -n 1)
echo "$job" > {record}
submitter=$PPID
{kill}
echo "$answer"
"""
KILL_AT = {
    # submitit has not yet named the tasks' pickles after the array: its tasks can never run
    "before-the-pickles": "kill -9 $submitter",
    # submitit named all three pickles: the array's tasks will run, each its member's one trainer. elfes holds the
    # members' state locks through the hand-over; a FIFO at the temporary name of its first record of a job id
    # (member 0's state.json, written by this submitter) holds it there until it dies. That name holds the room
    # reserved for the record (a file of spaces) until then: the FIFO takes its place.
    "after-the-pickles": """rm -f {members}/lr=0.01/.tmp-state.json.$submitter
mkfifo {members}/lr=0.01/.tmp-state.json.$submitter
( while [ "$(ls {folder}/${{job}}_*_submitted.pkl 2>/dev/null | wc -l)" -lt 3 ]; do sleep 0.01; done
  kill -9 $submitter ) </dev/null >/dev/null 2>&1 &""",
}


@pytest.mark.parametrize("kill_at", list(KILL_AT))
def test_a_sweep_submitter_killed_mid_hand_over_leaves_each_member_one_trainer(
    slurm: SlurmCluster, tmp_path: Path, kill_at: str
) -> None:
    """The members say "submitted" and the array is queued but unrecorded. ``elfes resume`` of one member and
    of the sweep adopt each member's task (its pickle is there) or cancel it (it could never run) and hand
    the member over anew: every member ends finished after exactly one attempt, so no member ran twice."""
    import shutil
    import subprocess

    spec = sweep_spec(tmp_path, "sweep", step_delay_s=0.0)
    sweep_dir = tmp_path / "sweep"
    record = tmp_path / "array-job-id"
    wrapper = tmp_path / "bin" / "sbatch"
    wrapper.parent.mkdir()
    wrapper.write_text(KILL_SUBMITTER.format(
        when=kill_at, sbatch=shutil.which("sbatch"), record=record,
        kill=KILL_AT[kill_at].format(folder=SweepPaths(sweep_dir).submitit, members=sweep_dir)))
    wrapper.chmod(0o755)
    # Both CPUs held by another job: the array's tasks wait while the hand-over is settled.
    blocker = slurm.run("sbatch", "--parsable", "--partition=low", "--ntasks=1", "--cpus-per-task=2", "--mem=100M",
                        f"--output={tmp_path / 'blocker.out'}", "--wrap", "sleep 600").stdout.strip()
    killed = subprocess.run([ELFES, "submit", str(spec), "--executor", "slurm"], capture_output=True, text=True,
                            timeout=180, env={**slurm.env, "PATH": f"{wrapper.parent}:{os.environ['PATH']}"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    for left in sweep_dir.glob("*/.tmp-state.json.*"):  # what the killed submitter was writing
        left.unlink()
    array = record.read_text().strip()
    members = [Path(member.run_dir) for member in load_sweep(SweepPaths(sweep_dir)).members]
    assert {state_of(m).status for m in members} == {"submitted"}

    one = elfes(slurm, "resume", str(members[0]))
    everyone = elfes(slurm, "resume", str(sweep_dir))
    if kill_at == "after-the-pickles":
        assert "an interrupted submission had started it" in one.stdout
    assert "submitted" not in {state_of(m).status for m in members}, everyone.stdout
    slurm.run("scancel", blocker)

    for run_dir in members:
        state = wait_ended(run_dir, "finished")
        assert [a.outcome for a in state.attempts] == ["finished"], diagnostics(run_dir)
        if kill_at == "after-the-pickles":
            assert state.job_id.partition("_")[0] == array  # the interrupted hand-over's task, adopted
            assert array in {job.job_id for job in load_sweep(SweepPaths(sweep_dir)).jobs}  # and recorded
        else:
            assert not state.job_id.startswith(f"{array}_")  # its task was cancelled, the member handed over anew
    if kill_at == "before-the-pickles":
        tasks = slurm.run("sacct", "-n", "-X", "-P", "-o", "State", "-j", array).stdout.splitlines()
        assert tasks and {task.split()[0] for task in tasks} == {"CANCELLED"}, tasks  # "CANCELLED by 0"


# -- many tiny members: arrays cut at MaxArraySize, chained so that max_parallel holds across them -----------------
def chain_sweep(folder: Path, name: str, members: list[dict[str, Any]], *, max_parallel: int, units: int = 20) -> Path:
    """A sweep of torch-free chain_command members (``members``: each one's overrides) in partition ``shared``,
    where 4 jobs share a CPU: the throttle, not the CPUs, limits how many run at once."""
    spec = folder / f"{name}.yaml"
    spec.write_text(json.dumps({
        "name": name, "workdir": str(REPOSITORY), "run_dir": str(folder / name),
        "command": ["{python}", "-m", "tests.slurm.chain_command", "--run-dir", "{run_dir}", "--units", str(units)],
        "config": {"member": 0, "hold": ""},
        "resources": {"nodes": 1, "tasks_per_node": 1, "gpus_per_node": 0, "cpus_per_task": 1, "mem_gb": 0.25,
                      "timeout_min": 5},
        "slurm": {"partition": "shared", "signal_delay_s": 60}, "requeue": {"max_requeues": 3},
        "env": {"PYTHONPATH": str(REPOSITORY)},
        "sweep": {"members": members, "max_parallel": max_parallel},
    }))
    return spec


def task_intervals(slurm: SlurmCluster, arrays: list[str], tasks: int) -> list[tuple[str, datetime, datetime]]:
    """Every run of every task of ``arrays`` (requeued runs too, from ``sacct --duplicates``): (task, start, end),
    once sacct has all ``tasks`` completed (slurmdbd records them a moment after they end)."""
    found: list[tuple[str, datetime, datetime]] = []

    def complete() -> bool:
        listed = slurm.run("sacct", "-n", "-X", "-P", "--duplicates", "-o", "JobID,Start,End,State",
                           "-j", ",".join(arrays)).stdout.splitlines()
        found[:] = []
        completed = set()
        for line in listed:
            task, start, end, state = line.split("|", 3)
            if start not in ("Unknown", "None", "") and end not in ("Unknown", "None", ""):
                found.append((task, datetime.fromisoformat(start), datetime.fromisoformat(end)))
                if state.startswith("COMPLETED"):
                    completed.add(task)
        return len(completed) == tasks

    wait_for(complete, timeout_s=60, what=f"sacct to record {tasks} completed tasks", interval_s=0.5)
    return found


def most_at_once(intervals: list[tuple[str, datetime, datetime]]) -> int:
    """The most task runs alive at one time ([start, end): one that ends as another starts is not two)."""
    moments = sorted([(start, 1) for _, start, _ in intervals] + [(end, -1) for _, _, end in intervals],
                     key=lambda moment: (moment[0], moment[1]))
    alive = peak = 0
    for _, change in moments:
        alive += change
        peak = max(peak, alive)
    return peak


def test_a_sweep_larger_than_max_array_size_runs_as_chained_arrays_never_above_max_parallel(
    slurm_user_signal: SlurmCluster, tmp_path: Path
) -> None:
    """25 members against MaxArraySize=10: three arrays (10, 10, 5), each after the one before, never more than
    max_parallel=4 tasks at once (sacct), every member finished once; one preempted in the second array while
    its siblings wait (`elfes preempt` answers at once) resumes bitwise."""
    from chain_command import expected

    slurm = slurm_user_signal
    assert slurm.max_array_size == 10
    hold = tmp_path / "hold"
    hold.touch()
    held = 12  # in the second array
    members = [{"config.member": k} if k != held else {"config.member": k, "config.hold": str(hold)} for k in range(25)]
    spec = chain_sweep(tmp_path, "many", members, max_parallel=4)
    dry = elfes(slurm, "submit", str(spec), "--executor", "slurm", "--dry-run").stdout
    assert dry.count("#SBATCH --array=") == 3 and "--dependency=afterany:<job array 2>" in dry
    assert not (tmp_path / "many").exists()
    submitted = elfes(slurm, "submit", str(spec), "--executor", "slurm")
    sweep_dir = tmp_path / "many"
    record = load_sweep(SweepPaths(sweep_dir))
    assert [len(job.members) for job in record.jobs] == [10, 10, 5], submitted.stdout
    arrays = [job.job_id for job in record.jobs]
    run_dirs = {int(member.overrides["config.member"]): Path(member.run_dir) for member in record.members}
    target = run_dirs[held]
    assert state_of(target).job_id == f"{arrays[1]}_2"

    wait_run(target, lambda: (s := state_of(target)).status == "running" and s.attempts and (
        RunPaths(target).run_dir / "chain.json").is_file(), "the held member of the second array to run")
    siblings = slurm.run("squeue", "-h", "-r", "-t", "PD", "-j", arrays[1], "-o", "%i").stdout.split()
    assert siblings, "other tasks of its array wait (SLURM then answers `scancel --signal` with `try again later`)"
    began = time.monotonic()
    preempted = elfes(slurm, "preempt", str(target))
    assert time.monotonic() - began < 25 and "sent SIGUSR2" in preempted.stdout, preempted
    wait_run(target, lambda: state_of(target).attempts[0].outcome == "requeued", "the preempted member's requeue")
    hold.unlink()

    for k, run_dir in run_dirs.items():
        state = wait_ended(run_dir, "finished")
        assert len(state.submissions) == 1, diagnostics(run_dir)
        assert [a.outcome for a in state.attempts] == (["requeued", "finished"] if k == held else ["finished"])
        assert json.loads((run_dir / "chain.json").read_text()) == expected(k, 20), diagnostics(run_dir)
    assert state_of(target).requeues_used == 1
    intervals = task_intervals(slurm, arrays, 25)
    assert most_at_once(intervals) <= 4, intervals
    assert most_at_once(intervals) >= 3  # the throttle, not the CPUs, held them back
    for before, after in zip(arrays, arrays[1:]):
        ended = max(end for task, _, end in intervals if task.startswith(f"{before}_"))
        started = min(start for task, start, _ in intervals if task.startswith(f"{after}_"))
        assert started >= ended, (before, after, intervals)


SBATCH_WRAPPER = """#!/bin/bash
# sbatch as the test wants it: the Nth call refused ({refuse}), or the submitter Ctrl-C'd while it waits for sbatch.
calls=$(( $(cat {count} 2>/dev/null || echo 0) + 1 )); echo $calls > {count}
if [ -e {refuse} ] && [ "$calls" = "$(cat {refuse})" ]; then
    echo "sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified" >&2
    exit 1
fi
if [ -e {interrupt} ]; then kill -INT $PPID; fi
exec {sbatch} "$@"
"""


SQUEUE_WRAPPER = """#!/bin/bash
# squeue failing while {fail} exists, as a controller that does not answer.
if [ -e {fail} ]; then echo "squeue: error: Socket timed out on send/recv operation" >&2; exit 1; fi
exec {squeue} "$@"
"""


def test_a_refused_second_array_keeps_the_sweep_and_resume_chains_after_the_live_array(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """sbatch refuses the second of two arrays: the first stays queued, its members' folders stay, the refused
    members are recorded (exit 3). `elfes resume SWEEP_DIR` while the first array still runs hands them over as
    an array that waits for it (max_parallel holds across both), and a Ctrl-C during that hand-over is held
    until it is recorded (exit 130)."""
    import shutil
    import subprocess

    folder = tmp_path / "bin"
    folder.mkdir()
    count, refuse, interrupt = tmp_path / "calls", tmp_path / "refuse", tmp_path / "interrupt"
    (folder / "sbatch").write_text(SBATCH_WRAPPER.format(count=count, refuse=refuse, interrupt=interrupt,
                                                         sbatch=shutil.which("sbatch")))
    (folder / "sbatch").chmod(0o755)
    squeue_fails = tmp_path / "squeue-fails"
    (folder / "squeue").write_text(SQUEUE_WRAPPER.format(fail=squeue_fails, squeue=shutil.which("squeue")))
    (folder / "squeue").chmod(0o755)
    environment = {**slurm.env, "PATH": f"{folder}:{os.environ['PATH']}"}
    refuse.write_text("2")
    spec = chain_sweep(tmp_path, "split", [{"config.member": k} for k in range(12)], max_parallel=3)
    refused = subprocess.run([ELFES, "submit", str(spec), "--executor", "slurm"], capture_output=True, text=True,
                             timeout=180, env=environment)
    assert refused.returncode == 3, refused
    assert "Invalid account" in refused.stderr and "2 member(s) were not handed over" in refused.stderr
    sweep_dir = tmp_path / "split"
    record = load_sweep(SweepPaths(sweep_dir))
    (first,) = record.jobs
    assert len(first.members) == 10 and sorted(record.problems) == [m.name for m in record.members[10:]]
    left = [Path(member.run_dir) for member in record.members[10:]]
    assert all(state_of(run_dir) is None and (run_dir / "job.yaml").is_file() for run_dir in left)
    status = json.loads(elfes(slurm, "status", str(sweep_dir), "--json").stdout)
    assert status["counts"]["not started"] == 2

    refuse.unlink()
    squeue_fails.touch()  # not knowing which arrays still run, a new array could run past max_parallel: refused
    blind = subprocess.run([ELFES, "resume", str(sweep_dir)], capture_output=True, text=True, timeout=180,
                           env=environment)
    assert blind.returncode == 3 and "cannot tell which of the sweep's job arrays" in blind.stderr, blind
    assert "Socket timed out" in blind.stderr and "nothing was handed over" in blind.stderr
    assert len(load_sweep(SweepPaths(sweep_dir)).jobs) == 1 and all(state_of(run_dir) is None for run_dir in left)
    squeue_fails.unlink()
    interrupt.touch()
    assert slurm.run("squeue", "-h", "-j", first.job_id, "-o", "%i").stdout.strip(), "the first array still runs"
    resumed = subprocess.run([ELFES, "resume", str(sweep_dir)], capture_output=True, text=True, timeout=180,
                             env=environment)
    assert resumed.returncode == 130, resumed
    assert "interrupted by SIGINT; the sweep was handed over first" in resumed.stderr
    record = load_sweep(SweepPaths(sweep_dir))
    assert [len(job.members) for job in record.jobs] == [10, 2] and not record.problems
    second = record.jobs[1].job_id
    dependency = slurm.run("scontrol", "show", "job", second).stdout
    assert f"afterany:{first.job_id}" in dependency or "Dependency=(null)" in dependency  # (null): it was met already
    for member in record.members:
        state = wait_ended(Path(member.run_dir), "finished")
        assert [a.outcome for a in state.attempts] == ["finished"]
    intervals = task_intervals(slurm, [first.job_id, second], 12)
    assert most_at_once(intervals) <= 3, intervals
    ended = max(end for task, _, end in intervals if task.startswith(f"{first.job_id}_"))
    assert min(start for task, start, _ in intervals if task.startswith(f"{second}_")) >= ended, (second, intervals)


def test_resume_chains_a_new_array_after_an_array_that_an_interrupted_hand_over_queued(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """An array that `elfes submit` queued but did not record (SIGKILLed between sbatch and sweep.json; each of
    its members adopted its task) still runs (held here: the test ends before it does): `elfes resume SWEEP_DIR`
    hands the other members over as an array that waits for it, else both run at once, above max_parallel."""
    import dataclasses

    from elfes.launcher.rundir.sweep_record import update_sweep

    hold = tmp_path / "hold"
    hold.touch()
    spec = chain_sweep(tmp_path, "adopted", [{"config.member": 0, "config.hold": str(hold)},
                                             *({"config.member": k} for k in range(1, 12))], max_parallel=3)
    elfes(slurm, "submit", str(spec), "--executor", "slurm")
    paths = SweepPaths(tmp_path / "adopted")
    first, second = load_sweep(paths).jobs
    # As a kill between sbatch and sweep.json leaves it: the first array queued but unrecorded, the members
    # of the second never handed over.
    for member in second.members:
        elfes(slurm, "cancel", str(paths.sweep_dir / member))
    def cancelled() -> set[str]:
        shown = json.loads(elfes(slurm, "status", str(paths.sweep_dir), "--json").stdout)
        return {member["name"] for member in shown["members"] if member["status"] == "cancelled"}

    wait_for(lambda: cancelled() == set(second.members), timeout_s=60, what="the second array's members to end "
             "cancelled", interval_s=0.5)
    update_sweep(paths, lambda r: dataclasses.replace(r, jobs=(second,)))
    held = paths.sweep_dir / first.members[0]
    wait_run(held, lambda: (held / "chain.json").is_file(), "the held member of the first array to run")

    elfes(slurm, "resume", str(paths.sweep_dir))
    jobs = {job.job_id: job for job in load_sweep(paths).jobs}
    assert first.job_id in jobs and len(jobs) == 3, jobs  # the adopted array recorded, and one new
    (third,) = [job_id for job_id in jobs if job_id not in (first.job_id, second.job_id)]
    assert f"afterany:{first.job_id}" in slurm.run("scontrol", "show", "job", third).stdout
    elfes(slurm, "cancel", str(paths.sweep_dir))  # the held member ends cancelled rather than requeued by a scancel
