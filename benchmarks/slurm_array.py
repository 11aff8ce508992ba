"""Scale on SLURM: a sweep of 100 tiny members as one job array (``max_parallel: 10``) on the private
cluster of tests/slurm/cluster.py, its node offering 10 CPUs. Every member must finish after exactly one
attempt, as task k of the one array (none lost, none run twice), at most 10 at once (from ``sacct``'s
start and end times); the table gives the wall time from ``elfes submit`` to the last member finished and
``elfes status SWEEP_DIR``'s wall time over the 100 members. It needs root and the SLURM packages; where
they are missing it says so and gives no row. Smoke size: 12 members, ``max_parallel: 4``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from .login import elfes_command
from .measure import REPOSITORY, Progress, Row

TIMEOUT_S = 1800
ENDED = ("finished", "failed", "cancelled", "stopped", "lost")


def _cluster_module() -> Any:
    sys.path.insert(0, str(REPOSITORY / "tests" / "slurm"))
    import cluster

    return cluster


def _spec(folder: Path, members: int, max_parallel: int) -> Path:
    spec = folder / "array.yaml"
    spec.write_text(json.dumps({
        "name": "array", "entrypoint": "tests.slurm.slurm_jobs:first_attempts_slow", "workdir": str(REPOSITORY),
        "run_dir": str(folder / "sweep"), "config": {"epochs": 1, "train_samples": 64, "log_every": 1},
        "resources": {"nodes": 1, "tasks_per_node": 1, "gpus_per_node": 0, "cpus_per_task": 1, "mem_gb": 1,
                      "timeout_min": 20},
        "slurm": {"partition": "low", "signal_delay_s": 60}, "requeue": {"max_requeues": 3},
        "env": {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPOSITORY)},
        "sweep": {"grid": {"config.seed": list(range(members))}, "max_parallel": max_parallel},
    }))
    return spec


def _elfes(environment: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    completed = subprocess.run([*elfes_command(), *argv], env=environment, capture_output=True, text=True, timeout=300)
    if completed.returncode != 0:
        raise RuntimeError(f"elfes {' '.join(argv)} exited {completed.returncode}: {completed.stderr.strip()}")
    return completed


def _peak_concurrency(intervals: list[tuple[float, float]]) -> int:
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = peak = 0
    for _, change in edges:  # an end sorts before a start at the same second: -1 < 1
        running += change
        peak = max(peak, running)
    return peak


def _accounted_tasks(cluster: Any, array: str, *, timeout_s: float = 120) -> list[list[str]]:
    """sacct's JobID, State, Start and End of every task of ``array``, once none is still pending or running.

    A member records "finished" before its task's process exits, so the last tasks can still be running in
    SLURM's books when ``elfes status`` counts every member ended."""
    deadline = time.monotonic() + timeout_s
    while True:
        accounted = cluster.run("sacct", "-n", "-X", "-P", "-o", "JobID,State,Start,End", "-j", array).stdout
        tasks = [line.split("|") for line in accounted.splitlines() if line]
        if not any(state in ("PENDING", "RUNNING", "REQUEUED") for _, state, *_ in tasks) or time.monotonic() > deadline:
            return tasks
        time.sleep(1)


def _check_members(sweep_dir: Path, array: str, members: int) -> list[str]:
    """What is wrong with the members (empty: each finished after one attempt, as its task of ``array``)."""
    from elfes.launcher.rundir.paths import RunPaths, SweepPaths
    from elfes.launcher.rundir.state import load_state
    from elfes.launcher.rundir.sweep_record import load_sweep

    wrong = []
    record = load_sweep(SweepPaths(sweep_dir))
    if len(record.members) != members:
        wrong.append(f"sweep.json records {len(record.members)} members, not {members}")
    for task, member in enumerate(record.members):
        state = load_state(RunPaths(Path(member.run_dir)))
        outcomes = [attempt.outcome for attempt in state.attempts] if state else None
        if state is None or state.status != "finished" or outcomes != ["finished"] or state.job_id != f"{array}_{task}":
            wrong.append(f"{member.name}: {state.status if state else 'no state'}, attempts {outcomes}, "
                         f"job {state.job_id if state else None}")
    return wrong


def run(rounds: int, progress: Progress, *, smoke: bool = False) -> list[Row]:
    members, max_parallel = (12, 4) if smoke else (100, 10)
    cluster_module = _cluster_module()
    if cluster_module.missing_programs() or os.geteuid() != 0:
        progress("slurm_array: skipped: it needs root and SLURM, munge and MariaDB "
                 f"({cluster_module.INSTALL_COMMAND})")
        return []
    folder = tempfile.mkdtemp(prefix="elfes-array-bench-")
    # A SIGTERM (a timeout, Ctrl-C's cousin) ends the benchmark through the finally, so the daemons stop.
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    cluster = cluster_module.SlurmCluster(node_cpus=max_parallel).start()
    try:
        rows = _measure(cluster, Path(folder), members, max_parallel, progress)
    finally:
        cluster.stop(remove=False)
        signal.signal(signal.SIGTERM, previous)
    if all(row.holds is not False for row in rows):
        shutil.rmtree(folder, ignore_errors=True)
        cluster.remove()
    else:
        progress(f"slurm_array: a target was missed; the sweep is kept in {folder}, the cluster's logs in "
                 f"{cluster.directory}")
    return rows


def _measure(cluster: Any, folder: Path, members: int, max_parallel: int, progress: Progress) -> list[Row]:
    environment = cluster.env
    sweep_dir = folder / "sweep"
    started = time.perf_counter()
    from elfes.launcher.rundir.paths import SweepPaths
    from elfes.launcher.rundir.sweep_record import load_sweep

    _elfes(environment, "submit", str(_spec(folder, members, max_parallel)), "--executor", "slurm")
    (job,) = load_sweep(SweepPaths(sweep_dir)).jobs
    array = job.job_id
    progress(f"slurm_array: submitted {members} members as job array {array}, at most {max_parallel} at once")
    status_walls, counts = [], {}
    while time.perf_counter() - started < TIMEOUT_S:
        before = time.perf_counter()
        counts = json.loads(_elfes(environment, "status", str(sweep_dir), "--json").stdout)["counts"]
        status_walls.append(time.perf_counter() - before)
        if sum(counts.get(status, 0) for status in ENDED) == members:
            break
        progress(f"slurm_array: {counts}")
        time.sleep(5)
    wall = time.perf_counter() - started
    wrong = _check_members(sweep_dir, array, members)
    tasks = _accounted_tasks(cluster, array)
    intervals = [(datetime.fromisoformat(start).timestamp(), datetime.fromisoformat(end).timestamp())
                 for _, state, start, end in tasks if state == "COMPLETED"]
    ran_twice = len(tasks) - len({job_id for job_id, *_ in tasks})
    peak = _peak_concurrency(intervals)
    progress(f"slurm_array: {counts} in {wall:.0f} s; sacct: {len(intervals)} tasks completed, peak {peak} at once"
             + (f"; WRONG: {wrong[:5]}" if wrong else ""))
    lost = members - len(intervals)
    details = {"array_job": array, "members": members, "max_parallel": max_parallel, "node_cpus": max_parallel,
               "counts": counts, "problems": wrong[:20]}
    case = f"{members}-member job array, max_parallel {max_parallel}"
    return [
        Row("slurm_array", case, "members finished after exactly one attempt", "members", members - len(wrong), None,
            None, "value", members - len(wrong), target=f">= {members}", rounds=1, details=details),
        Row("slurm_array", case, "array tasks lost or run twice (sacct)", "tasks", lost + ran_twice, None, None,
            "value", lost + ran_twice, target="<= 0", rounds=1),
        Row("slurm_array", case, "peak tasks running at once (sacct)", "tasks", peak, None, None, "value", peak,
            target=f"<= {max_parallel}", rounds=1),
        Row("slurm_array", case, "wall time from elfes submit to the last member finished", "s", wall, None, None,
            "value", wall, rounds=1, details={"members_per_minute": round(members / wall * 60, 1)}),
        Row("slurm_array", f"elfes status SWEEP_DIR ({members} members, live)", "median wall time of the command",
            "s", sorted(status_walls)[len(status_walls) // 2], None, None, "value",
            sorted(status_walls)[len(status_walls) // 2], target="<= 1", rounds=len(status_walls),
            details={"max_wall_s": round(max(status_walls), 3)}),  # measured beside up to max_parallel members
        # importing torch at once; the scale figures are benchmarks/sweep_status.py's
    ]
