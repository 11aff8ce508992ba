"""The goodput accounting on hand-made records: each part measured as docs/run-directory.md says, the parts
adding up to the wall time, the redone steps those past the step a later attempt resumed from, the running
totals the same whether kept by the writer, rebuilt from the events, or read in pieces."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from elfes.records import RunLogger, read_events
from elfes.records.goodput import Goodput, LaunchTimes, TimeParts, account_goodput, format_goodput, sum_goodputs
from elfes.records.timings import read_timings, timings_of_events

T0 = datetime(2026, 1, 2, 3, 0, 0, tzinfo=timezone.utc)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def stamp(seconds: float) -> str:
    return at(seconds).isoformat()


def start(seconds: float, step: int, kind: str = "started") -> dict:
    return {"event": kind, "time": stamp(seconds), "state": {"step": step}}


def train(seconds: float, step: int) -> dict:
    return {"event": "train", "time": stamp(seconds), "step": step}


def checkpoint(seconds: float, step: int, blocked_s: float | None, duration_s: float = 9.0) -> dict:
    event = {"event": "checkpoint", "time": stamp(seconds), "step": step, "duration_s": duration_s}
    if blocked_s is not None:
        event["blocked_s"] = blocked_s
    return event


def evaluation(seconds: float, step: int, duration_s: float) -> dict:
    return {"event": "evaluation", "time": stamp(seconds), "step": step, "duration_s": duration_s}


def end(kind: str, seconds: float, step: int, train_s: float, evaluation_s: float, checkpoint_s: float) -> dict:
    return {"event": kind, "time": stamp(seconds), "state": {"step": step}, "train_s": train_s,
            "evaluation_s": evaluation_s, "checkpoint_s": checkpoint_s, "wall_s": 0.0}


# A run submitted at 0, queued until 10, started training at 12. Attempt 1: checkpoint at step 10 (a
# synchronous save of 2 s), evaluation of 3 s, then SIGKILLed after logging step 14. `elfes resume` at 100,
# attempt 2 launched at 104, resumed from step 10 at 105, finished at step 20 (train_s 40) at 150, ended at 151.
KILLED_RUN = [
    start(12, 0),
    train(22, 5),
    evaluation(35, 10, 3.0),
    checkpoint(37, 10, blocked_s=2.0),
    train(47, 12),
    train(57, 14),
    start(105, 10, "resumed"),
    end("finished", 150, 20, train_s=40.0, evaluation_s=1.0, checkpoint_s=0.5),
]
KILLED_LAUNCHES = [LaunchTimes(1, at(10)), LaunchTimes(2, at(104), at(151))]
KILLED_HANDOVERS = [at(0), at(100)]


def test_a_killed_attempt_redoes_the_steps_past_its_last_checkpoint_and_the_parts_add_up_to_the_wall_time():
    run = account_goodput(KILLED_LAUNCHES, KILLED_HANDOVERS, timings_of_events(KILLED_RUN).attempts)
    first, second = run.attempts
    assert run.wall_s == 151.0 and run.parts.total_s == pytest.approx(151.0, abs=1e-9)
    assert [attempt.parts.total_s for attempt in run.attempts] == pytest.approx([57.0, 94.0], abs=1e-9)
    # Attempt 1 trained 14 steps in 45 s - 3 s of evaluation - 2 s of checkpoint = 40 s; steps 11 to 14 were
    # trained again by attempt 2 (resumed from 10): 4/14 of it redone.
    assert first.redone_steps == 4 and run.redone_steps == 4
    assert first.parts == TimeParts(useful_s=pytest.approx(40 * 10 / 14), redone_s=pytest.approx(40 * 4 / 14),
                                    evaluation_s=3.0, checkpoint_s=2.0, startup_s=2.0, queue_s=10.0, between_s=0.0,
                                    other_s=pytest.approx(0.0, abs=1e-9))
    # Its window ends at its last record (the kill is not recorded); then nothing ran until the resume at 100.
    assert second.parts == TimeParts(useful_s=40.0, evaluation_s=1.0, checkpoint_s=0.5, startup_s=1.0, queue_s=4.0,
                                     between_s=43.0, other_s=pytest.approx(46 - 41.5))
    assert run.goodput == pytest.approx(run.parts.useful_s / 151.0)


def test_a_stopped_attempt_redoes_nothing_and_an_asynchronous_save_stalls_only_for_its_blocked_part():
    events = [start(0, 0), checkpoint(20, 5, blocked_s=0.25, duration_s=4.0),
              end("stopped", 30, 8, train_s=25.0, evaluation_s=0.0, checkpoint_s=0.75),
              start(40, 8, "resumed"), end("finished", 60, 16, train_s=18.0, evaluation_s=0.0, checkpoint_s=1.0)]
    launches = [LaunchTimes(1, at(0), at(31)), LaunchTimes(2, at(39), at(61))]
    run = account_goodput(launches, [at(0)], timings_of_events(events).attempts)
    assert run.redone_steps == 0 and run.parts.redone_s == 0.0
    assert run.parts.useful_s == 43.0 and run.parts.checkpoint_s == 1.75
    assert run.parts.between_s == 8.0 and run.parts.total_s == pytest.approx(run.wall_s) and run.wall_s == 61.0
    # A killed loop's stall is what its records sum: blocked_s, or duration_s in records older than blocked_s.
    killed = timings_of_events([start(0, 0), checkpoint(5, 2, blocked_s=0.25), checkpoint(9, 4, blocked_s=None)])
    assert killed.attempts[0].checkpoint_s == 9.25


def test_a_run_under_way_is_accounted_to_now_and_a_queued_job_waits_in_the_queue():
    running = account_goodput([LaunchTimes(1, at(5))], [at(0)], timings_of_events([start(8, 0), train(20, 4)]).attempts,
                              now=at(30))
    assert (running.wall_s, running.parts.queue_s, running.parts.startup_s, running.parts.useful_s) == (30.0, 5.0, 3.0, 12.0)
    assert running.parts.other_s == 10.0 and running.as_of == stamp(30)
    starting = account_goodput([LaunchTimes(1, at(5))], [at(0)], [], now=at(9))
    assert starting.parts == TimeParts(queue_s=5.0, startup_s=4.0)
    # Requeued at 40 after a preemption: a resubmission at 50 (a local job past its start limit) still queued at 70.
    requeued = account_goodput([LaunchTimes(1, at(5), at(40))], [at(0), at(50)],
                               timings_of_events([start(8, 0), end("stopped", 39, 4, 30.0, 0.0, 1.0)]).attempts,
                               now=at(70))
    assert requeued.attempts[-1].number is None
    assert requeued.attempts[-1].parts == TimeParts(between_s=10.0, queue_s=20.0)
    assert requeued.wall_s == 70.0 and requeued.parts.total_s == pytest.approx(70.0)


def test_a_requeued_slurm_job_waits_between_attempts_until_it_is_eligible_then_in_the_queue():
    # SLURM requeued the job at 40 (no hand-over: the job requeued itself); its BeginTime hold let it start at
    # 100 (sacct's Eligible), and it started at 130. Its submission at 0 was eligible at 1 and started at 5.
    events = [start(8, 0), end("stopped", 39, 4, 30.0, 0.0, 1.0), start(133, 4, "resumed"),
              end("finished", 160, 8, 25.0, 0.0, 1.0)]
    launches = [LaunchTimes(1, at(5), at(40), eligible_at=at(1)), LaunchTimes(2, at(130), at(161), eligible_at=at(100))]
    run = account_goodput(launches, [at(0)], timings_of_events(events).attempts)
    first, second = run.attempts
    assert (first.parts.between_s, first.parts.queue_s) == (1.0, 4.0)
    assert (second.parts.between_s, second.parts.queue_s, second.parts.startup_s) == (60.0, 30.0, 3.0)
    assert run.parts.total_s == pytest.approx(run.wall_s) and run.wall_s == 161.0
    # Without accounting the whole wait after the requeue is between attempts, as before.
    plain = account_goodput([LaunchTimes(1, at(5), at(40)), LaunchTimes(2, at(130), at(161))], [at(0)],
                            timings_of_events(events).attempts)
    assert (plain.attempts[1].parts.between_s, plain.attempts[1].parts.queue_s) == (90.0, 0.0)
    # An Eligible outside the window (a start matched wrongly) changes nothing.
    stray = account_goodput([LaunchTimes(1, at(5), at(40)), LaunchTimes(2, at(130), at(161), eligible_at=at(20))],
                            [at(0)], timings_of_events(events).attempts)
    assert stray.attempts[1].parts == plain.attempts[1].parts


def test_records_without_a_launcher_make_one_attempt_per_start_and_a_failure_redoes_its_steps():
    events = [start(0, 0), train(10, 6), {"event": "failed", "time": stamp(11), "step": 6},
              start(20, 4, "resumed"), end("finished", 40, 12, train_s=19.0, evaluation_s=0.0, checkpoint_s=0.0)]
    run = account_goodput([], [], timings_of_events(events).attempts)
    assert [attempt.number for attempt in run.attempts] == [1, 2]
    assert run.redone_steps == 2 and run.parts.redone_s == pytest.approx(11 * 2 / 6)
    assert run.parts.between_s == 9.0 and run.wall_s == 40.0 and run.parts.total_s == pytest.approx(40.0)


def test_a_sweep_sums_its_members_and_the_line_names_every_part_that_took_time():
    one = account_goodput(KILLED_LAUNCHES, KILLED_HANDOVERS, timings_of_events(KILLED_RUN).attempts)
    other = Goodput(wall_s=49.0, parts=TimeParts(useful_s=45.0, other_s=4.0), redone_steps=0)
    total = sum_goodputs([one, other])
    assert total.wall_s == 200.0 and total.redone_steps == 4
    assert total.parts.useful_s == pytest.approx(one.parts.useful_s + 45.0)
    assert total.goodput == pytest.approx((one.parts.useful_s + 45.0) / 200.0)
    line = format_goodput(one)
    assert line.startswith(f"goodput {one.goodput:.1%} of 2m31s: useful training ")
    assert "redone 11.4s (4 steps)" in line and "between attempts 43.0s" in line and "queue 14.0s" in line


def test_the_writer_keeps_the_totals_that_the_events_give_and_picks_them_up_after_a_kill(tmp_path: Path):
    """RunLogger publishes timings.json after every event whose fields the totals sum; a new RunLogger (the next
    attempt) catches up with the train records the killed one wrote after them, and a lost file is rebuilt."""
    run_dir = tmp_path / "run"
    state = {key: 0 for key in ("epoch", "next_batch", "step", "batches", "samples", "evaluations_without_improvement")}
    state.update(best_metric=None, best_step=None, stop_reason=None)
    budget = {"epochs": 1, "max_steps": None, "planned_steps": 20, "updates_per_epoch": 20, "batches_per_epoch": 20}
    started = {"event": "started", "world_size": 1, "precision": "no", "device": "cpu", "gradient_accumulation_steps": 1,
               "config": {}, "budget": budget, "optimizer": {}, "ema_decay": None, "objective": None, "metadata": {},
               "state": state}
    where = {"epoch": 1, "planned_steps": 20, "samples": 0, "metrics": {"loss": 1.0}}
    with RunLogger(run_dir, is_main_process=True) as logger:
        logger.log(started)
        logger.log({"event": "checkpoint", "path": "p", "epoch": 1, "step": 2, "next_batch": 2, "reason": "interval",
                    "best": False, "final": False, "bytes": 1, "duration_s": 0.5, "blocked_s": 0.5})
        published = read_timings(run_dir)
        logger.log({"event": "train", "step": 3, **where})
    assert published.attempts[0].checkpoint_s == 0.5 and published.attempts[0].last_step == 2
    assert read_timings(run_dir).attempts[0].last_step == 2  # a train record is not published by itself
    with RunLogger(run_dir, is_main_process=True) as logger:
        logger.log({**started, "event": "resumed", "resumed_from": "p", "state": {**state, "step": 2}})
    assert read_timings(run_dir).attempts == timings_of_events(read_events(run_dir)).attempts
    kept = read_timings(run_dir)
    assert [(a.start_step, a.last_step) for a in kept.attempts] == [(0, 3), (2, 2)]
    (run_dir / "timings.json").unlink()
    with RunLogger(run_dir, is_main_process=True) as logger:
        logger.log({"event": "evaluation", "epoch": 1, "step": 2, "weights": "raw", "metrics": {}, "duration_s": 0.25,
                    "monitor": None, "improved": None, "best_metric": None, "best_step": None})
    rebuilt = read_timings(run_dir)
    assert [(a.start_step, a.last_step, a.evaluation_s) for a in rebuilt.attempts] == [(0, 3, 0.0), (2, 2, 0.25)]
    assert rebuilt.offset == (run_dir / "events.jsonl").stat().st_size


def test_status_reads_the_published_totals_and_the_tail_and_refuses_a_big_log_without_them(tmp_path: Path):
    """A run without timings.json has its records read whole up to SCAN_BYTES; past it, no goodput (NoTimings,
    which status turns into a note); with the file, the records after its offset are read from the tail only."""
    from elfes.launcher.rundir.goodput_reading import SCAN_BYTES, NoTimings, run_timings
    from elfes.launcher.rundir.paths import RunPaths

    paths = RunPaths(tmp_path / "run")
    paths.run_dir.mkdir()
    lines = [start(0, 0), checkpoint(1, 1, blocked_s=0.5)]
    padding = "x" * 200
    lines += [{**train(2 + step / 1000, step), "pad": padding} for step in range(2, 2 + SCAN_BYTES // 200)]
    paths.events.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(NoTimings, match="timings.json is missing"):
        run_timings(paths)
    published = timings_of_events(lines[:2])
    published.offset = len("".join(json.dumps(line) + "\n" for line in lines[:2]))
    paths.timings.write_text(json.dumps(published.state_dict()))
    read = run_timings(paths)
    assert read.attempts == timings_of_events(lines).attempts
    assert (read.attempts[0].last_step, read.attempts[0].checkpoint_s) == (lines[-1]["step"], 0.5)
