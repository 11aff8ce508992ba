"""A sweep's SLURM job array goes through a single run's hand-over (launcher/submit/transaction.py's
`hand_over`): on a disk without the room to record every member's job, `elfes resume SWEEP_DIR` is refused
before sbatch is asked, every member's state.json as it was, as a single run's resume is
(tests/launcher/test_faults.py)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

from cluster import SlurmCluster, wait_for
from slurm_runs import elfes, wait_ended, write_spec

from elfes.launcher.rundir.paths import RunPaths, SweepPaths
from elfes.launcher.rundir.sweep_record import load_sweep

PAGE = 4096  # tmpfs gives a file its room a page at a time
MEMBERS = 4


@contextlib.contextmanager
def mounted(path: Path, *arguments: str) -> Iterator[Path]:
    """``mount ARGUMENTS PATH`` (the SLURM tests run as root), lazily unmounted afterwards."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", *arguments, str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def leave_free(disk: Path, pages: int) -> None:
    """Fill ``disk`` up, then give back ``pages`` pages."""
    filler = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
    with contextlib.suppress(OSError):  # up to a full disk
        while True:
            os.write(filler, b"x" * PAGE)
    os.close(filler)
    os.truncate(disk / "filler", (disk / "filler").stat().st_size // PAGE * PAGE - pages * PAGE)


def test_a_sweep_resumed_on_a_full_disk_is_refused_before_sbatch(slurm: SlurmCluster, tmp_path: Path) -> None:
    """Four failed members on a 4 MB file system with two pages left: room to write each member's submission
    ahead, not to hold the room each needs to record its job. The array's submitit folder is on a roomy file
    system of its own, so that sbatch itself could be asked: the hand-over refuses before it is, and leaves no
    job queued, no submitit file and every member's state.json byte for byte as it was."""
    with mounted(tmp_path / "disk", "-t", "tmpfs", "-o", "size=4m", "tmpfs") as disk:
        spec = write_spec(disk, "sweep", entrypoint="tests.launcher.entrypoints:failing")
        data = json.loads(spec.read_text())
        data.update(snapshot=False, sweep={"grid": {"config.lr": [0.01, 0.02, 0.04, 0.08][:MEMBERS]},
                                           "max_parallel": MEMBERS})
        data["requeue"] = {**data["requeue"], "max_failures": 0, "exclude_failed_nodes": False}
        spec.write_text(json.dumps(data))
        elfes(slurm, "submit", str(spec), "--executor", "slurm")
        sweep = SweepPaths(disk / "sweep")
        members = [Path(member.run_dir) for member in load_sweep(sweep).members]
        assert len(members) == MEMBERS
        for member in members:
            wait_ended(member, "failed")
        wait_for(lambda: slurm.run("squeue", "-h", check=False).stdout.strip() == "", timeout_s=120,
                 what="the failed members' jobs to leave the queue")
        before = {member: RunPaths(member).state.read_bytes() for member in members}
        record = sweep.record.read_bytes()
        with mounted(sweep.submitit, "-t", "tmpfs", "-o", "size=64m", "tmpfs"):
            leave_free(disk, 2)
            resumed = elfes(slurm, "resume", str(sweep.sweep_dir), check=False)
            assert resumed.returncode != 0 and "No space left" in resumed.stderr, resumed.stdout + resumed.stderr
            assert slurm.run("squeue", "-h", check=False).stdout.strip() == ""
            assert list(sweep.submitit.iterdir()) == []
        assert {member: RunPaths(member).state.read_bytes() for member in members} == before
        assert sweep.record.read_bytes() == record
        (disk / "filler").unlink()
        resumed = elfes(slurm, "resume", str(sweep.sweep_dir))  # with room again, the same resume hands them over
        assert f"resumed {MEMBERS} member(s) as SLURM job array" in resumed.stdout, resumed.stdout
