"""A sweep as one SLURM job array on the private cluster: three members in `low` (two CPUs: two run, one
waits), one preempted by a job in `high`, one by `elfes preempt`; only those two requeue (each its own
array task, `scontrol requeue <array>_<task>`), and all three end bitwise equal to their twins run alone."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cluster import SlurmCluster
from run_comparison import assert_runs_bitwise_equal
from test_slurm_preemption import (
    ELFES,
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
    # submitit named all three pickles: the array's tasks will run, each its member's one trainer. The
    # members' state locks are taken first (flock, as elfes does), so elfes cannot record a job id before it dies.
    "after-the-pickles": """locked={locked}
( exec 3>>{members}/lr=0.01/.state.lock 4>>{members}/lr=0.02/.state.lock 5>>{members}/lr=0.03/.state.lock
  flock 3 && flock 4 && flock 5 && touch $locked
  while [ "$(ls {folder}/${{job}}_*_submitted.pkl 2>/dev/null | wc -l)" -lt 3 ]; do sleep 0.01; done
  kill -9 $submitter ) </dev/null >/dev/null 2>&1 &
while [ ! -e $locked ]; do sleep 0.01; done""",
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
        kill=KILL_AT[kill_at].format(folder=SweepPaths(sweep_dir).submitit, members=sweep_dir,
                                     locked=tmp_path / "locked")))
    wrapper.chmod(0o755)
    # Both CPUs held by another job: the array's tasks wait while the hand-over is settled.
    blocker = slurm.run("sbatch", "--parsable", "--partition=low", "--ntasks=1", "--cpus-per-task=2", "--mem=100M",
                        f"--output={tmp_path / 'blocker.out'}", "--wrap", "sleep 600").stdout.strip()
    killed = subprocess.run([ELFES, "submit", str(spec), "--executor", "slurm"], capture_output=True, text=True,
                            timeout=180, env={**slurm.env, "PATH": f"{wrapper.parent}:{os.environ['PATH']}"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
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
        else:
            assert not state.job_id.startswith(f"{array}_")  # its task was cancelled, the member handed over anew
    if kill_at == "before-the-pickles":
        tasks = slurm.run("sacct", "-n", "-X", "-P", "-o", "State", "-j", array).stdout.splitlines()
        assert tasks and {task.split()[0] for task in tasks} == {"CANCELLED"}, tasks  # "CANCELLED by 0"
