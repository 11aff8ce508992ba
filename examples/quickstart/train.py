"""Quickstart: fit a small regression model with exact accumulation, EMA, checkpoints and resume.

Run it twice with the same --run-dir: the second run resumes from ``last`` and continues exactly.

    python examples/quickstart/train.py --run-dir runs/quickstart
    torchrun --standalone --nproc_per_node 2 examples/quickstart/train.py --run-dir runs/quickstart-2

Exit status: 0 when the run finished; 128 + the signal's number when a signal paused it (143 for
SIGTERM, 130 for SIGINT, 140 for SIGUSR2, the requeue signal), as a shell reports a process that
signal ended, so that a wrapper can tell a pause (run it again to continue) from a finish.
"""

from __future__ import annotations

import argparse
import signal
from pathlib import Path

import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import set_seed
from torch import nn
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader, TensorDataset

from elfes.engine import (
    Evaluator,
    MeanMetric,
    Monitor,
    RootMeanSquareMetric,
    RunLogger,
    StepOutput,
    StopRequest,
    TrainConfig,
    Trainer,
    WarmupDecay,
    weight_decay_groups,
)
from elfes.records import epoch_number


def make_data(samples: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(samples, 8, generator=generator)
    true_weights = torch.linspace(-1.0, 1.0, 8).unsqueeze(1)
    targets = inputs @ true_weights + 0.1 * torch.randn(samples, 1, generator=generator)
    return TensorDataset(inputs, targets)


def step(model: nn.Module, batch) -> StepOutput:
    inputs, targets = batch
    error = model(inputs) - targets
    return StepOutput(
        loss=error.square().mean(),
        num_samples=len(inputs),
        metrics={
            "mae": MeanMetric(error.abs().sum(), error.numel()),
            "rmse": RootMeanSquareMetric(error.square().sum(), error.numel()),
        },
    )


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number such as 3, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def exit_status(stop: StopRequest) -> int:
    """0 when training finished; 128 + the signal's number when a signal paused it (143 for SIGTERM)."""
    if stop.reason is None:
        return 0
    # A rank that was not signalled itself adopts the signalled rank's reason, which is the signal's name.
    name = stop.signal or stop.reason
    return 128 + signal.Signals[name].value if name in signal.Signals.__members__ else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, default=Path("runs/quickstart"))
    parser.add_argument("--epochs", type=positive_int, default=20,
                        help="cumulative epochs: a rerun with more continues the run (default: 20)")
    parser.add_argument("--batch-size", type=positive_int, default=16)
    parser.add_argument("--accumulation", type=positive_int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    accelerator = Accelerator(
        gradient_accumulation_steps=args.accumulation,
        dataloader_config=DataLoaderConfiguration(even_batches=False),
    )
    set_seed(args.seed)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Dropout(0.1), nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(weight_decay_groups(model, 0.01), lr=1e-2)
    train_loader = DataLoader(make_data(512, seed=1), batch_size=args.batch_size, shuffle=True)
    validation_loader = DataLoader(make_data(100, seed=2), batch_size=64)

    checkpoints = args.run_dir / "checkpoints"
    resume_from = checkpoints / "last" if (checkpoints / "last").exists() else None
    evaluator = Evaluator(accelerator, {"validation": validation_loader}, step)
    with RunLogger(args.run_dir, is_main_process=accelerator.is_main_process) as logger:
        trainer = Trainer(
            accelerator, model, optimizer, train_loader, step,
            evaluator=evaluator, ema_decay=0.9, logger=logger,
        )
        config = TrainConfig(epochs=args.epochs, log_every=5, monitor=Monitor("validation/loss"), max_grad_norm=1.0)
        trainer.scheduler = LambdaLR(
            optimizer,
            WarmupDecay(
                total_steps=trainer.planned_steps(config),
                warmup_steps=trainer.planned_steps(config) // 10,
                start_factor=0.1,
                minimum_factor=0.01,
            ),
        )
        stop = StopRequest()
        # SIGUSR2 is the requeue signal of SLURM and of `elfes preempt`: it pauses the run like SIGTERM.
        with stop.catch_signals(signals=(signal.SIGINT, signal.SIGTERM, signal.SIGUSR2)):
            state = trainer.train(config, checkpoint_dir=checkpoints, resume_from=resume_from, stop=stop,
                                  metadata={"dataset": "synthetic linear", "seed": args.seed})
        if stop.reason is None:
            trainer.save_model(args.run_dir / "model.pt", weights="ema")
    accelerator.wait_for_everyone()
    accelerator.end_training()  # tears the process group down cleanly on every rank
    if accelerator.is_main_process:
        outcome = f"stopped ({state.stop_reason})" if stop.reason else "finished"
        best = "no evaluation yet" if state.best_metric is None else (
            f"best validation/loss {state.best_metric:.5f} at step {state.best_step}")
        epoch = epoch_number(state.epoch, state.next_batch)
        print(f"{outcome} at epoch {epoch}/{args.epochs}, step {state.step}; {best}")
    return exit_status(stop)


if __name__ == "__main__":
    raise SystemExit(main())
