"""How long the training loop stands still at an interval checkpoint: asynchronous against synchronous.

The payload is the one of :mod:`benchmarks.checkpoint` (16.8M float32 parameters and both AdamW
moments, 201 MB), trained by a real ``Trainer`` on CUDA when there is one, else on the CPU. Each
round runs one ``train`` call per variant, with two interval checkpoints ``k`` steps apart; the
figure is the ``blocked_s`` that the second one's ``checkpoint`` event records (the first fills the
snapshot's host buffers, allocated once per ``train`` call). ``k`` is chosen so that a background
write ends before the next checkpoint, as it should in a real run. The third variant is the bare
copy of the same tensors into kept host buffers (pinned on CUDA): what an asynchronous checkpoint
cannot avoid.
"""

from __future__ import annotations

import io
import math
import tempfile
import time
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState
from rich.console import Console
from torch.utils.data import DataLoader, Dataset

from elfes.engine import Interval, RunLogger, TrainConfig, Trainer
from elfes.records import read_events

from .checkpoint import make_model, payload_megabytes, step
from .measure import Progress, Row, interleave, median_of, median_ratio


class Zeros(Dataset):
    """As many zero (input, target) pairs as asked for, none of them stored."""

    def __init__(self, width: int, length: int) -> None:
        self.width, self.length = width, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.zeros(self.width), torch.zeros(self.width)


def build(width: int, layers: int, logger: RunLogger) -> Trainer:
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    model = make_model(width, layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loader = DataLoader(Zeros(width, 4 * 10**6), batch_size=4)
    return Trainer(accelerator, model, optimizer, loader, step, logger=logger)


def payload_tensors(trainer: Trainer) -> list[torch.Tensor]:
    tensors = list(trainer.module.state_dict().values())
    return tensors + [value for state in trainer.optimizer.state.values() for value in state.values() if isinstance(value, torch.Tensor)]


def run(rounds: int, progress: Progress, *, smoke: bool = False) -> list[Row]:
    width, layers = (256, 2) if smoke else (2048, 4)
    with tempfile.TemporaryDirectory(prefix="elfes-blocking-bench-") as folder:
        run_dir, checkpoints = Path(folder) / "run", Path(folder) / "checkpoints"
        with RunLogger(run_dir, is_main_process=True, console=Console(file=io.StringIO())) as logger:
            trainer = build(width, layers, logger)
            device = trainer.accelerator.device.type
            calls = {"checkpoints": 0, "steps": 0}

            def train(asynchronous: bool | None, every: int) -> list[dict]:
                """Train on to the second multiple of ``every`` steps, with an interval checkpoint at both (the
                second is also the final one), or without checkpoints when ``asynchronous`` is None; their events."""
                calls["steps"] = (calls["steps"] // every + 2) * every
                config = TrainConfig(epochs=1, max_steps=calls["steps"], evaluate_every=None, log_every=10**9,
                                     checkpoint_every=Interval(every, "step"), keep_checkpoints=1,
                                     async_checkpoints=bool(asynchronous))
                trainer.train(config, checkpoint_dir=None if asynchronous is None else checkpoints)
                events = [event for event in read_events(run_dir) if event["event"] == "checkpoint"]
                new, calls["checkpoints"] = events[calls["checkpoints"]:], len(events)
                return [event for event in new if event["reason"] == "interval"]

            train(None, 2)  # the optimizer's state exists from here on
            started = time.perf_counter()
            train(None, 5)
            seconds_per_step = (time.perf_counter() - started) / 10
            publish_s = max(event["blocked_s"] for event in train(False, 1))
            # A background write shares the machine with training: give it three synchronous publishes' time.
            every = 2 if smoke else max(2, math.ceil(3 * publish_s / seconds_per_step))
            megabytes = payload_megabytes(trainer)
            progress(f"checkpoint blocking: {megabytes:.0f} MB payload on {device}, interval checkpoints {every} steps apart")

            tensors = payload_tensors(trainer)
            buffers = [torch.empty(t.shape, dtype=t.dtype, pin_memory=t.is_cuda) for t in tensors]
            firsts: dict[str, list[float]] = {"sync": [], "async": []}

            def checkpoint(asynchronous: bool) -> dict[str, float]:
                first, second = train(asynchronous, every)
                firsts["async" if asynchronous else "sync"].append(first["blocked_s"])
                return {"blocked_s": second["blocked_s"], "write_s": second["duration_s"], "waited_s": second["waited_s"]}

            def bare_copy() -> dict[str, float]:
                began = time.perf_counter()
                for buffer, tensor in zip(buffers, tensors):
                    buffer.copy_(tensor, non_blocking=tensor.is_cuda)
                if device == "cuda":
                    torch.cuda.synchronize()
                return {"blocked_s": time.perf_counter() - began}

            samples = interleave({"sync": lambda: checkpoint(False), "async": lambda: checkpoint(True), "copy": bare_copy},
                                 rounds, progress, "checkpoint blocking")
    case = f"{megabytes:.0f} MB, {device}"
    details = {
        "payload_mb": megabytes, "steps_between_checkpoints": every,
        "async_write_s": median_of(samples, "async", "write_s"), "sync_write_s": median_of(samples, "sync", "write_s"),
        "async_waited_s": max(sample["waited_s"] for sample in samples["async"]),
        "async_first_checkpoint_blocked_s": sorted(firsts["async"]), "sync_first_checkpoint_blocked_s": sorted(firsts["sync"]),
    }
    return [
        Row("checkpoint", case, "loop blocked at an interval checkpoint: async / sync publish", "s",
            median_of(samples, "async", "blocked_s"), median_of(samples, "sync", "blocked_s"), "synchronous publish",
            "ratio", median_ratio(samples, "async", "sync", "blocked_s"), target="<= 0.15" if device == "cpu" else None,
            rounds=rounds, details=details),
        Row("checkpoint", case, "loop blocked at an interval checkpoint: async / bare copy into kept host buffers", "s",
            median_of(samples, "async", "blocked_s"), median_of(samples, "copy", "blocked_s"),
            "device-to-host copy" if device == "cuda" else "bare copy", "ratio",
            median_ratio(samples, "async", "copy", "blocked_s"), target="<= 1.1" if device == "cuda" else None,
            rounds=rounds, details={"payload_mb": megabytes}),
    ]
