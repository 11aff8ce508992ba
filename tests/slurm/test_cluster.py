"""The private cluster works, and SLURM behaves the way the launcher relies on.

Facts proven here against real daemons: a batch job
runs and ``sacct`` reports it; a ``low`` job preempted by a ``high`` job gets USR2 (with
``preempt_send_user_signal``) or SIGTERM (without), in its job step, at once; it comes back as the same
job (PENDING, Restarts=1, then running with ``SLURM_RESTART_COUNT=1``) whether it requeues itself with
``scontrol requeue`` or waits for SLURM to requeue it at the end of the grace time; ``--open-mode=append``
keeps the first attempt's output; ``sbatch --test-only`` checks a job without queueing it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster import ClusterError, SlurmCluster, process_alive, wait_for

# The job step: records when it starts and which signals it gets (with the attempt), then either
# requeues its job with `scontrol requeue` at the first signal ("requeue", what ELFES does on the
# requeue signal) or keeps running so that SLURM requeues it after the grace time ("wait", what ELFES
# does on SIGTERM). A relaunched attempt records "done" and exits.
STEP = """
import os, signal, subprocess, sys, time

events = open(sys.argv[1], "a", buffering=1)
action = sys.argv[2]
restart = os.environ.get("SLURM_RESTART_COUNT", "unset")


def record(what):
    events.write(f"{time.time():.3f} {what} restart={restart}\\n")


def on_signal(signum, frame):
    record(f"signal {signal.Signals(signum).name}")
    if action == "requeue":
        done = subprocess.run(["scontrol", "requeue", os.environ["SLURM_JOB_ID"]], capture_output=True, text=True)
        record(f"requeue-rc={done.returncode}")
        sys.exit(0)


signal.signal(signal.SIGUSR2, on_signal)
signal.signal(signal.SIGTERM, on_signal)
record("start")
if restart == "unset":
    while True:
        signal.pause()
record("done")
"""

BATCH = """#!/bin/bash
echo "attempt restart=${{SLURM_RESTART_COUNT:-unset}}"
srun {python} {step} {events} {action}
"""


def sbatch(cluster: SlurmCluster, *options: str, cwd: Path) -> int:
    """Submit; return the job id."""
    return int(cluster.run("sbatch", "--parsable", *options, cwd=cwd).stdout.strip().split(";")[0])


def job_record(cluster: SlurmCluster, job_id: int) -> dict[str, str]:
    """``scontrol show job`` fields (JobState, Reason, Restarts, ...)."""
    fields = cluster.run("scontrol", "show", "job", "-o", str(job_id)).stdout.split()
    return dict(field.split("=", 1) for field in fields if "=" in field)


def accounted_state(cluster: SlurmCluster, job_id: int) -> str:
    """The job's state in the accounting database (``sacct``), '' before it is recorded."""
    return cluster.run("sacct", "-n", "-X", "-P", "-o", "State", "-j", str(job_id)).stdout.strip()


def events(path: Path) -> list[tuple[float, str]]:
    """The step's records: (time, "what restart=N")."""
    if not path.exists():
        return []
    return [(float(line.split(" ", 1)[0]), line.split(" ", 1)[1]) for line in path.read_text().splitlines()]


def test_cluster_is_configured_as_the_launcher_tests_assume(slurm: SlurmCluster):
    config = slurm.config()
    assert config["PreemptType"] == "preempt/partition_prio"
    assert config["PreemptMode"] == "REQUEUE"
    assert config["KillWait"] == f"{slurm.kill_wait_s} sec"
    assert config["JobRequeue"] == "1"
    assert config["AccountingStorageType"] == "accounting_storage/slurmdbd"
    low = slurm.run("scontrol", "show", "partition", "-o", "low").stdout
    high = slurm.run("scontrol", "show", "partition", "-o", "high").stdout
    assert "PreemptMode=REQUEUE" in low and f"GraceTime={slurm.grace_time_s}" in low and "Default=YES" in low
    assert "PreemptMode=OFF" in high and "PriorityTier=10" in high


def test_sbatch_wrap_runs_and_sacct_reports_completed(slurm: SlurmCluster, tmp_path: Path):
    job_id = sbatch(slurm, f"--output={tmp_path / 'out.txt'}", "--wrap", "echo hello from $SLURM_JOB_ID", cwd=tmp_path)
    wait_for(
        lambda: accounted_state(slurm, job_id) == "COMPLETED",
        timeout_s=30,
        what=f"sacct to report job {job_id} COMPLETED",
    )
    assert (tmp_path / "out.txt").read_text() == f"hello from {job_id}\n"
    exit_code = slurm.run("sacct", "-n", "-X", "-P", "-o", "ExitCode", "-j", str(job_id)).stdout.strip()
    assert exit_code == "0:0"


def test_sbatch_test_only_checks_without_queueing(slurm: SlurmCluster, tmp_path: Path):
    options = ["--partition=high", "--exclusive", "--requeue", "--open-mode=append", "--signal=USR2@90", "--time=5"]
    accepted = slurm.run("sbatch", "--test-only", *options, "--gpus-per-node=0", "--wrap", "true", cwd=tmp_path)
    assert "to start at" in accepted.stderr
    rejected = slurm.run(
        "sbatch", "--test-only", *options, "--gpus-per-node=1", "--wrap", "true", cwd=tmp_path, check=False
    )
    assert rejected.returncode != 0 and "gres" in rejected.stderr.lower()
    assert slurm.run("squeue", "-h").stdout == ""
    assert not list(tmp_path.glob("slurm-*.out"))


@pytest.mark.parametrize(
    "configuration, preemption_signal, action",
    [("user_signal", "SIGUSR2", "requeue"), ("plain_sigterm", "SIGTERM", "wait")],
    ids=["user-signal-then-scontrol-requeue", "sigterm-then-wait-for-slurm"],
)
def test_preempted_low_job_gets_the_signal_and_comes_back(
    configuration: str, preemption_signal: str, action: str, request: pytest.FixtureRequest, tmp_path: Path
):
    slurm: SlurmCluster = request.getfixturevalue(f"slurm_{configuration}")
    (tmp_path / "step.py").write_text(STEP)
    script = tmp_path / "job.sh"
    log = tmp_path / "events.txt"
    script.write_text(BATCH.format(python=sys.executable, step=tmp_path / "step.py", events=log, action=action))
    low = sbatch(
        slurm,
        "--partition=low",
        "--exclusive",
        "--requeue",
        "--open-mode=append",
        "--signal=USR2@30",
        "--time=10",
        f"--output={tmp_path / 'low.out'}",
        str(script),
        cwd=tmp_path,
    )
    wait_for(
        lambda: any(what == "start restart=unset" for _, what in events(log)),
        timeout_s=30,
        what="the low job's step to start",
    )

    preempted_at = time.time()
    high = sbatch(
        slurm,
        "--partition=high",
        "--exclusive",
        f"--output={tmp_path / 'high.out'}",
        "--wrap",
        "echo high",
        cwd=tmp_path,
    )
    signalled_at, first_signal = wait_for(
        lambda: next(((at, what) for at, what in events(log) if what.startswith("signal")), None),
        timeout_s=slurm.grace_time_s,
        what=f"the low job to get {preemption_signal} at preemption",
    )
    assert first_signal == f"signal {preemption_signal} restart=unset"
    # At once (a scheduler cycle, on a loaded machine a few), not at the end of the grace time.
    assert signalled_at - preempted_at < slurm.grace_time_s / 2, "the preemption signal comes at the grace time's start"

    # Requeued: the same job, pending again with one restart (BeginTime: it may start cred_expire + 1 s later).
    requeued = wait_for(
        lambda: (record := job_record(slurm, low))["JobState"] == "PENDING" and record,
        timeout_s=slurm.grace_time_s + slurm.kill_wait_s + 30,
        what=f"job {low} to be requeued (PENDING)",
        interval_s=0.2,
    )
    requeued_at = time.time()
    assert requeued["Restarts"] == "1"
    assert requeued["Reason"] in ("BeginTime", "None")
    wait_for(
        lambda: any(what == "done restart=1" for _, what in events(log)), timeout_s=60, what="the relaunched attempt"
    )
    relaunched_at = next(at for at, what in events(log) if what == "start restart=1")
    wait_for(lambda: accounted_state(slurm, low) == "COMPLETED", timeout_s=30, what=f"sacct: job {low} COMPLETED")
    assert accounted_state(slurm, high) == "COMPLETED"

    records = [what for _, what in events(log)]
    assert f"signal {'SIGUSR2' if preemption_signal == 'SIGTERM' else 'SIGTERM'} restart=unset" not in records[:2]
    if action == "requeue":
        assert "requeue-rc=0 restart=unset" in records  # scontrol works from inside a job
    else:
        assert not any(what.startswith("requeue") for what in records)
    # --open-mode=append: the relaunch added to the first attempt's output instead of truncating it.
    attempts = [line for line in (tmp_path / "low.out").read_text().splitlines() if line.startswith("attempt")]
    assert attempts == ["attempt restart=unset", "attempt restart=1"]
    print(
        f"{configuration}: signal after {signalled_at - preempted_at:.1f} s, pending again after "
        f"{requeued_at - preempted_at:.1f} s, relaunched after {relaunched_at - preempted_at:.1f} s"
    )


@pytest.fixture
def open_folder() -> Iterator[Path]:
    """A new folder under /tmp that all users may search (munged requires it; pytest's tmp_path is private)."""
    folder = Path(tempfile.mkdtemp(prefix="elfes-test-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


def test_cluster_script_starts_and_stops_a_second_cluster_by_hand(open_folder: Path, slurm_cluster: SlurmCluster):
    """``cluster.py start|status|stop`` (no accounting: fast) in a folder with someone else's file."""
    folder = open_folder
    (folder / "notes.txt").write_text("not the cluster's")
    script = [sys.executable, str(Path(__file__).with_name("cluster.py"))]
    started = subprocess.run(
        [*script, "start", "--dir", str(folder), "--no-accounting"], capture_output=True, text=True, timeout=60
    )
    try:
        assert started.returncode == 0, started.stderr
        assert started.stdout == f"export SLURM_CONF={folder / 'etc' / 'slurm.conf'}\n"
        second = SlurmCluster.attach(folder)
        assert second.ports["slurmctld"] != slurm_cluster.ports["slurmctld"]
        pids = [daemon.pid() for daemon in second.daemons()]
        assert all(pids), second.status()
        status = subprocess.run([*script, "status", "--dir", str(folder)], capture_output=True, text=True, timeout=60)
        assert status.returncode == 0 and "idle" in status.stdout
    finally:
        stopped = subprocess.run([*script, "stop", "--dir", str(folder)], capture_output=True, text=True, timeout=120)
    assert stopped.returncode == 0, stopped.stderr
    assert not any(process_alive(pid) for pid in pids)
    assert [path.name for path in folder.iterdir()] == ["notes.txt"]


def test_cluster_refuses_a_folder_munged_cannot_use(slurm_available: None, tmp_path: Path):
    """pytest's tmp_path is private (mode 700): the refusal says why and what to do, before starting anything."""
    folder = tmp_path / "cluster"
    with pytest.raises(ClusterError, match=r"searchable by all users.*\(mode 700\).*chmod g\+x,o\+x it"):
        SlurmCluster(folder).start()
    assert not folder.exists()


def test_a_start_that_fails_removes_what_it_made_and_the_next_start_works(slurm_available: None, open_folder: Path):
    """A parent searchable by others but not by its group (mode 701) is refused naming g+x, which munged needs
    too; a start that fails after munged began (slurmctld refused here) stops munged and leaves the folder as
    it was, so the next start in it runs."""
    parent = open_folder / "parent"
    parent.mkdir(mode=0o701)
    parent.chmod(0o701)
    with pytest.raises(ClusterError, match=r"\(mode 701\): use another folder \(under /tmp\) or chmod g\+x it"):
        SlurmCluster(parent / "cluster", accounting=False).start()
    assert list(parent.iterdir()) == []

    class RefusedController(SlurmCluster):
        def _start_slurmctld(self, timeout_s: float) -> None:
            self.munged_pid = self._daemon("munged").pid()
            raise ClusterError("slurmctld refused for this test")

    (open_folder / "notes.txt").write_text("not the cluster's")
    failing = RefusedController(open_folder, accounting=False)
    with pytest.raises(ClusterError, match="did not start: slurmctld refused for this test"):
        failing.start()
    assert failing.munged_pid is not None and not process_alive(failing.munged_pid)
    assert sorted(path.name for path in open_folder.iterdir()) == ["notes.txt", "parent"]
    cluster = SlurmCluster(open_folder, accounting=False).start()
    cluster.stop()
    assert sorted(path.name for path in open_folder.iterdir()) == ["notes.txt", "parent"]


def test_submitit_job_runs_and_its_state_comes_from_sacct(slurm_env: SlurmCluster, tmp_path: Path):
    """submitit (the launcher's submitter) drives this cluster with nothing but ``SLURM_CONF``."""
    import operator

    import submitit

    executor = submitit.AutoExecutor(folder=tmp_path / "submitit", cluster="slurm")
    executor.update_parameters(timeout_min=5, slurm_partition="low", slurm_signal_delay_s=30)
    job = executor.submit(operator.add, 2, 3)
    assert job.result() == 5
    finished_at = time.monotonic()
    # submitit's job.state comes from sacct, which may lag a moment behind the job (slurmctld sends its
    # records to slurmdbd asynchronously): seen PENDING right after the result was there.
    wait_for(lambda: job.state == "COMPLETED", timeout_s=30, what="submitit's job.state (sacct) to say COMPLETED")
    assert accounted_state(slurm_env, int(job.job_id)) == "COMPLETED"
    print(f"sacct said COMPLETED {time.monotonic() - finished_at:.1f} s after submitit had the result")


def test_the_cluster_commands_of_the_slurm_guide_start_and_stop_it(open_folder: Path, slurm_cluster: SlurmCluster):
    """docs/slurm.md's two lines, as written, with a folder of our own (--dir) beside the session's cluster."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "slurm.md").read_text()
    lines = text.split("<!-- doc-test: slurm/cluster -->\n```bash\n", 1)[1].split("```", 1)[0].splitlines()
    start, stop = (line.split("  #", 1)[0].strip().replace("python ", f"{sys.executable} ", 1) for line in lines)
    assert start.endswith("tests/slurm/cluster.py start") and stop.endswith("tests/slurm/cluster.py stop")
    repository = Path(__file__).resolve().parents[2]
    started = subprocess.run(f"{start} --dir {open_folder}", shell=True, cwd=repository, capture_output=True,
                             text=True, timeout=120)
    try:
        assert started.returncode == 0, started.stderr
        assert started.stdout.startswith("export SLURM_CONF=")
    finally:
        stopped = subprocess.run(f"{stop} --dir {open_folder}", shell=True, cwd=repository, capture_output=True,
                                 text=True, timeout=120)
    assert stopped.returncode == 0, stopped.stderr


def test_job_starts_reads_sacct_in_utc_whatever_time_zone_and_format_the_user_set(slurm_env: SlurmCluster,
                                                                                   tmp_path: Path,
                                                                                   monkeypatch: pytest.MonkeyPatch):
    """sacct prints times in the local time of its own process, in the format SLURM_TIME_FORMAT chooses: the launcher
    asks it for UTC in one format, so that a user's TZ (here UTC+14, which this Python process was never told of)
    and SLURM_TIME_FORMAT=relative (``19:41:08``) change nothing in the starts it reads (the goodput's queue waits).
    Asked while the job runs: this cluster's accounting keeps no Eligible time for a job that started at once and
    completed."""
    from datetime import datetime, timedelta, timezone

    from elfes.launcher.slurm import job_starts

    submitted_at = datetime.now(timezone.utc) - timedelta(seconds=2)  # sacct keeps whole seconds
    job_id = sbatch(slurm_env, f"--output={tmp_path / 'out.txt'}", "--wrap", "sleep 60", cwd=tmp_path)
    wait_for(lambda: accounted_state(slurm_env, job_id) == "RUNNING", timeout_s=30,
             what=f"sacct to report job {job_id} RUNNING")
    running_at = datetime.now(timezone.utc)
    monkeypatch.setenv("TZ", "Pacific/Kiritimati")
    monkeypatch.setenv("SLURM_TIME_FORMAT", "relative")
    [start] = (job_starts([str(job_id)]) or {})[str(job_id)]
    assert start.started_at is not None
    assert submitted_at <= start.eligible_at <= start.started_at <= running_at, (submitted_at, start, running_at)
