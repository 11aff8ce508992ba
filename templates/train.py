"""A job for ELFES: ``elfes init`` wrote it beside your job spec, whose ``entrypoint: train:main`` names it.

It runs as it is (a small regression model on synthetic data); replace the model, the data and
:func:`step` with yours and keep the shape of :func:`main`. ``elfes submit`` calls ``main(job)`` once
in every task (rank), with the spec's ``workdir`` as the working folder and on ``sys.path``.
"""

from __future__ import annotations

from typing import Any

import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from elfes.engine import (
    Evaluator,
    Interval,
    MeanMetric,
    Monitor,
    RunLogger,
    StepOutput,
    TrainConfig,
    Trainer,
    TrainState,
)

# What the spec's `config:` may set (it arrives as job.config); anything else is refused by name.
DEFAULTS: dict[str, Any] = {
    "epochs": 2,
    "batch_size": 16,
    "lr": 1e-2,
    "seed": 0,
    "log_every": 5,  # a train record (and line) every 5 optimizer steps
    "checkpoint_every_epochs": 1,  # interval checkpoints guard against kills; a stop saves `last` anyway
    "keep_checkpoints": 3,  # the newest 3 interval checkpoints stay, and `last` and `best`; null keeps all
}


def make_data(samples: int, seed: int) -> TensorDataset:
    """Synthetic regression data: 8 features, one noisy linear target. Replace with your dataset."""
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(samples, 8, generator=generator)
    targets = inputs @ torch.linspace(-1.0, 1.0, 8).unsqueeze(1) + 0.1 * torch.randn(samples, 1, generator=generator)
    return TensorDataset(inputs, targets)


def step(model: nn.Module, batch: Any) -> StepOutput:
    """One microbatch: its mean loss and its sample count (the engine weights each accumulation window
    by the real counts, so a short last batch counts for what it holds), plus metrics to report."""
    inputs, targets = batch
    error = model(inputs) - targets
    return StepOutput(
        loss=error.square().mean(),
        num_samples=len(inputs),
        metrics={"mae": MeanMetric(error.abs().sum(), error.numel())},
    )


def main(job: Any) -> TrainState:
    """Train from ``job`` (an ``elfes.launcher.job.runtime.Job``), on every rank; return the ``TrainState``.

    ``job.config`` is the spec's ``config:`` (a plain dict); ``job.run_dir`` the run directory and
    ``job.checkpoint_dir`` its ``checkpoints/``; ``job.resume_from`` is ``last`` once a preempted or
    requeued run comes back (else None); ``job.stop`` a ``StopRequest`` already catching SIGTERM, SIGINT
    and the requeue signal; ``job.attempt`` counts this run's starts from 1; ``job.rank``,
    ``job.local_rank`` and ``job.world_size`` say which task this is; ``job.name``, ``job.job_id`` and
    ``job.executor`` name the job. The torch distributed variables are set, so a plain ``Accelerator()``
    joins every task (gloo on CPUs).
    """
    unknown = sorted(set(job.config) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"config has unknown keys {unknown}; train.py reads {sorted(DEFAULTS)}: "
                         "fix the spec's config, or read the new keys in train.py")
    config = {**DEFAULTS, **job.config}
    # Exact resumes need every rank's shard unpadded.
    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(even_batches=False))
    set_seed(config["seed"])
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=config["lr"])
    train_loader = DataLoader(make_data(512, seed=1), batch_size=config["batch_size"], shuffle=True)
    evaluator = Evaluator(accelerator, {"validation": DataLoader(make_data(128, seed=2), batch_size=64)}, step)
    every = config["checkpoint_every_epochs"]
    train_config = TrainConfig(
        epochs=config["epochs"],
        log_every=config["log_every"],
        monitor=Monitor("validation/loss"),
        checkpoint_every=None if every is None else Interval(every, "epoch"),
        keep_checkpoints=config["keep_checkpoints"],
    )
    with RunLogger(job.run_dir, is_main_process=accelerator.is_main_process) as logger:
        trainer = Trainer(accelerator, model, optimizer, train_loader, step, evaluator=evaluator, logger=logger)
        # A stop (preemption, time limit, `elfes preempt`) ends the current accumulation window, saves
        # `last` and returns; the launcher then requeues the job and main(job) resumes from job.resume_from.
        state = trainer.train(train_config, checkpoint_dir=job.checkpoint_dir, resume_from=job.resume_from,
                              stop=job.stop)
    accelerator.end_training()  # tears the process group down on every rank
    return state
