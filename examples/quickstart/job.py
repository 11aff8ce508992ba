"""The quickstart model as an ELFES job: `elfes submit examples/quickstart/job.yaml --follow`.

The launcher calls :func:`main` once per task with a ``job`` (see ``elfes.launcher.job.runtime.Job``): the
spec's ``config`` as a plain dict, the run and checkpoint folders, ``resume_from`` (the run's ``last``
after a preemption, else None) and a ``StopRequest`` already catching SIGTERM, SIGINT and the requeue
signal. The torch distributed variables are exported, so a plain ``Accelerator()`` joins every task
of the job into one process group (gloo on CPUs). The data and the step come from ``train.py``.
"""

from __future__ import annotations

from typing import Any

import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import set_seed
from torch import nn
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader

from elfes.engine import (
    Evaluator,
    Monitor,
    RunLogger,
    Step,
    TrainConfig,
    Trainer,
    TrainState,
    WarmupDecay,
    weight_decay_groups,
)
from examples.quickstart.train import make_data, step

# What `config:` in job.yaml may set; anything else is refused by name.
DEFAULTS: dict[str, Any] = {
    "epochs": 20, "batch_size": 16, "accumulation": 2, "lr": 1e-2, "seed": 0,
    "train_samples": 512, "validation_samples": 100, "log_every": 5,
    "keep_checkpoints": None,  # None keeps every checkpoint; N keeps the newest N (and `last`, `best`)
}


def main(job: Any) -> TrainState:
    """Train the quickstart model from ``job``; every task calls it. Returns the trainer's state."""
    return run(job, step)


def run(job: Any, step_function: Step) -> TrainState:
    """:func:`main` with another step function (tests slow it down to land signals mid-run)."""
    unknown = sorted(set(job.config) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"config has unknown keys {unknown}; the quickstart job reads {sorted(DEFAULTS)}.")
    config = {**DEFAULTS, **job.config}
    accelerator = Accelerator(
        gradient_accumulation_steps=config["accumulation"],
        dataloader_config=DataLoaderConfiguration(even_batches=False),
    )
    set_seed(config["seed"])
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Dropout(0.1), nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(weight_decay_groups(model, 0.01), lr=config["lr"])
    train_loader = DataLoader(make_data(config["train_samples"], seed=1), batch_size=config["batch_size"], shuffle=True)
    validation_loader = DataLoader(make_data(config["validation_samples"], seed=2), batch_size=64)
    evaluator = Evaluator(accelerator, {"validation": validation_loader}, step_function)
    with RunLogger(job.run_dir, is_main_process=accelerator.is_main_process) as logger:
        trainer = Trainer(accelerator, model, optimizer, train_loader, step_function,
                          evaluator=evaluator, ema_decay=0.9, logger=logger)
        train_config = TrainConfig(epochs=config["epochs"], log_every=config["log_every"],
                                   monitor=Monitor("validation/loss"), max_grad_norm=1.0,
                                   keep_checkpoints=config["keep_checkpoints"])
        planned = trainer.planned_steps(train_config)
        trainer.scheduler = LambdaLR(optimizer, WarmupDecay(total_steps=planned, warmup_steps=planned // 10,
                                                            start_factor=0.1, minimum_factor=0.01))
        state = trainer.train(train_config, checkpoint_dir=job.checkpoint_dir, resume_from=job.resume_from,
                              stop=job.stop, metadata={"dataset": "synthetic linear", "seed": config["seed"]})
        if state.stop_reason is None or state.stop_reason == "early_stopping":
            trainer.save_model(job.run_dir / "model.pt", weights="ema")
    accelerator.end_training()  # tears the process group down on every rank
    return state
