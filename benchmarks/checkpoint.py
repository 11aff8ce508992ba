"""Checkpoint publish and load: the engine's atomic save of a ~200 MB payload against a bare durable save.

The payload is a model of 16.8M float32 parameters with its AdamW state (both moments): 201 MB. The
engine publishes it the way a synchronous boundary does (``Checkpointer.snapshot(...).write()`` into the
checkpoint folder, then the ``last`` pointer): state dicts, RNG states, a temporary file, fsync, rename,
folder fsync, symlink. The reference is ``torch.save`` of the model's and optimizer's state dicts to a
file in the same folder, then an fsync of that file. Loading compares ``Checkpointer.restore`` (read, layout checks, load into
model, optimizer and RNG) with ``torch.load`` plus the two ``load_state_dict`` calls a hand loop makes.
The files go to a temporary folder (``TMPDIR`` chooses the disk). How long the loop is blocked at an
interval checkpoint, asynchronous against synchronous, is measured by :mod:`benchmarks.checkpoint_blocking`.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from elfes.engine import StepOutput, Trainer
from elfes.engine.checkpoint import CheckpointDirectory, CheckpointName

from .measure import Progress, Row, interleave, median_of, median_ratio, timed


def make_model(width: int, layers: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])


def step(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> StepOutput:
    inputs, targets = batch
    return StepOutput(loss=(model(inputs) - targets).square().mean(), num_samples=len(inputs))


def build(width: int, layers: int) -> Trainer:
    """A trainer whose optimizer has taken one step, so that its AdamW state exists."""
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True)
    model = make_model(width, layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for parameter in model.parameters():
        parameter.grad = torch.full_like(parameter, 1e-3)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    data = TensorDataset(torch.zeros(8, width), torch.zeros(8, width))
    return Trainer(accelerator, model, optimizer, DataLoader(data, batch_size=4), step)


def payload_megabytes(trainer: Trainer) -> float:
    tensors = list(trainer.module.state_dict().values())
    tensors += [value for state in trainer.optimizer.state.values() for value in state.values() if isinstance(value, torch.Tensor)]
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors) / 1e6


def run(rounds: int, progress: Progress, *, smoke: bool = False) -> list[Row]:
    width, layers = (256, 2) if smoke else (2048, 4)
    rounds *= 3  # a save takes a fraction of a second: more rounds steady the medians against disk and allocator noise
    trainer = build(width, layers)
    megabytes = payload_megabytes(trainer)
    with tempfile.TemporaryDirectory(prefix="elfes-checkpoint-bench-") as folder:
        directory = CheckpointDirectory(Path(folder) / "checkpoints")
        directory.path.mkdir()
        bare_path = directory.path / "bare.pt"
        name = CheckpointName(1, 2)
        step_counter = iter(range(1, 10**6))

        def engine_save() -> dict[str, float]:
            _remove(directory.path)
            number = next(step_counter)
            return timed(lambda: publish(trainer, directory, CheckpointName(number, 2 * number)))

        def bare_save() -> dict[str, float]:
            bare_path.unlink(missing_ok=True)
            return timed(lambda: durable_save(trainer, bare_path))

        progress(f"checkpoint: {megabytes:.0f} MB payload (model + AdamW state) in {directory.path.parent}")
        saves = interleave({"bare": bare_save, "elfes": engine_save}, rounds, progress, "checkpoint publish")
        _remove(directory.path)
        publish(trainer, directory, name)
        durable_save(trainer, bare_path)
        loads = interleave(
            {"bare": lambda: timed(lambda: bare_load(trainer, bare_path)),
             "elfes": lambda: timed(lambda: trainer.checkpointer.restore(directory.file(name)))},
            rounds, progress, "checkpoint load",
        )
    case = f"{megabytes:.0f} MB"
    save_details = {"payload_mb": megabytes, "elfes_mb_per_s": megabytes / median_of(saves, "elfes", "wall_s"),
                    "bare_mb_per_s": megabytes / median_of(saves, "bare", "wall_s")}
    return [
        Row("checkpoint", case, "publish: atomic save + pointer / torch.save + fsync", "s",
            median_of(saves, "elfes", "wall_s"), median_of(saves, "bare", "wall_s"), "bare durable save",
            "ratio", median_ratio(saves, "elfes", "bare", "wall_s"), target="<= 1.15", rounds=rounds, details=save_details),
        Row("checkpoint", case, "load: restore / torch.load + load_state_dict", "s",
            median_of(loads, "elfes", "wall_s"), median_of(loads, "bare", "wall_s"), "bare load",
            "ratio", median_ratio(loads, "elfes", "bare", "wall_s"), target="<= 1.1", rounds=rounds,
            details={"payload_mb": megabytes}),
    ]


def publish(trainer: Trainer, directory: CheckpointDirectory, name: CheckpointName) -> None:
    """What a checkpoint boundary does on the main process: save, then point ``last`` at the file."""
    path, _ = trainer.checkpointer.snapshot(directory, name, reuse=False, run_id="benchmark").write()
    directory.point("last", path)


def durable_save(trainer: Trainer, path: Path) -> None:
    torch.save({"model": trainer.module.state_dict(), "optimizer": trainer.optimizer.state_dict()}, path)
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def bare_load(trainer: Trainer, path: Path) -> None:
    payload = torch.load(path, map_location="cpu")
    trainer.module.load_state_dict(payload["model"])
    trainer.optimizer.load_state_dict(payload["optimizer"])


def _remove(folder: Path) -> None:
    for entry in folder.iterdir():
        if entry.name != "bare.pt":
            entry.unlink()

