"""Asynchronous interval and best checkpoints (``TrainConfig(async_checkpoints=True)``).

Every run is real (one process, ``Accelerator(cpu=True)``); the background writer is held before
it serialises (``held_background_writes``) so that training really changes the live tensors while a
write is in flight, or so that a write is still in flight when the next boundary, a stop, an error
or the end of the run comes.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from checkpoint_files import assert_same_payload, comparable, published, step_of, tmpfs
from workloads import (
    RunSpec,
    assert_bitwise_equal,
    build,
    events_named,
    fresh_accelerate,
    held_background_writes,
    mse_step,
    quiet_logger,
    snapshot,
    writer_threads,
)

from elfes.engine import Interval, StopRequest, TrainConfig
from elfes.engine.checkpoint import read_checkpoint
from elfes.launcher.commands.doctor import save_times
from elfes.launcher.rundir.paths import RunPaths

SPECS = {
    # An interval checkpoint at every boundary (best ones among them), every tensor of every file compared.
    "every-step": RunSpec(checkpoint_every=Interval(1, "step"), evaluate_every=Interval(2, "step")),
    # Best checkpoints between interval ones, and retention run by the writer, protecting best.
    "best-and-retention": RunSpec(checkpoint_every=Interval(3, "step"), evaluate_every=Interval(1, "step"), keep_checkpoints=2),
}


def train(spec: RunSpec, directory: Path, run_dir: Path, *, hold: str | None = None, step=None, stop=None, resume=False):
    """Train ``spec`` to the end (or the stop) with its records in ``run_dir``; returns the run, state and
    what the held writer saw. After ``train`` no write may still be in flight."""
    fresh_accelerate()
    with quiet_logger(run_dir) as logger:
        run = build(spec, logger=logger)
        if step is not None:
            run.trainer.step = step
        arguments = dict(checkpoint_dir=directory, stop=stop, resume_from=directory / "last" if resume else None)
        if hold is None:
            state, held = run.trainer.train(run.config, **arguments), None
        else:
            with held_background_writes(run.trainer, until=hold) as held:
                state = run.trainer.train(run.config, **arguments)
    assert not writer_threads(), "train() returned with a checkpoint write in flight"
    return run, state, held


def pointers(directory: Path) -> dict[str, str]:
    return {name: os.readlink(directory / name) for name in ("last", "best", "final") if (directory / name).is_symlink()}


@pytest.mark.parametrize("hold", ["microbatch", "wait"])
@pytest.mark.parametrize("name", list(SPECS))
def test_asynchronous_checkpoints_equal_synchronous_ones_bitwise(tmp_path, name, hold):
    spec = SPECS[name]
    synchronous, _, _ = train(spec, tmp_path / "sync", tmp_path / "sync-run")
    asynchronous, _, held = train(spec.with_(async_checkpoints=True), tmp_path / "async", tmp_path / "async-run", hold=hold)

    files = [path.name for path in published(tmp_path / "sync")]
    assert [path.name for path in published(tmp_path / "async")] == files and files
    assert pointers(tmp_path / "async") == pointers(tmp_path / "sync")
    for file in files:  # raw and EMA weights, optimizer, scheduler, state, progress, every rank's RNG
        expected = torch.load(tmp_path / "sync" / file, map_location="cpu", weights_only=True)
        actual = torch.load(tmp_path / "async" / file, map_location="cpu", weights_only=True)
        assert_same_payload(comparable(expected), comparable(actual), file)
    assert_bitwise_equal(snapshot(synchronous.trainer), snapshot(asynchronous.trainer), name)

    events = events_named(tmp_path / "async-run", "checkpoint")
    background = [event for event in events if event["asynchronous"]]
    assert {event["reason"] for event in background} <= {"interval", "best"} and background
    assert [event["reason"] for event in events if not event["asynchronous"]] == ["final"]
    steps = [event["step"] for event in events_named(tmp_path / "sync-run", "checkpoint")]
    assert [event["step"] for event in events] == steps, "one event per checkpoint, at its boundary's step"
    assert all(event["blocked_s"] >= event["waited_s"] >= 0 and event["duration_s"] > 0 for event in events)
    if hold == "microbatch":
        # Training changed the live tensors before every write but the last (which the end of the run waited for).
        assert held.trained_over >= len(background) - 1 >= 1
    else:
        assert held.waited_for == len(background), "every write was still in flight at the next boundary"
        assert all(event["waited_s"] > 0 for event in events[1:]), "the wait for the write in flight is recorded"


def test_a_stop_while_a_write_is_in_flight_finishes_it_then_saves_last_synchronously(tmp_path):
    spec = RunSpec(checkpoint_every=Interval(1, "step"), async_checkpoints=True)
    stop, calls = StopRequest(), []

    def step(model, batch):
        calls.append(1)
        if len(calls) == 5:  # window 2: the write of step 1 is held in flight
            stop.request("pause")
        return mse_step(model, batch)

    paused, state, held = train(spec, tmp_path / "checkpoints", tmp_path / "run", hold="wait", step=step, stop=stop)
    assert state.stop_reason == "pause" and state.step == 2
    assert held.waited_for == 1, "the step-1 write was still in flight when the stop came"
    files = published(tmp_path / "checkpoints")
    assert [step_of(path) for path in files] == [1, 2]
    for path in files:
        read_checkpoint(path)  # both complete
    assert step_of((tmp_path / "checkpoints" / "last").resolve()) == 2

    events = [event for event in events_named(tmp_path / "run", "checkpoint")]
    assert [(e["step"], e["reason"], e["asynchronous"]) for e in events] == [(1, "interval", True), (2, "stop", False)]
    stop_save = events[1]
    assert stop_save["blocked_s"] >= stop_save["waited_s"] > 0
    names = [event["event"] for event in events_named(tmp_path / "run", "stopped")]
    assert names == ["stopped"]
    # elfes doctor measures the stop by its synchronous save, never by the background write.
    doctor_times = save_times(RunPaths(tmp_path / "run"))
    assert (doctor_times.checkpoints, doctor_times.longest_save_s) == (1, stop_save["blocked_s"])

    reference, _, _ = train(RunSpec(checkpoint_every=Interval(1, "step")), tmp_path / "reference", tmp_path / "reference-run")
    resumed, _, _ = train(spec, tmp_path / "checkpoints", tmp_path / "resumed", resume=True)
    assert_bitwise_equal(snapshot(reference.trainer), snapshot(resumed.trainer), "stopped during a write, resumed")


def test_the_end_of_the_run_reuses_the_in_flight_checkpoint_of_the_same_boundary(tmp_path):
    # The epoch-end interval checkpoint (step 4) is also the final one (no evaluation runs in between).
    spec = RunSpec(epochs=1, evaluate=False, checkpoint_every=Interval(1, "epoch"), async_checkpoints=True)
    _, state, held = train(spec, tmp_path / "checkpoints", tmp_path / "run", hold="wait")
    assert state.step == 4
    assert held.waited_for == 1 and held.serialised == 1, "the final checkpoint reused the file written in the background"
    (file,) = published(tmp_path / "checkpoints")
    assert {pointer: Path(link).name for pointer, link in pointers(tmp_path / "checkpoints").items()} == {
        "last": file.name, "final": file.name
    }
    events = events_named(tmp_path / "run", "checkpoint")
    assert [(e["reason"], e["asynchronous"], e["final"]) for e in events] == [("interval", True, False), ("final", False, True)]


def test_an_error_while_a_write_is_in_flight_raises_after_the_write_is_published(tmp_path):
    spec = RunSpec(checkpoint_every=Interval(1, "step"), async_checkpoints=True)
    calls = []

    def step(model, batch):
        calls.append(1)
        if len(calls) == 5:
            raise RuntimeError("the step failed")
        return mse_step(model, batch)

    with pytest.raises(RuntimeError, match="the step failed"):
        train(spec, tmp_path / "checkpoints", tmp_path / "run", hold="wait", step=step)
    assert not writer_threads()
    (file,) = published(tmp_path / "checkpoints")
    assert step_of(file) == 1 and (tmp_path / "checkpoints" / "last").resolve() == file
    read_checkpoint(file)
    names = [event["event"] for event in events_named(tmp_path / "run", "checkpoint") + events_named(tmp_path / "run", "failed")]
    assert names == ["checkpoint", "failed"]


def test_a_full_disk_during_a_background_write_raises_at_the_next_boundary_keeping_last(tmp_path):
    with tmpfs(tmp_path / "small", "size=2m") as folder:
        spec = RunSpec(epochs=1, evaluate=False, checkpoint_every=Interval(1, "step"), async_checkpoints=True)
        calls = []

        def step(model, batch):
            calls.append(1)
            if len(calls) == 4:  # window 2, once the step-1 write has ended: fill the disk
                for thread in writer_threads():
                    thread.join()
                with open(folder / "filler", "wb") as filler:
                    try:
                        while True:
                            filler.write(b"\0" * 65536)
                            filler.flush()
                    except OSError:
                        pass
            return mse_step(model, batch)

        fresh_accelerate()
        with quiet_logger(tmp_path / "run") as logger:
            run = build(spec, logger=logger)
            run.trainer.step = step
            with pytest.raises(OSError, match=r"No space left to write .*step-00000002-batches-0000000006\.pt.*previous file"):
                run.trainer.train(run.config, checkpoint_dir=folder)
        assert not writer_threads()
        assert run.trainer.state.step == 3, "raised at the boundary after the failed write"
        assert [step_of(path) for path in published(folder)] == [1]
        assert (folder / "last").resolve() == published(folder)[0]
        assert not [path for path in folder.iterdir() if path.name.startswith(".tmp-")]
    (failed,) = events_named(tmp_path / "run", "failed")
    assert failed["exception"] == "OSError" and "step-00000002-batches-0000000006.pt" in failed["message"]
    assert [event["step"] for event in events_named(tmp_path / "run", "checkpoint")] == [1]


def test_async_checkpoints_must_be_a_bool():
    with pytest.raises(TypeError, match=r"TrainConfig.async_checkpoints is 'yes'; use True .* or False"):
        TrainConfig(epochs=1, async_checkpoints="yes")
