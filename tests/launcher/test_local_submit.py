"""`elfes submit --executor local` from a caller that reads its output: it returns while the job runs
(the controller's streams are detached, in a session of its own); then preempt, cancel, resume and
--follow on real local jobs (small `command:` jobs: no torch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from launching import REPOSITORY, launch_environment

from elfes.launcher.rundir.liveness import local_processes
from elfes.launcher.rundir.paths import RunPaths

ELFES = str(Path(sys.executable).with_name("elfes"))

# Waits until SIGTERM (exit 143: stopped) or SIGUSR2 (exit 140: paused for a requeue), as a command job must.
WAITING = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))\n"
    "signal.signal(signal.SIGUSR2, lambda *_: sys.exit(128 + signal.SIGUSR2))\n"
    "print('waiting', flush=True)\n"
    "time.sleep(600)\n"
)


def write_spec(folder: Path, command: list[str], name: str = "local-job") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    spec = folder / "job.yaml"
    spec.write_text(json.dumps({
        "name": name, "command": command, "run_dir": "run",
        "resources": {"tasks_per_node": 1, "timeout_min": 10},
        "slurm": {"signal_delay_s": 60}, "requeue": {"max_requeues": 2},
    }))
    return spec


def elfes(*argv: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([ELFES, *argv], cwd=cwd, env=launch_environment(), capture_output=True, text=True,
                          timeout=timeout)


def status(run_dir: Path) -> dict:
    completed = subprocess.run([ELFES, "status", str(run_dir), "--json"], capture_output=True, text=True, timeout=60)
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


def wait_for(condition: Callable[[], object], what: str, timeout_s: float = 60) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def session_id(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[3])


@pytest.fixture
def cleanup():
    """End, by pid, whatever processes of the runs a test started are left (a failed assertion)."""
    runs: list[Path] = []
    yield runs.append
    for run_dir in runs:
        processes = local_processes(RunPaths(run_dir))
        for pid in processes["task"] + processes["controller"]:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass


def running_with_pid(run_dir: Path, attempt: int) -> bool:
    report = status(run_dir)
    records = [json.loads(path.read_text()) for path in (run_dir / "pids").glob("rank-*.json")]
    return report["status"] == "running" and any(record["attempt"] == attempt for record in records)


def test_submit_returns_while_the_job_runs_then_preempt_cancel_resume(tmp_path: Path, cleanup):
    spec = write_spec(tmp_path, ["{python}", "-c", WAITING])
    run_dir = tmp_path / "run"
    cleanup(run_dir)
    started = time.monotonic()
    submitted = elfes("submit", str(spec), "--executor", "local", cwd=tmp_path)  # pipes: would block if inherited
    assert submitted.returncode == 0, submitted.stderr
    assert time.monotonic() - started < 30
    assert "submitted as local job" in submitted.stdout and str(run_dir) in submitted.stdout
    (controller,) = local_processes(RunPaths(run_dir))["controller"]
    assert session_id(controller) != session_id(os.getpid())  # a Ctrl-C in our terminal does not reach it

    wait_for(lambda: running_with_pid(run_dir, 1), "attempt 1 running with its pid recorded")
    preempted = elfes("preempt", str(run_dir), cwd=tmp_path)
    assert preempted.returncode == 0 and "sent SIGUSR2 to pid" in preempted.stdout, preempted.stderr
    wait_for(lambda: running_with_pid(run_dir, 2), "attempt 2 (the requeue) running")
    report = status(run_dir)
    assert [a["outcome"] for a in report["attempts"]] == ["requeued", None]
    assert report["requeues_used"] == 1 and report["requeues_left"] == 1

    cancelled = elfes("cancel", str(run_dir), cwd=tmp_path)
    assert cancelled.returncode == 0 and "sent SIGTERM to pid" in cancelled.stdout, cancelled.stderr
    wait_for(lambda: status(run_dir)["status"] == "cancelled", "the run cancelled")
    assert status(run_dir)["attempts"][-1]["signal"] == "SIGTERM"
    wait_for(lambda: not any(local_processes(RunPaths(run_dir)).values()), "the job's processes gone")

    resumed = elfes("resume", str(run_dir), cwd=tmp_path)
    assert resumed.returncode == 0 and "resumed as local job" in resumed.stdout, resumed.stderr
    wait_for(lambda: running_with_pid(run_dir, 3), "attempt 3 (the resume) running")
    assert status(run_dir)["attempts"][-1]["launch"] == "resume"
    assert elfes("cancel", str(run_dir), cwd=tmp_path).returncode == 0
    wait_for(lambda: status(run_dir)["status"] == "cancelled", "the resumed run cancelled")
    logs = elfes("logs", str(run_dir), cwd=tmp_path)
    assert logs.returncode == 0 and "waiting" in logs.stdout


def test_submit_follow_exits_0_when_the_run_finishes_and_4_when_it_fails(tmp_path: Path, cleanup):
    good = write_spec(tmp_path / "good", ["{python}", "-c", "print('trained')"])
    cleanup(tmp_path / "good" / "run")
    followed = elfes("submit", str(good), "--executor", "local", "--follow", cwd=tmp_path, timeout=120)
    assert followed.returncode == 0, followed.stdout + followed.stderr
    assert "elfes: attempt 1 started (submit)" in followed.stdout and "elfes: run finished" in followed.stdout
    assert "\x1b[" not in followed.stdout  # not a terminal: plain lines

    bad = write_spec(tmp_path / "bad", ["{python}", "-c", "import sys; sys.exit(3)"])
    cleanup(tmp_path / "bad" / "run")
    followed = elfes("submit", str(bad), "--executor", "local", "--follow", cwd=tmp_path, timeout=120)
    assert followed.returncode == 4, followed.stdout + followed.stderr
    assert "ended failed" in followed.stdout and "exited with code 3" in followed.stdout
    assert status(tmp_path / "bad" / "run")["status"] == "failed"


def test_a_commands_bare_python_is_the_jobs_interpreter_on_a_path_without_it(tmp_path: Path, cleanup):
    """`.venv/bin/elfes submit` with no virtual environment activated: the command's `python` is still its own."""
    spec = write_spec(tmp_path, ["python", "-c", "import sys; open('interpreter.txt', 'w').write(sys.executable)"])
    cleanup(tmp_path / "run")
    followed = subprocess.run([ELFES, "submit", str(spec), "--executor", "local", "--follow"], cwd=tmp_path,
                              env=launch_environment(PATH="/usr/local/bin:/usr/bin:/bin"), capture_output=True,
                              text=True, timeout=120)
    assert followed.returncode == 0, followed.stdout + followed.stderr
    # The command ran in the run's code snapshot (code/1), a copy of its workdir.
    assert (tmp_path / "run" / "code" / "1" / "interpreter.txt").read_text() == str(Path(sys.executable).with_name("python"))


def test_submit_follow_on_a_terminal_draws_the_progress_bar(tmp_path: Path, cleanup):
    import pty

    spec = write_spec(tmp_path, ["{python}", str(REPOSITORY / "examples" / "quickstart" / "train.py"),
                                 "--run-dir", "{run_dir}", "--epochs", "2"])
    cleanup(tmp_path / "run")
    controller, terminal = pty.openpty()
    follow = subprocess.Popen([ELFES, "submit", str(spec), "--executor", "local", "--follow"], cwd=tmp_path,
                              env=launch_environment(COLUMNS="120"), stdout=terminal, stderr=terminal)
    os.close(terminal)
    output = b""
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # EIO: every writer of the terminal has closed it
            break
        if not chunk:
            break
        output += chunk
    os.close(controller)
    assert follow.wait(timeout=300) == 0, output[-3000:]
    text = output.decode(errors="replace")
    assert "\x1b[" in text and "samples/s" in text  # rich's live bar, not plain lines
    assert "elfes: run finished" in text


def test_more_ranks_than_this_machine_can_start_are_refused_at_validate_and_submit_naming_its_cpus(tmp_path: Path):
    spec = write_spec(tmp_path, [sys.executable, "-c", "print('never')"])
    from elfes.launcher.submit.scripts import visible_gpus

    cpus, gpus = len(os.sched_getaffinity(0)), len(visible_gpus()) or "no"
    for verb in ("validate", "submit"):
        refused = elfes(verb, str(spec), "--executor", "local", "--set", "resources.tasks_per_node=100000", cwd=tmp_path)
        assert refused.returncode == 2, refused.stderr
        assert (f"resources.tasks_per_node = 100000: this machine has {cpus} CPU(s) and {gpus} GPU(s), and the local "
                f"executor starts at most 4 ranks per CPU ({4 * cpus} here)") in refused.stderr, refused.stderr
        assert refused.stderr.rstrip().endswith("lower tasks_per_node, or submit with --executor slurm")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["job.yaml"]  # no run directory, no job
    accepted = elfes("validate", str(spec), "--executor", "local", "--set", f"resources.tasks_per_node={4 * cpus}",
                     cwd=tmp_path)
    assert accepted.returncode == 0, accepted.stderr
