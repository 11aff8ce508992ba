"""A training process that kills itself with SIGKILL at a chosen moment; used by test_kill.py.

Kill points (counted within one launch):
  ("call", n)            during the n-th training microbatch
  ("write", n)           half-way through writing the n-th torch.save stream (a checkpoint file)
  ("replace", n, "before"|"after")  just before or after the n-th rename (checkpoint files and pointers)
Every launch resumes from ``last`` when it exists, as a requeued job does.
"""

from __future__ import annotations

import io
import os
import signal
from pathlib import Path

import torch
from workloads import RunSpec, build, mse_step, snapshot

from elfes.engine import Interval

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


def launch(directory: str, kill: tuple | None, output: str) -> None:
    """One launch of the job: resume from ``last`` if present, train to the end, save the snapshot."""
    directory_path = Path(directory)
    _install(kill)
    last = directory_path / "last"
    run = build(SPEC)
    if kill is not None and kill[0] == "call":
        calls = {"n": 0}

        def step(model, batch):
            calls["n"] += 1
            if calls["n"] == kill[1]:
                _die()
            return mse_step(model, batch)

        run.trainer.step = step
    run.trainer.train(run.config, checkpoint_dir=directory_path, resume_from=last if last.exists() else None)
    torch.save(snapshot(run.trainer), output)
