"""Entrypoints of the end-to-end launcher tests: the quickstart job, slowed so that signals land mid-run,
and one that fails. Imported inside the jobs (the tests' specs put this folder on the job's path)."""

from __future__ import annotations

import time
from typing import Any

from examples.quickstart import job as quickstart


def slow_quickstart(job: Any) -> Any:
    """The quickstart job with ``step_delay_s`` (popped from the config) of sleep in every step."""
    config = dict(job.config)
    delay = float(config.pop("step_delay_s", 0.0))
    job.config = config

    def slow_step(model, batch):
        time.sleep(delay)
        return quickstart.step(model, batch)

    return quickstart.run(job, slow_step)


# examples/charlm, tiny (85 optimizer steps an epoch on two ranks), for sharded_charlm.
TINY_CHARLM = {"train_chars": 20_000, "context": 32, "width": 32, "depth": 2, "heads": 2, "epochs": 1, "batch_size": 4,
               "accumulation": 2, "warmup_steps": 5, "evaluate_every": 20, "checkpoint_every": 20, "log_every": 1}


def sharded_charlm(job: Any) -> Any:
    """examples/charlm with its model sharded over the ranks (FSDP2) and ``step_delay_s`` of sleep in every step,
    or only in the attempts up to ``slow_attempts`` (both popped from the config)."""
    from examples.charlm import job as charlm

    config = dict(job.config)
    delay = float(config.pop("step_delay_s", 0.0))
    if job.attempt > int(config.pop("slow_attempts", job.attempt)):
        delay = 0.0
    job.config = {**config, "shard": True}

    def slow_step(model, batch):
        time.sleep(delay)
        return charlm.step(model, batch)

    return charlm.run(job, slow_step)


def failing(job: Any) -> Any:
    """Fails on every rank, before any training, with a recognisable message."""
    raise RuntimeError(f"the data folder /nonexistent/{job.rank} is missing")


def budget_free_quickstart(job: Any) -> Any:
    """The quickstart model, data and step with a constant learning rate: nothing it computes depends on
    ``epochs``, so raising them on a finished run must continue it to the bits of a run that had the
    larger budget from the start (the quickstart's own schedule spans the budget, so it would not).

    With ``window`` in the config (microbatches per update over all ranks) its accumulation is derived from the
    world size, as a job that may continue on another one does, and ``dropout`` sets the model's dropout."""
    import torch
    from accelerate import Accelerator, DataLoaderConfiguration
    from accelerate.utils import set_seed
    from torch import nn
    from torch.utils.data import DataLoader

    from elfes.engine import Evaluator, RunLogger, TrainConfig, Trainer
    from examples.quickstart.train import make_data, step

    config = {**quickstart.DEFAULTS, "dropout": 0.1, **job.config}
    if "window" in config:
        config["accumulation"] = config.pop("window") // job.world_size
    delay = float(config.pop("step_delay_s", 0.0))

    def slow_step(model, batch):
        time.sleep(delay)
        return step(model, batch)

    accelerator = Accelerator(gradient_accumulation_steps=config["accumulation"],
                              dataloader_config=DataLoaderConfiguration(even_batches=False))
    set_seed(config["seed"])
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Dropout(config["dropout"]), nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=config["lr"])
    train_loader = DataLoader(make_data(config["train_samples"], seed=1), batch_size=config["batch_size"], shuffle=True)
    evaluator = Evaluator(accelerator, {"validation": DataLoader(make_data(64, seed=2), batch_size=64)}, step)
    with RunLogger(job.run_dir, is_main_process=accelerator.is_main_process) as logger:
        trainer = Trainer(accelerator, model, optimizer, train_loader, slow_step, evaluator=evaluator, ema_decay=0.9,
                          logger=logger)
        state = trainer.train(TrainConfig(epochs=config["epochs"], log_every=config["log_every"]),
                              checkpoint_dir=job.checkpoint_dir, resume_from=job.resume_from, stop=job.stop)
        if state.stop_reason is None:
            trainer.save_model(job.run_dir / "model.pt", weights="ema")
    accelerator.end_training()
    return state
