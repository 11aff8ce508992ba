"""Trust under faults: real local jobs whose `last` is dangling or foreign, whose run directory's file
system fills up or turns read-only mid-run, that are killed at their time limit, and whose state.json
is damaged. Each case failed before its fix (issue 15, items 8-10)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from local_runs import (
    CONFIG,
    Runs,
    events,
    job_gone,
    tasks_running,
    trained_to,
    wait_ended,
    wait_for,
    write_spec,
)
from run_comparison import assert_runs_bitwise_equal
from run_fixtures import make_run

from elfes.launcher.cli.exit_codes import EXIT_RUN_DAMAGED
from elfes.launcher.cli.main import main as elfes
from elfes.launcher.rundir.paths import RunPaths

SLOW = {**CONFIG, "step_delay_s": 0.3}  # about 10 s of training: a cancel or a remount lands mid-run


def run_cli(*argv: str) -> tuple[int, str]:
    """``elfes ARGV`` in this process: its exit code and what it printed (stdout and stderr)."""
    stream = io.StringIO()
    with contextlib.redirect_stdout(stream), contextlib.redirect_stderr(stream):
        code = elfes(list(argv))
    return code, stream.getvalue()


@contextlib.contextmanager
def mounted(path: Path, *arguments: str) -> Iterator[Path]:
    """``mount ARGUMENTS PATH`` (root; the tests and CI run as root), lazily unmounted afterwards."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", *arguments, str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"needs root to mount ({done.stderr.strip()}); CI runs as root")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def cancelled_mid_run(runs: Runs, name: str, *, after_step: int) -> Path:
    run_dir = runs.submit(name, config=SLOW)
    wait_for(lambda: tasks_running(run_dir, 1, 1) and trained_to(run_dir, after_step),
             what=f"attempt 1 to train to step {after_step}", run_dir=run_dir)
    assert elfes(["cancel", str(run_dir)]) == 0
    wait_ended(run_dir, "cancelled")
    return run_dir


def started_records(run_dir: Path) -> list[dict]:
    return [event for event in events(run_dir) if event["event"] in ("started", "resumed")]


# -- item 8: `last` trusted neither too little nor too much ------------------------------------------------------
def test_a_dangling_last_resumes_from_the_runs_newest_complete_checkpoint(
    runs: Runs, references: Callable[[int], Path]
) -> None:
    """`last`'s file removed: `elfes resume` continues from the run's newest complete checkpoint (the
    epoch-1 one) and ends bitwise equal to the uninterrupted run."""
    reference = references(1)
    run_dir = cancelled_mid_run(runs, "dangling", after_step=9)  # past the epoch-1 checkpoint (step 8)
    paths = RunPaths(run_dir)
    target = paths.last.resolve()
    assert target.name != "step-00000008-batches-0000000016.pt"
    target.unlink()
    code, shown = run_cli("status", str(run_dir))
    assert f"names {target.name}, which does not exist: `elfes resume` continues from the run's newest" in shown

    assert elfes(["resume", str(run_dir)]) == 0
    state = wait_ended(run_dir, "finished")
    assert [a.outcome for a in state.attempts] == ["cancelled", "finished"]
    resumed = started_records(run_dir)[-1]
    assert resumed["event"] == "resumed"
    assert Path(resumed["resumed_from"]).name == "step-00000008-batches-0000000016.pt"
    assert "this run's newest complete checkpoint" in paths.rank_log(2, 0).read_text()
    code, shown = run_cli("status", str(run_dir), "--json")
    assert code == 0 and json.loads(shown)["step"] == 16
    wait_ended(reference, "finished")
    assert_runs_bitwise_equal(run_dir, reference)


def test_a_last_pointing_at_another_runs_checkpoint_is_refused(runs: Runs) -> None:
    """`last` re-pointed into another run's checkpoint folder, then at a copy of that run's checkpoint
    inside this run's folder: each resume fails with the reason and trains nothing."""
    other = runs.submit("other", config={**CONFIG, "step_delay_s": 0.0})
    wait_ended(other, "finished")
    run_dir = cancelled_mid_run(runs, "ours", after_step=2)
    paths, foreign = RunPaths(run_dir), RunPaths(other).final.resolve()
    starts = len(started_records(run_dir))

    os.unlink(paths.last)
    os.symlink(os.path.relpath(foreign, paths.checkpoints), paths.last)
    code, shown = run_cli("status", str(run_dir))
    assert "outside the run's checkpoint folder: `elfes resume` refuses it" in shown
    assert elfes(["resume", str(run_dir)]) == 0
    state = wait_ended(run_dir, "failed")
    assert "outside this run's checkpoint folder" in state.error and str(foreign) in state.error
    assert len(started_records(run_dir)) == starts  # nothing trained

    copy = paths.checkpoints / "step-00000099-batches-0000000198.pt"
    shutil.copyfile(foreign, copy)
    os.unlink(paths.last)
    os.symlink(copy.name, paths.last)
    assert elfes(["resume", str(run_dir)]) == 0
    state = wait_ended(run_dir, "failed")
    run_id = next(e["run_id"] for e in events(other) if e["event"] == "started")
    assert f"a checkpoint of run {run_id}, not of this run" in state.error
    assert len(started_records(run_dir)) == starts
    code, shown = run_cli("status", str(run_dir))
    assert f"a checkpoint of run {run_id}" in shown


def test_a_run_killed_before_its_first_checkpoint_and_again_after_it_resumes_from_its_own(tmp_path: Path) -> None:
    """Found by the rehearsal soak: attempt 1 killed after its `started` record but before any checkpoint,
    attempt 2 started afresh (a new run id) and published one, then was killed: attempt 3 resumes from it,
    the checkpoint of the run's latest fresh start, instead of refusing it as another run's."""
    import torch

    from elfes.launcher.job.resume_point import resume_point

    paths = RunPaths(tmp_path)
    paths.checkpoints.mkdir(parents=True)
    paths.events.write_text("".join(json.dumps({"event": "started", "time": "2026-12-02T00:00:00+00:00",
                                                "run_id": run_id}) + "\n" for run_id in ("killed-early", "second")))
    checkpoint = paths.checkpoints / "step-00000004-batches-0000000016.pt"
    torch.save({"format": "elfes-checkpoint", "version": 3, "run_id": "second"}, checkpoint)
    os.symlink(checkpoint.name, paths.last)
    assert resume_point(paths) == (paths.last, None)


# -- item 9: a lost attempt names its cause ---------------------------------------------------------------------
def effective_status(run_dir: Path) -> dict:
    """`elfes status --json` of one run: what the readers make of it (a vanished job counted lost)."""
    code, shown = run_cli("status", str(run_dir), "--json")
    assert code == 0, shown
    return json.loads(shown)


def wait_lost(run_dir: Path) -> dict:
    """Wait until the job is gone and the readers count its attempt lost (its state.json cannot say so)."""
    return wait_for(lambda: job_gone(run_dir) and (s := effective_status(run_dir))["status"] == "failed" and s,
                    what="the job to be gone, its attempt lost", run_dir=run_dir, may_end=True)


def submit_following(runs: Runs, name: str, **spec_fields) -> tuple[Path, int, str]:
    """``elfes submit SPEC --follow`` of a new run: its directory, the exit code and what was printed."""
    spec = write_spec(runs.folder, name, **spec_fields)
    runs.run_dirs.append(runs.folder / name)
    code, shown = run_cli("submit", str(spec), "--executor", "local", "--follow")
    return runs.folder / name, code, shown


def test_a_full_disk_after_training_is_named_not_lost_to_a_kill(runs: Runs, tmp_path: Path) -> None:
    """Training finished, then the run directory's file system filled up before state.json could say so:
    `submit --follow`, `status` and `logs` name the full file system, not a kill."""
    with mounted(tmp_path / "disk", "-t", "tmpfs", "-o", "size=1m", "tmpfs") as disk:
        runs.folder = disk
        run_dir, code, followed = submit_following(
            runs, "full", config={**CONFIG, "epochs": 1},
            entrypoint="tests.launcher.fault_entrypoints:fills_the_disk_after_training",
            snapshot=False)  # a copy of the repository would not fit in 1 MB: the job fills the disk itself
        assert code == 4 and f"the file system of {run_dir} is full" in followed, followed
        status = wait_lost(run_dir)
        assert [attempt["outcome"] for attempt in status["attempts"]] == ["lost"]
        error = status["error"]
        assert f"the file system of {run_dir} is full" in error and "could not record its end in state.json" in error
        assert "killed, or its node failed" not in error and "killed, or its node failed" not in followed
        code, shown = run_cli("logs", str(run_dir))
        assert code == 0 and f"attempt 1 ended lost: {error}" in shown


def test_a_resume_refused_on_a_full_disk_leaves_state_json_as_it_was(tmp_path: Path) -> None:
    """A stopped run on a file system with about 20 kB free: room for the code snapshot and the submission's
    record, not for the executor's files and then state.json naming the job. The resume is refused before
    the job is handed over, and state.json is byte for byte what it was (it said "submitted", naming no job)."""
    with mounted(tmp_path / "disk", "-t", "tmpfs", "-o", "size=1m", "tmpfs") as disk:
        paths = make_run(disk / "project")
        before = paths.state.read_bytes()
        filler = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
        with contextlib.suppress(OSError):  # up to a full disk
            while True:
                os.write(filler, b"x" * 4096)
        os.close(filler)
        os.truncate(disk / "filler", (disk / "filler").stat().st_size - 20_000)
        code, shown = run_cli("resume", str(paths.run_dir))
        assert code != 0 and "No space left" in shown, shown
        assert paths.state.read_bytes() == before


def test_a_run_directory_turned_read_only_mid_run_is_named(runs: Runs, tmp_path: Path) -> None:
    """The run directory becomes read-only while the job trains (a read-only bind mount replaces the
    writable one: the job's open files stay writable, new files are refused), so the epoch-end checkpoint
    and then state.json cannot be written. `status` and `logs` name the error and the file system."""
    with mounted(tmp_path / "disk", "-t", "tmpfs", "-o", "size=8m", "tmpfs") as disk, \
            mounted(tmp_path / "view", "--bind", str(disk)) as view:
        runs.folder = view
        run_dir = runs.submit("readonly", config=SLOW)
        wait_for(lambda: tasks_running(run_dir, 1, 1) and trained_to(run_dir, 2),
                 what="attempt 1 to train to step 2", run_dir=run_dir)
        subprocess.run(["umount", "-l", str(view)], check=True)
        subprocess.run(["mount", "--bind", "-o", "ro", str(disk), str(view)], check=True)
        assert [attempt["outcome"] for attempt in wait_lost(run_dir)["attempts"]] == ["lost"]
        code, shown = run_cli("status", str(run_dir))
        assert "Read-only file system" in shown and f"the file system of {run_dir} is read-only" in shown
        assert "killed, or its node failed" not in shown
        code, shown = run_cli("logs", str(run_dir))
        assert "attempt 1 ended lost" in shown and "Read-only file system" in shown


def test_a_local_attempt_killed_at_its_time_limit_says_so(runs: Runs) -> None:
    """A one-minute limit, the requeue signal 2 s before it, and a window that takes 30 s once a stop is
    requested: the attempt is killed while saving. The cause names the limit, the signal and the setting."""
    run_dir, code, followed = submit_following(
        runs, "limited", config={**CONFIG, "epochs": 20, "step_delay_s": 0.3}, slurm={"signal_delay_s": 2},
        entrypoint="tests.launcher.fault_entrypoints:slow_to_stop",
        resources={"nodes": 1, "tasks_per_node": 1, "gpus_per_node": 0, "cpus_per_task": 1, "mem_gb": 1,
                   "timeout_min": 1})
    assert code == 4 and ("time limit (resources.timeout_min = 1) reached while stopping; raise signal_delay_s or "
                          "the limit") in followed, followed
    error = wait_lost(run_dir)["error"]
    assert "while it was saving `last` on SIGUSR2" in error and "slurm.signal_delay_s = 2 s" in error
    assert "killed, or its node failed" not in error


# -- item 10: a damaged state.json ------------------------------------------------------------------------------
@pytest.mark.parametrize(("damage", "named"), [
    (lambda text: text.encode() + b"\xff", "can't decode byte 0xff"),
    (lambda text: text.replace('"max_requeues": 3', '"max_requeues": "lots"').encode(),
     "max_requeues is 'lots' (a string), not an integer"),
    (lambda text: text.replace('"step": 4', '"step": [4]').encode(), "attempts[0].step is a list, not an integer"),
    (lambda text: b"[]", "the content is a list, not an object"),
], ids=["not-utf-8", "max-requeues-a-string", "step-a-list", "not-an-object"])
def test_a_damaged_state_json_is_named_with_the_repair_and_other_runs_still_show(tmp_path: Path, damage, named) -> None:
    good = [make_run(tmp_path / name, name=name) for name in ("first", "third")]
    damaged = make_run(tmp_path / "second", name="second")
    damaged.state.write_bytes(damage(damaged.state.read_text()))
    before = damaged.state.read_bytes()

    code, shown = run_cli("status", str(damaged.run_dir))
    assert code == EXIT_RUN_DAMAGED == 8 and "Traceback" not in shown
    assert f"{damaged.state} cannot be read: " in shown and named in shown
    assert f"mv {damaged.state} {damaged.state}.damaged" in shown and "Keep the run directory" in shown
    code, shown = run_cli("status", str(good[0].run_dir), str(damaged.run_dir), str(good[1].run_dir), "--json")
    listed = json.loads(shown)
    assert code == EXIT_RUN_DAMAGED and [run["status"] for run in listed] == ["stopped", "unreadable", "stopped"]
    assert named in listed[1]["error"] and listed[1]["step"] == 4  # the run records still tell
    code, shown = run_cli("resume", str(damaged.run_dir))
    assert code == EXIT_RUN_DAMAGED and named in shown and "Traceback" not in shown
    code, shown = run_cli("logs", str(damaged.run_dir))
    assert code == 0 and "hello from rank 0" in shown and named in shown
    assert damaged.state.read_bytes() == before  # nothing rewritten


def test_the_repair_for_a_damaged_state_json_continues_from_last(runs: Runs) -> None:
    """Following the advice (move state.json aside, submit the recorded spec) continues the run from
    `last` with its checkpoints intact."""
    run_dir = cancelled_mid_run(runs, "repaired", after_step=2)
    paths = RunPaths(run_dir)
    saved = paths.last.resolve()
    paths.state.write_bytes(paths.state.read_bytes() + b"\xff")
    code, shown = run_cli("status", str(run_dir))
    assert f"mv {paths.state} {paths.state}.damaged" in shown and f"elfes submit {paths.spec}" in shown

    paths.state.rename(f"{paths.state}.damaged")
    assert elfes(["submit", str(paths.spec), "--executor", "local"]) == 0
    wait_ended(run_dir, "finished")
    assert started_records(run_dir)[-1]["resumed_from"] == str(saved)
