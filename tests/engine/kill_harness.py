"""A training process that kills itself with SIGKILL at a chosen moment; used by test_kill.py.

Kill points (counted within one launch):
  ("call", n)            during the n-th training microbatch
  ("write", n)           half-way through writing the n-th torch.save stream (a checkpoint file)
  ("replace", n, "before"|"after")  just before or after the n-th rename (checkpoint files and pointers)
  ("overlap", n)         half-way through the n-th background write's file, once training has gone on
                         by a microbatch during that write (asynchronous checkpoints only)
Every launch resumes from ``last`` when it exists, as a requeued job does. With ``asynchronous`` the
job writes its interval checkpoints in the background, where the write and rename kills then land.
"""

from __future__ import annotations

import io
import os
import signal
import threading
from pathlib import Path

import torch
from workloads import WRITER_THREAD, RunSpec, build, mse_step, snapshot

from elfes.engine import Interval, Trainer
from elfes.engine.checkpoint import CheckpointDirectory
from elfes.engine.publish import BackgroundWriter

SPEC = RunSpec(checkpoint_every=Interval(1, "step"), keep_checkpoints=3)


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _install(kill: tuple | None) -> None:
    if kill is None:
        return
    kind, number = kill[0], kill[1]
    count = {"calls": 0}
    if kind == "write":
        original_save = torch.save

        def save(obj, stream, *args, **kwargs):
            count["calls"] += 1
            if count["calls"] != number or isinstance(stream, (str, os.PathLike)):
                return original_save(obj, stream, *args, **kwargs)
            buffer = io.BytesIO()
            original_save(obj, buffer, *args, **kwargs)
            data = buffer.getvalue()
            stream.write(data[: len(data) // 2])
            stream.flush()
            _die()

        torch.save = save
    elif kind == "replace":
        original_replace = os.replace

        def replace(source, destination, *args, **kwargs):
            count["calls"] += 1
            if count["calls"] == number and kill[2] == "before":
                _die()
            result = original_replace(source, destination, *args, **kwargs)
            if count["calls"] == number and kill[2] == "after":
                _die()
            return result

        os.replace = replace


def _kill_during_overlap(trainer: Trainer, number: int, marker: Path) -> None:
    """Kill half-way through the ``number``-th background write once training has trained a microbatch
    while it was in flight (touching ``marker`` first), or once the loop waits for it."""
    condition = threading.Condition()
    seen = {"writes": 0, "microbatches": 0, "loop_waits": False}
    original_save, original_start, original_collect, original_step = torch.save, BackgroundWriter.start, BackgroundWriter.collect, trainer.step

    def save(obj, stream, *args, **kwargs):
        if threading.current_thread().name != WRITER_THREAD or isinstance(stream, (str, os.PathLike)):
            return original_save(obj, stream, *args, **kwargs)
        seen["writes"] += 1
        if seen["writes"] != number:
            return original_save(obj, stream, *args, **kwargs)
        buffer = io.BytesIO()
        original_save(obj, buffer, *args, **kwargs)
        data = buffer.getvalue()
        stream.write(data[: len(data) // 2])
        stream.flush()
        with condition:
            held_at = seen["microbatches"]
            condition.wait_for(lambda: seen["loop_waits"] or seen["microbatches"] > held_at)
            if not seen["loop_waits"]:
                marker.touch()
        _die()

    def start(writer, publication, record):
        seen["loop_waits"] = False
        original_start(writer, publication, record)

    def collect(writer):
        with condition:
            seen["loop_waits"] = True
            condition.notify_all()
        return original_collect(writer)

    def step(model, batch):
        with condition:
            seen["microbatches"] += 1
            condition.notify_all()
        return original_step(model, batch)

    torch.save, BackgroundWriter.start, BackgroundWriter.collect, trainer.step = save, start, collect, step


def launch(directory: str, kill: tuple | None, output: str, asynchronous: bool = False) -> None:
    """One launch of the job: resume from ``last`` if present, train to the end, save the snapshot."""
    directory_path = Path(directory)
    _install(kill)
    last = directory_path / "last"
    run = build(SPEC.with_(async_checkpoints=asynchronous))
    if kill is not None and kill[0] == "overlap":
        _kill_during_overlap(run.trainer, kill[1], directory_path.with_name(f"{directory_path.name}.overlapped"))
    if kill is not None and kill[0] == "call":
        calls = {"n": 0}

        def step(model, batch):
            calls["n"] += 1
            if calls["n"] == kill[1]:
                _die()
            return mse_step(model, batch)

        run.trainer.step = step
    # As a user should: resume from `last` once anything was published. A kill between renaming a checkpoint
    # into place and pointing `last` at it leaves no `last`; the engine then resumes from the newest file.
    published = last.is_symlink() or bool(CheckpointDirectory(directory_path).checkpoints())
    run.trainer.train(run.config, checkpoint_dir=directory_path, resume_from=last if published else None)
    torch.save(snapshot(run.trainer), output)
