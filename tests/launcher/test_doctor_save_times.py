"""`elfes doctor`'s save times: what a stop needs is the synchronous save, not a background write; and its
``--set``, read before SLURM is asked (with SLURM: tests/slurm/test_slurm_preemption.py)."""

from __future__ import annotations

import json

import yaml

from elfes.launcher.cli.main import main as elfes
from elfes.launcher.commands.doctor import save_times
from elfes.launcher.rundir.paths import RunPaths


def write_events(paths: RunPaths, events: list[dict]) -> None:
    paths.run_dir.mkdir(parents=True)
    paths.events.write_text("".join(json.dumps(event) + "\n" for event in events))


def checkpoint(time: str, reason: str, *, duration_s: float, **fields) -> dict:
    return {"event": "checkpoint", "time": time, "reason": reason, "duration_s": duration_s, **fields}


def test_asynchronous_interval_writes_are_not_taken_for_the_stop_save(tmp_path):
    paths = RunPaths(tmp_path / "run")
    write_events(paths, [
        # A slow background write (it shares the CPU with training) that blocked the loop for 0.05 s.
        checkpoint("2026-01-01T00:00:10+00:00", "interval", duration_s=40.0, blocked_s=0.05, asynchronous=True),
        {"event": "stop_signal", "time": "2026-01-01T00:01:00+00:00", "signal": "SIGTERM"},
        # The stop waited 3 s for the write in flight, then saved for 4 s: the loop stood still 7 s.
        checkpoint("2026-01-01T00:01:08+00:00", "stop", duration_s=4.0, blocked_s=7.0, asynchronous=False, waited_s=3.0),
    ])
    times = save_times(paths)
    assert times is not None
    assert times.checkpoints == 1
    assert times.longest_save_s == 7.0
    assert times.longest_stop_s == 8.0
    assert times.needed_s == 8.0


def test_only_background_writes_leave_the_save_time_unmeasured(tmp_path):
    paths = RunPaths(tmp_path / "run")
    write_events(paths, [checkpoint("2026-01-01T00:00:10+00:00", "interval", duration_s=40.0, blocked_s=0.05, asynchronous=True)])
    assert save_times(paths) is None


def test_records_written_before_blocked_s_existed_count_their_duration(tmp_path):
    paths = RunPaths(tmp_path / "run")
    write_events(paths, [
        checkpoint("2026-01-01T00:00:10+00:00", "interval", duration_s=2.5),
        checkpoint("2026-01-01T00:00:20+00:00", "final", duration_s=3.5),
    ])
    times = save_times(paths)
    assert (times.checkpoints, times.longest_save_s, times.longest_stop_s) == (2, 3.5, None)


def test_doctor_takes_set_like_the_other_verbs(tmp_path, capsys):
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({"name": "doctored", "command": ["true"], "run_dir": "run"}))
    assert elfes(["doctor", str(spec), "--set", "resources.timeout_min=soon"]) == 2
    error = capsys.readouterr().err
    assert f"{spec} (with --set resources.timeout_min=soon): resources.timeout_min = \"soon\"" in error, error
    assert elfes(["doctor", "--set", "slurm.partition=long"]) == 2
    error = capsys.readouterr().err
    assert "--set changes a field of the job spec, and none was given" in error and "elfes doctor JOB.yaml" in error
