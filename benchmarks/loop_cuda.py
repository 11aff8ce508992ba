"""Loop overhead on one CUDA GPU under bf16 autocast: ``Trainer`` against a hand-written loop doing the same math.

As in benchmarks/loop.py, both variants train one epoch of the same in-memory data, in the same order,
from the same initial weights, with accumulation 2, exact sample weighting and gradient clipping; here
the model lives on the GPU, each microbatch is copied to it, the forward runs under bf16 autocast and
both use fused AdamW. The clock stops after ``torch.cuda.synchronize()``. Without CUDA it measures
nothing and says so.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from elfes.engine import TrainConfig, Trainer

from .loop import ACCUMULATION, LEARNING_RATE, MAX_GRAD_NORM, LoopCase, make_data, make_model, step
from .measure import Progress, Row, interleave, median_difference, median_of, median_ratio, timed


def cases(smoke: bool) -> list[LoopCase]:
    if smoke:
        return [LoopCase("mlp-cuda", 256, 2, 64, 4096)]
    return [LoopCase("mlp-cuda", 1024, 4, 256, 131072, repeats=2, target_speed=0.95)]


def hand_epoch(case: LoopCase, model: nn.Module, train: TensorDataset) -> dict[str, float]:
    loader = DataLoader(train, batch_size=case.batch_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, fused=True)
    parameters = list(model.parameters())

    def run() -> None:
        model.train()
        batches = iter(loader)
        while window := list(itertools.islice(batches, ACCUMULATION)):
            optimizer.zero_grad(set_to_none=True)
            total = sum(len(inputs) for inputs, _ in window)
            for inputs, targets in window:
                inputs, targets = inputs.cuda(), targets.cuda()
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    outputs = model(inputs)
                loss = (outputs - targets).square().mean()
                (loss * (len(inputs) / total)).backward()
            torch.nn.utils.clip_grad_norm_(parameters, MAX_GRAD_NORM)
            optimizer.step()
        torch.cuda.synchronize()

    return timed(run)


def elfes_epoch(case: LoopCase, model: nn.Module, train: TensorDataset) -> dict[str, float]:
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    accelerator = Accelerator(mixed_precision="bf16", gradient_accumulation_steps=ACCUMULATION)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, fused=True)
    trainer = Trainer(accelerator, model, optimizer, DataLoader(train, batch_size=case.batch_size), step)
    config = TrainConfig(epochs=1, max_grad_norm=MAX_GRAD_NORM, evaluate_every=None, checkpoint_every=None)

    def run() -> None:
        trainer.train(config)
        torch.cuda.synchronize()

    return timed(run)


def run(rounds: int, progress: Progress, *, smoke: bool = False) -> list[Row]:
    if not torch.cuda.is_available():
        progress("loop-cuda: no CUDA device here; nothing measured")
        return []
    rows: list[Row] = []
    for case in cases(smoke):
        train = make_data(case.samples, seed=1)
        finals: dict[str, nn.Module] = {}

        variants = {name: _variant(epoch, name, case, train, finals)
                    for name, epoch in (("hand", hand_epoch), ("elfes", elfes_epoch))}
        samples = interleave(variants, rounds, progress, f"loop-cuda {case.name}", repeats=case.repeats)
        difference = max((a - b).abs().max().item() for a, b in zip(finals["elfes"].parameters(),
                                                                    finals["hand"].parameters()))
        per_microbatch = 1e6 / case.microbatches
        throughput = {name: case.samples * case.repeats / median_of(samples, name, "wall_s") for name in samples}
        details = {"model": case.describe(), "device": torch.cuda.get_device_name(), "precision": "bf16",
                   "optimizer": "fused AdamW", "microbatches_per_round": case.microbatches,
                   "max_parameter_difference_vs_hand": difference}
        rows += [
            Row("loop-cuda", case.name, "ELFES: wall µs per microbatch over the hand loop (bf16, CUDA)", "µs",
                median_of(samples, "elfes", "wall_s") * per_microbatch,
                median_of(samples, "hand", "wall_s") * per_microbatch, "hand loop", "difference",
                median_difference(samples, "elfes", "hand", "wall_s", per_microbatch), rounds=rounds, details=details),
            Row("loop-cuda", case.name, "ELFES: samples/s, ELFES / hand loop (bf16, CUDA)", "samples/s",
                throughput["elfes"], throughput["hand"], "hand loop", "ratio",
                median_ratio(samples, "hand", "elfes", "wall_s"),
                target=f">= {case.target_speed:g}" if case.target_speed is not None else None, rounds=rounds),
        ]
    return rows


def _variant(epoch: Callable[..., dict[str, float]], name: str, case: LoopCase, train: TensorDataset,
             finals: dict[str, nn.Module]) -> Callable[[], dict[str, float]]:
    """One variant of a case: a fresh model on the GPU each call, kept in ``finals`` to compare final weights."""

    def call() -> dict[str, float]:
        finals[name] = make_model(case).cuda()
        return epoch(case, finals[name], train)

    return call
