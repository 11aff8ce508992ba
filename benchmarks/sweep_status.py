"""Scale: wall time of ``elfes status`` over 1,000 finished sweep members (``status SWEEP_DIR`` and
``status`` of the 1,000 run directories given one by one), over 1,000 members whose jobs vanished (each
counted lost, with why), of ``status``, ``logs`` and ``plot`` (with its peak memory) for one run whose
``events.jsonl`` has 1,000,002 lines (~100 MB) and whose log is 200 MB, and of ``plot`` of a sweep of 100
members (500 steps each, an evaluation of two metrics every 50).

The run directories are synthetic (state.json written through launcher/rundir/state.py's transitions once and
copied, a short events.jsonl each): no job runs. Smoke sizes: 50 members, 10 to plot, 10,002 lines, 2 MB of log.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from elfes.launcher.rundir import state as run_state
from elfes.launcher.rundir.paths import RunPaths, SweepPaths
from elfes.launcher.rundir.sweep_record import MemberRecord, SweepRecord, save_sweep

from .login import elfes_command
from .measure import Progress, Row, child_environment

TIME = "2026-01-02T03:04:05.000+00:00"
BUDGET = {"epochs": 1, "planned_steps": 100}


def _event_lines(steps: int) -> str:
    lines = [{"event": "started", "time": TIME, "budget": BUDGET}]
    lines += [{"event": "train", "time": TIME, "step": step, "planned_steps": 100, "metrics": {"loss": 1 / step}}
              for step in range(1, steps + 1)]
    lines += [{"event": "evaluation", "time": TIME, "step": steps, "monitor": "validation/loss",
               "best_metric": 1 / steps, "best_step": steps}, {"event": "finished", "time": TIME, "step": steps}]
    return "".join(json.dumps(line) + "\n" for line in lines)


def _finished_run(paths: RunPaths, job_id: str) -> None:
    paths.run_dir.mkdir(parents=True)
    paths.spec.write_text(f"name: bench\nentrypoint: m:f\nrun_dir: {paths.run_dir}\n")
    token = f"{job_id}:0/1"
    run_state.update_state(paths, lambda s: run_state.record_submission(s, executor="local", kind="submit",
                                                                        max_requeues=3, run_dir=str(paths.run_dir)))
    run_state.update_state(paths, lambda s: run_state.mark_pending(s, job_id=job_id))
    run_state.update_state(paths, lambda s: run_state.begin_attempt(s, token=token, job_id=job_id, launch="submit",
                                                                    hosts=["h"], world_size=1))
    run_state.update_state(paths, lambda s: run_state.end_attempt(s, token=token, outcome="finished", step=20))


def _sweep_of_copies(sweep_dir: Path, template: RunPaths, make_template: Callable[[RunPaths], None], members: int,
                     *, max_parallel: int) -> Path:
    """A local sweep folder of ``members`` copies (``lr=INDEX,seed=0``) of the run that ``make_template``
    writes at ``template``."""
    make_template(template)
    records = []
    for index in range(members):
        name = f"lr={index},seed=0"
        shutil.copytree(template.run_dir, sweep_dir / name)
        records.append(MemberRecord(index, name, str(sweep_dir / name), {"config.lr": index, "config.seed": 0}))
    save_sweep(SweepPaths(sweep_dir), SweepRecord(name="bench", executor="local", max_parallel=max_parallel,
                                                 members=tuple(records)))
    return sweep_dir


def build_sweep(folder: Path, members: int) -> Path:
    """A sweep folder of ``members`` finished members (each with state.json and a 22-line events.jsonl)."""
    def finished(template: RunPaths) -> None:
        _finished_run(template, "4194999")
        template.events.write_text(_event_lines(20))

    return _sweep_of_copies(folder / "sweep", RunPaths(folder / "template"), finished, members, max_parallel=10)


def _vanished_run(paths: RunPaths, job_id: str) -> None:
    """A local run whose attempt is open (rank 0 recorded its start) and whose job is gone: no process."""
    paths.run_dir.mkdir(parents=True)
    paths.spec.write_text(_recorded_spec(paths))
    token = f"{job_id}:0/1"
    run_state.update_state(paths, lambda s: run_state.record_submission(s, executor="local", kind="submit",
                                                                        max_requeues=3, run_dir=str(paths.run_dir)))
    run_state.update_state(paths, lambda s: run_state.mark_pending(s, job_id=job_id))
    run_state.update_state(paths, lambda s: run_state.begin_attempt(s, token=token, job_id=job_id, launch="submit",
                                                                    hosts=["h"], world_size=1))


def _recorded_spec(paths: RunPaths) -> str:
    """The job.yaml that a submission records (every default written out)."""
    from elfes.launcher.spec import validate_spec_data

    spec = validate_spec_data({"name": "bench", "entrypoint": "m:f", "run_dir": str(paths.run_dir),
                               "config": {"lr": 0.1, "seed": 0}}, source="bench", base=paths.run_dir,
                              check_files=False)
    return spec.to_yaml()


def build_vanished_sweep(folder: Path, members: int) -> Path:
    """A local sweep of ``members`` members that each started an attempt whose job vanished (killed with its
    node: no process, no end recorded), so that status counts each lost and says why."""
    def vanished(template: RunPaths) -> None:
        _vanished_run(template, "4194997")
        template.events.write_text("".join(_event_lines(20).splitlines(True)[:-1]))  # no "finished"

    return _sweep_of_copies(folder / "vanished", RunPaths(folder / "vanished-template"), vanished, members,
                            max_parallel=members)


def _curve_lines(steps: int, every: int) -> str:
    """A finished run's records: a train event per step, an evaluation with two metrics every ``every`` steps."""
    lines = [{"event": "started", "time": TIME, "budget": BUDGET, "state": {"step": 0}}]
    for step in range(1, steps + 1):
        lines.append({"event": "train", "time": TIME, "step": step, "planned_steps": steps,
                      "metrics": {"loss": 2.0 / step, "lr": 0.001}})
        if step % every == 0:
            lines.append({"event": "evaluation", "time": TIME, "step": step,
                          "metrics": {"validation": {"loss": 2.5 / step, "mae": 1.0 / step}}})
    lines.append({"event": "finished", "time": TIME, "step": steps})
    return "".join(json.dumps(line) + "\n" for line in lines)


def build_plot_sweep(folder: Path, members: int, steps: int = 500) -> Path:
    """A sweep of ``members`` finished members, each with ``steps`` train events and an evaluation every 50."""
    def curves(template: RunPaths) -> None:
        _finished_run(template, "4194996")
        template.events.write_text(_curve_lines(steps, 50))

    return _sweep_of_copies(folder / "plotted", RunPaths(folder / "plotted-template"), curves, members,
                            max_parallel=10)


def build_big_run(folder: Path, lines: int, log_bytes: int) -> Path:
    """A finished run with an events.jsonl of ``lines`` lines and a rank-0 log of ``log_bytes``."""
    paths = RunPaths(folder / "big")
    _finished_run(paths, "4194998")
    with open(paths.events, "w") as stream:
        stream.write(json.dumps({"event": "started", "time": TIME, "budget": BUDGET}) + "\n")
        chunk = "".join(json.dumps({"event": "train", "time": TIME, "step": step, "metrics": {"loss": 0.5}}) + "\n"
                        for step in range(1, 1001))
        for _ in range((lines - 2) // 1000):
            stream.write(chunk)
        stream.write(json.dumps({"event": "finished", "time": TIME, "step": 1000}) + "\n")
    paths.attempt_logs(1).mkdir(parents=True)
    line = "x" * 99 + "\n"
    with open(paths.rank_log(1, 0), "w") as stream:
        stream.write(line * (log_bytes // len(line)))
    return paths.run_dir


# Runs the command and prints its wall seconds, peak resident KB and exit status. Linux carries a process's
# peak RSS across exec from the process that spawned it, so a command spawned by this benchmark (which holds
# hundreds of MB) would report at least that much; spawned by this small interpreter, it reports its own.
_MEASURE = """
import os, subprocess, sys, time
started = time.perf_counter()
child = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
_, status, usage = os.wait4(child.pid, 0)
print(time.perf_counter() - started, usage.ru_maxrss, os.waitstatus_to_exitcode(status))
"""


def _timed(command: list[str]) -> dict[str, float]:
    """Wall seconds and peak resident memory (MB) of a child process; its output is discarded."""
    measured = subprocess.run([sys.executable, "-c", _MEASURE, *command], env=child_environment(),
                              capture_output=True, text=True, check=True)
    wall, peak_kb, code = measured.stdout.split()
    if int(code) != 0:
        raise RuntimeError(f"{' '.join(command[:3])} ... exited with status {code}")
    return {"wall_s": float(wall), "rss_mb": int(peak_kb) / 1024}


def run(rounds: int, progress: Progress, *, smoke: bool = False) -> list[Row]:
    elfes = elfes_command()
    members, lines, log_bytes = (50, 10_002, 2_000_000) if smoke else (1000, 1_000_002, 200_000_000)
    plotted = 10 if smoke else 100
    with tempfile.TemporaryDirectory(prefix="elfes-sweep-bench-") as folder:
        sweep_dir = build_sweep(Path(folder), members)
        vanished = build_vanished_sweep(Path(folder), members)
        plot_sweep = build_plot_sweep(Path(folder), plotted)
        big = build_big_run(Path(folder), lines, log_bytes)
        member_dirs = sorted(str(path) for path in sweep_dir.iterdir() if path.is_dir())
        progress(f"sweep status: built {members} finished members, {members} whose jobs vanished, {plotted} to plot "
                 f"and a run with {lines} events, {log_bytes / 1e6:.0f} MB of log")
        # name -> (command, wall target in s, peak memory target in MB)
        commands = {
            f"status SWEEP_DIR ({members} members)": ([*elfes, "status", str(sweep_dir)], 2.0, None),
            f"status of {members} run directories": ([*elfes, "status", *member_dirs], 2.0, None),
            f"status SWEEP_DIR ({members} members whose jobs vanished)": ([*elfes, "status", str(vanished)], 2.0, None),
            f"status of a run with {lines} events": ([*elfes, "status", str(big)], None, None),
            f"logs of a {log_bytes / 1e6:.0f} MB log": ([*elfes, "logs", str(big)], None, None),
            f"plot of a run with {lines} events": ([*elfes, "plot", str(big), "-o", str(Path(folder) / "big.png")],
                                                   5.0, 500.0),
            f"plot SWEEP_DIR ({plotted} members)": ([*elfes, "plot", str(plot_sweep)], 10.0, None),
        }
        samples: dict[str, list[dict[str, float]]] = {name: [] for name in commands}
        for command, _, _ in commands.values():
            _timed(command)  # warm-up: the page cache holds every file afterwards
        for round_index in range(rounds):
            for name, (command, _, _) in commands.items():
                samples[name].append(_timed(command))
            progress(f"sweep status: round {round_index + 1}/{rounds}: " + ", ".join(
                f"{name} {samples[name][-1]['wall_s']:.2f} s" for name in commands))
    rows = []
    for name, (_, target, memory_target) in commands.items():
        wall = statistics.median(sample["wall_s"] for sample in samples[name])
        rss = max(sample["rss_mb"] for sample in samples[name])
        rows.append(Row("sweep_status", f"elfes {name}", "wall time of the command", "s", wall, None, None, "value",
                        wall, target=f"<= {target:g}" if target else None, rounds=rounds,
                        details={"peak_rss_mb": round(rss, 1)}))
        if memory_target:
            rows.append(Row("sweep_status", f"elfes {name}", "peak resident memory of the command", "MB", rss, None,
                            None, "value", rss, target=f"<= {memory_target:g}", rounds=rounds))
    return rows
