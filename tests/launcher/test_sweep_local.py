"""Sweeps end to end on the local executor: real members (submitit local jobs started by the sweep's
scheduler), held mid-run by a file so that the test decides when they finish (tests/launcher/sweep_entrypoints.py).
Every member ends bitwise equal (torch.equal on every tensor) to the same overrides submitted alone."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from launching import kill_local_run
from local_runs import REPOSITORY, Runs, state_of, tasks_running, trained_to, wait_ended, wait_for
from run_comparison import assert_runs_bitwise_equal

from elfes.launcher.cli.main import main as elfes
from elfes.launcher.rundir import state as run_state
from elfes.launcher.rundir.paths import RunPaths, SweepPaths
from elfes.launcher.rundir.sweep_record import load_sweep

# 128 samples, batches of 16, accumulation 2: 4 optimizer steps per epoch, 8 in all.
CONFIG = {"epochs": 2, "train_samples": 128, "log_every": 1}
ENTRYPOINT = "tests.launcher.sweep_entrypoints:held_quickstart"
TWINS = [(0.001, 0), (0.001, 1), (0.003, 0), (0.003, 1)]


def write_sweep(folder: Path, name: str, sweep: dict[str, Any], *, hold: Path | None = None) -> Path:
    spec = {
        "name": name, "entrypoint": ENTRYPOINT, "workdir": str(REPOSITORY), "run_dir": str(folder / name),
        "config": {**CONFIG, "hold_file": str(hold) if hold else "", "hold_after_batches": 4},
        "resources": {"nodes": 1, "tasks_per_node": 1, "gpus_per_node": 0, "cpus_per_task": 1, "mem_gb": 1,
                      "timeout_min": 10},
        "slurm": {"signal_delay_s": 60}, "requeue": {"max_requeues": 5}, "env": {"OMP_NUM_THREADS": "1"},
        "sweep": sweep,
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


class Sweeps:
    """Submits sweeps through the CLI and, at teardown, kills what is left of them (scheduler, members)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.sweep_dirs: list[Path] = []

    def submit(self, name: str, sweep: dict[str, Any], *, hold: Path | None = None) -> Path:
        spec = write_sweep(self.folder, name, sweep, hold=hold)
        self.sweep_dirs.append(self.folder / name)
        assert elfes(["submit", str(spec), "--executor", "local"]) == 0
        return self.folder / name

    def kill_leftovers(self) -> None:
        for sweep_dir in self.sweep_dirs:
            record = load_sweep(SweepPaths(sweep_dir))
            scheduler = record.scheduler or {}
            try:
                cmdline = Path(f"/proc/{scheduler.get('pid')}/cmdline").read_bytes()
                if b"commands.sweep.local" in cmdline:
                    os.kill(int(scheduler["pid"]), signal.SIGKILL)
            except (OSError, ValueError, TypeError):
                pass
            for member in record.members:
                kill_local_run(member.run_dir)


@pytest.fixture
def sweeps(tmp_path: Path) -> Iterator[Sweeps]:
    sweeps = Sweeps(tmp_path)
    yield sweeps
    sweeps.kill_leftovers()


@pytest.fixture(scope="module")
def twins(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[float, int], Path]]:
    """``twins(lr, seed)``: the run directory of the same job submitted alone with those overrides (all
    four are started on first use and train alongside the test's sweep)."""
    folder = tmp_path_factory.mktemp("twins")
    runs = Runs(folder)
    spec = write_sweep(folder, "twin", {"grid": {"config.lr": [0.1]}})
    data = yaml.safe_load(spec.read_text())
    del data["sweep"]
    spec.write_text(yaml.safe_dump(data))
    started: dict[tuple[float, int], Path] = {}

    def twin(lr: float, seed: int) -> Path:
        if not started:
            for each_lr, each_seed in TWINS:
                run_dir = folder / f"twin-{each_lr}-{each_seed}"
                runs.run_dirs.append(run_dir)
                assert elfes(["submit", str(spec), "--executor", "local", "--set", f"run_dir={run_dir}",
                              "--set", f"config.lr={each_lr}", "--set", f"config.seed={each_seed}"]) == 0
                started[(each_lr, each_seed)] = run_dir
        return started[(lr, seed)]

    yield twin
    runs.kill_leftovers()


def member_dir(sweep_dir: Path, name: str) -> Path:
    return sweep_dir / name


def assert_twin(run_dir: Path, twin: Path) -> None:
    wait_ended(twin, "finished")
    assert_runs_bitwise_equal(run_dir, twin)


def scheduler_gone(sweep_dir: Path) -> bool:
    return load_sweep(SweepPaths(sweep_dir)).scheduler is None


def most_at_once(run_dirs: list[Path]) -> int:
    """The most members handed over and not yet ended at one time (each submitted once, from state.json)."""
    moments = []
    for run_dir in run_dirs:
        state = state_of(run_dir)
        moments += [(state.submissions[0].at, 1), (state.attempts[-1].ended_at, -1)]
    running = peak = 0
    for _, change in sorted(moments):
        running += change
        peak = max(peak, running)
    return peak


def test_a_2x2_grid_with_max_parallel_2_runs_all_four_bitwise_equal_to_each_alone(sweeps: Sweeps, twins) -> None:
    twins(0.001, 0)
    sweep_dir = sweeps.submit("grid", {"grid": {"config.lr": [0.001, 0.003], "config.seed": [0, 1]},
                                       "max_parallel": 2})
    names = ["lr=0.001,seed=0", "lr=0.001,seed=1", "lr=0.003,seed=0", "lr=0.003,seed=1"]
    assert [member.name for member in load_sweep(SweepPaths(sweep_dir)).members] == names
    members = [member_dir(sweep_dir, name) for name in names]
    for run_dir in members:
        recorded = yaml.safe_load(RunPaths(run_dir).spec.read_text())
        assert "sweep" not in recorded and recorded["run_dir"] == str(run_dir)
    for run_dir in members:
        wait_ended(run_dir, "finished")
    wait_for(lambda: scheduler_gone(sweep_dir), what="the scheduler to exit", run_dir=members[-1], may_end=True)
    assert most_at_once(members) == 2
    submitted = [state_of(run_dir).submissions[0].at for run_dir in members]
    assert submitted == sorted(submitted)  # in order
    for run_dir, (lr, seed) in zip(members, [(0.001, 0), (0.001, 1), (0.003, 0), (0.003, 1)]):
        assert yaml.safe_load(RunPaths(run_dir).spec.read_text())["config"]["lr"] == lr
        assert_twin(run_dir, twins(lr, seed))
    # One code snapshot for the whole sweep, taken at its submission; every member ran it.
    snapshot = SweepPaths(sweep_dir).code / "1"
    assert [entry.name for entry in SweepPaths(sweep_dir).code.iterdir()] == ["1"]
    assert (snapshot / "tests" / "launcher" / "sweep_entrypoints.py").is_file()
    for run_dir in members:
        assert not RunPaths(run_dir).code.exists()
        assert [a.provenance.code.path for a in state_of(run_dir).attempts] == [str(snapshot)]
    # The sweep's goodput is its members' summed: wall times, parts and redone steps added.
    from elfes.launcher.commands.status import run_status
    from elfes.launcher.rundir.sweep_status import sweep_status

    each = [run_status(run_dir).goodput for run_dir in members]
    summed = sweep_status(sweep_dir).goodput
    assert summed["wall_s"] == pytest.approx(sum(g["wall_s"] for g in each), rel=1e-9)
    for part in summed["parts"]:
        assert summed["parts"][part] == pytest.approx(sum(g["parts"][part] for g in each), rel=1e-9, abs=1e-9), part
    assert summed["goodput"] == pytest.approx(summed["parts"]["useful_s"] / summed["wall_s"])


def test_a_preempted_member_requeues_alone_and_ends_bitwise(sweeps: Sweeps, twins, tmp_path: Path) -> None:
    twins(0.001, 0)
    hold = tmp_path / "hold"
    hold.touch()
    sweep_dir = sweeps.submit("preempt", {"members": [{"config.lr": 0.001, "config.seed": 0},
                                                      {"config.lr": 0.003, "config.seed": 1}]}, hold=hold)
    first, second = member_dir(sweep_dir, "lr=0.001,seed=0"), member_dir(sweep_dir, "lr=0.003,seed=1")
    for run_dir in (first, second):
        wait_for(lambda run_dir=run_dir: tasks_running(run_dir, 1, 1) and trained_to(run_dir, 1),
                 what="the member to train and hold", run_dir=run_dir)
    assert elfes(["preempt", str(first)]) == 0
    wait_for(lambda: tasks_running(first, 2, 1), what="the preempted member's relaunch", run_dir=first)
    hold.unlink()
    assert [a.outcome for a in wait_ended(first, "finished").attempts] == ["requeued", "finished"]
    assert state_of(first).requeues_used == 1
    other = wait_ended(second, "finished")
    assert [a.outcome for a in other.attempts] == ["finished"] and other.requeues_used == 0
    assert_twin(first, twins(0.001, 0))
    assert_twin(second, twins(0.003, 1))


def test_cancel_while_two_run_then_resume_finishes_only_the_unfinished(sweeps: Sweeps, twins, tmp_path: Path,
                                                                       capsys) -> None:
    twins(0.001, 0)
    hold = tmp_path / "hold"
    hold.touch()
    sweep_dir = sweeps.submit("cancel", {"members": [
        {"config.lr": 0.003, "config.seed": 1, "config.hold_file": ""},  # never held: finishes first
        {"config.lr": 0.001, "config.seed": 0}, {"config.lr": 0.001, "config.seed": 1}], "max_parallel": 2}, hold=hold)
    fast = member_dir(sweep_dir, "lr=0.003,seed=1,hold_file=")
    held = [member_dir(sweep_dir, "lr=0.001,seed=0"), member_dir(sweep_dir, "lr=0.001,seed=1")]
    wait_ended(fast, "finished")
    for run_dir in held:
        wait_for(lambda run_dir=run_dir: tasks_running(run_dir, 1, 1) and trained_to(run_dir, 1),
                 what="the member to train and hold", run_dir=run_dir)
    capsys.readouterr()
    assert elfes(["cancel", str(sweep_dir)]) == 0
    assert capsys.readouterr().out.count("sent SIGTERM") == 2
    for run_dir in held:
        wait_ended(run_dir, "cancelled")
    assert elfes(["status", str(sweep_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["counts"] == {"finished": 1, "cancelled": 2, "total": 3}
    hold.unlink()
    assert elfes(["resume", str(sweep_dir)]) == 0
    said = capsys.readouterr().out
    assert "resumed 2 member(s)" in said and "left alone: lr=0.003,seed=1,hold_file= (finished)" in said
    for run_dir in held:  # queued for the scheduler, which hands them over as slots free
        wait_for(lambda run_dir=run_dir: len(state_of(run_dir).submissions) == 2, what="the member's resume",
                 run_dir=run_dir, may_end=True)
        state = wait_ended(run_dir, "finished")
        assert [(a.launch, a.outcome) for a in state.attempts] == [("submit", "cancelled"), ("resume", "finished")]
    assert [(a.launch, a.outcome) for a in state_of(fast).attempts] == [("submit", "finished")]
    assert len(state_of(fast).submissions) == 1
    assert_twin(fast, twins(0.003, 1))
    assert_twin(held[0], twins(0.001, 0))
    assert_twin(held[1], twins(0.001, 1))
    assert run_state.load_state(RunPaths(fast)).status == "finished"
