"""What exactness costs: ELFES's Trainer against a hand-written accumulation loop, same process.

Each round trains one epoch with each, interleaved, on the same model, data and batches; the table
reports the median over rounds of the per-round time ratio (ELFES / plain), so machine noise that
hits both alike cancels out. Each round prints a progress line on stderr as it ends; the table goes to
stdout at the end.

    python benchmarks/engine_overhead.py --rounds 7
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from accelerate import Accelerator
from rich.console import Console
from rich.table import Table
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from elfes.engine import StepOutput, TrainConfig, Trainer


def make_model(width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, width), nn.GELU(), nn.Linear(width, width), nn.GELU(), nn.Linear(width, 1))


def step(model: nn.Module, batch) -> StepOutput:
    inputs, targets = batch
    return StepOutput(loss=(model(inputs) - targets).square().mean(), num_samples=len(inputs))


def plain_epoch(model: nn.Module, loader: DataLoader, accumulation: int) -> None:
    """The usual loop: mean of batch means per window, no exactness bookkeeping."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    for index, (inputs, targets) in enumerate(loader):
        loss = (model(inputs) - targets).square().mean() / accumulation
        loss.backward()
        if (index + 1) % accumulation == 0 or index + 1 == len(loader):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)


def elfes_epoch(model: nn.Module, loader: DataLoader, accumulation: int) -> float:
    """Seconds of one epoch of ``Trainer.train`` (construction excluded, as the plain loop has none)."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=accumulation)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    trainer = Trainer(accelerator, model, optimizer, loader, step)
    config = TrainConfig(epochs=1, max_grad_norm=1.0, evaluate_every=None, checkpoint_every=None, log_every=10**9)
    started = time.perf_counter()
    trainer.train(config)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--accumulation", type=int, default=4)
    args = parser.parse_args(argv)

    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(args.samples, 64, generator=generator), torch.randn(args.samples, 1, generator=generator))
    sizes = ((64, 32), (256, 64), (1024, 128))
    progress = Console(stderr=True, highlight=False, soft_wrap=True)  # one line per round, also in log files
    progress.print(
        f"{len(sizes)} model sizes x {args.rounds} rounds, each round one epoch of {args.samples} samples with "
        "each loop; a line per round:"
    )
    table = Table(title=f"ELFES Trainer / plain loop, one epoch of {args.samples} samples, median of {args.rounds} rounds")
    for column in ("width", "batch size", "plain s (median)", "ELFES s (median)", "ratio (median of rounds)"):
        table.add_column(column, justify="right")
    for width, batch_size in sizes:
        loader = DataLoader(data, batch_size=batch_size, shuffle=True)
        plain_times, elfes_times, ratios = [], [], []
        for round_number in range(1, args.rounds + 1):
            started = time.perf_counter()
            plain_epoch(make_model(width), loader, args.accumulation)
            plain_times.append(time.perf_counter() - started)
            elfes_times.append(elfes_epoch(make_model(width), loader, args.accumulation))
            ratios.append(elfes_times[-1] / plain_times[-1])
            progress.print(
                f"width {width}, batch size {batch_size}, round {round_number}/{args.rounds}: plain "
                f"{plain_times[-1]:.3f} s, ELFES {elfes_times[-1]:.3f} s, ratio {ratios[-1]:.2f}"
            )
        table.add_row(
            str(width), str(batch_size), f"{statistics.median(plain_times):.3f}", f"{statistics.median(elfes_times):.3f}",
            f"{statistics.median(ratios):.2f}",
        )
    Console().print(table)


if __name__ == "__main__":
    main()
