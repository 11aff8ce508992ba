"""`elfes submit`/`resume` as one transaction, on real processes: a refused submission (no sbatch; a
SLURM controller that does not answer) leaves the run directory byte for byte as it was; a submitter
killed (SIGKILL) or interrupted (SIGINT) at any point of the hand-over leaves exactly one job, which
the next submission finds and says so. Torch-free `command:` jobs."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from launching import kill_local_run, launch_environment
from run_fixtures import make_run

from elfes.launcher.rundir import state as run_state
from elfes.launcher.rundir.liveness import local_processes
from elfes.launcher.rundir.paths import RunPaths

ELFES = str(Path(sys.executable).with_name("elfes"))
# Appends the controller that started it (the local job id) to RUN_DIR/starts.txt, then trains nothing.
RECORD_START = ("import os, sys; open(os.path.join(sys.argv[1], 'starts.txt'), 'a')"
                ".write(os.environ.get('SUBMITIT_LOCAL_JOB_ID', '?') + '\\n')")


def tree_digest(folder: Path) -> dict[str, str]:
    """Every file and folder under ``folder`` with the SHA-256 of its content (or its link target)."""
    digest = {}
    for path in sorted(folder.rglob("*")):
        relative = str(path.relative_to(folder))
        if path.is_symlink():
            digest[relative] = "link:" + os.readlink(path)
        elif path.is_dir():
            digest[relative] = "folder"
        else:
            digest[relative] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digest


def elfes(*argv: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([ELFES, *argv], env=env or launch_environment(), capture_output=True, text=True,
                          timeout=timeout)


def wait_for(condition: Callable[[], object], what: str, timeout_s: float = 90) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@pytest.fixture
def dead_slurm(tmp_path: Path) -> dict[str, str]:
    """An environment whose SLURM_CONF names a controller that does not run: sbatch really fails."""
    host = os.uname().nodename
    conf = tmp_path / "dead-slurm" / "slurm.conf"
    conf.parent.mkdir()
    conf.write_text(f"ClusterName=dead\nSlurmctldHost={host}(127.0.0.1)\nSlurmctldPort=9\nAuthType=auth/none\n"
                    f"NodeName={host} NodeAddr=127.0.0.1 CPUs=1 State=UNKNOWN\n"
                    "PartitionName=debug Nodes=ALL Default=YES State=UP\n")
    return launch_environment(SLURM_CONF=str(conf))


@pytest.fixture
def cleanup():
    """End, by pid, whatever processes of the runs a test started are left (a failed assertion)."""
    runs: list[Path] = []
    yield runs.append
    for run_dir in runs:
        kill_local_run(run_dir)


def test_a_submission_without_sbatch_leaves_no_run_directory(tmp_path: Path):
    spec = make_spec(tmp_path, "fresh")
    environment = launch_environment(PATH=str(Path(sys.executable).parent))  # python and elfes, no SLURM
    refused = elfes("submit", str(spec), "--executor", "slurm", env=environment)
    assert refused.returncode == 3, refused.stderr
    assert "SLURM is not available here" in refused.stderr and "Traceback" not in refused.stderr
    assert not (tmp_path / "fresh").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["fresh.yaml"]


@pytest.mark.skipif(not Path("/usr/bin/sbatch").exists() and not os.environ.get("ELFES_REQUIRE_SLURM"),
                    reason="needs SLURM's client commands")
def test_a_refused_sbatch_leaves_the_run_directory_byte_for_byte_and_resume_takes_another_executor(
        tmp_path: Path, dead_slurm: dict[str, str], cleanup):
    paths = make_run(tmp_path, outcome="stopped")
    cleanup(paths.run_dir)
    paths.checkpoints.mkdir()
    (paths.checkpoints / "step-00000004.pt").write_bytes(b"saved")
    paths.submitit.mkdir()
    (paths.submitit / "4194999_0_log.out").write_text("an earlier job's log\n")
    paths.cancel_marker.write_text("{}\n")
    before = tree_digest(paths.run_dir)

    for argv in (["submit", str(tmp_path / "demo.yaml"), "--executor", "slurm"],
                 ["resume", str(paths.run_dir), "--executor", "slurm"]):
        refused = elfes(*argv, env=dead_slurm)
        assert refused.returncode == 3, refused.stderr
        assert "sbatch refused job demo" in refused.stderr and "Traceback" not in refused.stderr
        assert tree_digest(paths.run_dir) == before  # no attempt, no executor change, no submitit files

    resumed = elfes("resume", str(paths.run_dir), "--executor", "local", "--set", "config.lr=0.1")
    assert resumed.returncode == 2 and "config.lr" in resumed.stderr  # has a checkpoint
    resumed = elfes("resume", str(paths.run_dir), "--executor", "local")
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed as local job" in resumed.stdout
    state = run_state.load_state(paths)
    assert state.executor == "local" and [s.executor for s in state.submissions] == ["local", "local"]
    assert [s.kind for s in state.submissions] == ["submit", "resume"]


# -- a submitter killed or interrupted mid-hand-over ---------------------------------------------------------
def make_spec(folder: Path, name: str) -> Path:
    spec = folder / f"{name}.yaml"
    spec.write_text(json.dumps({
        "name": name, "command": ["{python}", "-c", RECORD_START, "{run_dir}"], "run_dir": name,
        "resources": {"tasks_per_node": 1, "timeout_min": 10}, "slurm": {"signal_delay_s": 60},
    }))
    return spec


def state_says_submitted(run_dir: Path) -> bool:
    try:
        return json.loads(RunPaths(run_dir).state.read_text())["status"] == "submitted"
    except (OSError, ValueError, KeyError):
        return False


def controller_started(run_dir: Path) -> bool:
    return bool(run_dir.is_dir() and local_processes(RunPaths(run_dir))["controller"])


# When to stop the first submitter: on the conditions that bracket the hand-over (the run directory
# created; the submission written ahead; the controller started, its job id not yet recorded), and
# for SIGKILL also after fixed delays, as a user's kill lands. (A SIGINT that lands while the
# interpreter itself starts, before any elfes code runs, is Python's to report.)
CONDITIONS: list[tuple[str, Callable[[Path], bool] | float]] = [
    ("once the run directory exists", lambda run_dir: run_dir.is_dir()),
    ("once state.json says submitted", state_says_submitted),
    ("once the controller runs", controller_started),
]
DELAYS: list[tuple[str, Callable[[Path], bool] | float]] = [
    (f"after {delay} s", delay) for delay in (0.1, 0.2, 0.3, 0.45, 0.6, 0.8, 1.1)]

SECOND_SUBMIT_SAYS = ("submitted as local job", "continues as local job", "no second job was started",
                      "the run is finished; submitting it again would train nothing",
                      "cannot record a submit while the run is")


def assert_one_trainer(run_dir: Path, what: str) -> None:
    state = wait_for(lambda: (s := run_state.load_state(RunPaths(run_dir))) is not None and s.status in
                     run_state.ENDED and s, f"the run to end ({what})")
    wait_for(lambda: not any(local_processes(RunPaths(run_dir)).values()), f"the job's processes to exit ({what})")
    starts = (run_dir / "starts.txt").read_text().splitlines()
    assert state.status == "finished", (what, state)
    assert len(starts) == 1, f"{what}: {len(starts)} trainers started: {starts}\n{RunPaths(run_dir).state.read_text()}"
    assert len(state.attempts) == 1 and len({a.job_id for a in state.attempts}) == 1, (what, state.attempts)


@pytest.mark.parametrize("stop_signal", [signal.SIGKILL, signal.SIGINT])
def test_a_submitter_stopped_at_any_point_leaves_exactly_one_trainer(tmp_path: Path, cleanup, stop_signal):
    points = CONDITIONS + (DELAYS if stop_signal == signal.SIGKILL else [])
    for index, (label, point) in enumerate(points):
        name = f"run-{index}"
        spec, run_dir = make_spec(tmp_path, name), tmp_path / name
        cleanup(run_dir)
        first = subprocess.Popen([ELFES, "submit", str(spec), "--executor", "local"], env=launch_environment(),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if callable(point):
            wait_for(lambda point=point, run_dir=run_dir, first=first: point(run_dir) or first.poll() is not None,
                     label)
        else:
            time.sleep(point)  # the timing itself is what this case varies
        first.send_signal(stop_signal)
        _, first_err = first.communicate(timeout=60)
        what = f"{stop_signal.name} {label}"
        assert "Traceback" not in first_err, f"{what}: {first_err}"
        if stop_signal == signal.SIGINT and first.returncode != 0:
            assert first.returncode == 130 and "interrupted" in first_err, f"{what}: {first.returncode} {first_err}"

        second = elfes("submit", str(spec), "--executor", "local")
        said = second.stdout + second.stderr
        assert second.returncode in (0, 3) and any(text in said for text in SECOND_SUBMIT_SAYS), f"{what}: {said}"
        assert "Traceback" not in said, f"{what}: {said}"
        assert_one_trainer(run_dir, what)
