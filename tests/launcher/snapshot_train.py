"""A whole job module that the code snapshot tests copy into a project folder of their own as ``train.py``
(a git work tree), then edit: ``SCALE`` changes what the job computes. Self-contained (the engine only), so
that nothing of it comes from the repository; each attempt prints the ``SCALE`` it runs with.

Config: ``epochs``, ``step_delay_s`` (sleep per step, so that a signal lands mid-run).
"""

from __future__ import annotations

import time
from typing import Any

SCALE = 1.0  # the tests edit this line


def main(job: Any) -> Any:
    import torch
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from elfes.engine import RunLogger, StepOutput, TrainConfig, Trainer

    print(f"snapshot job: SCALE = {SCALE}", flush=True)
    delay = float(job.config.get("step_delay_s", 0.0))
    accelerator = Accelerator()
    set_seed(0)
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(128, 4, generator=generator)
    data = TensorDataset(inputs, inputs.sum(dim=1, keepdim=True) * SCALE)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def step(model: nn.Module, batch: Any) -> StepOutput:
        time.sleep(delay)
        features, targets = batch
        return StepOutput(loss=(model(features) - targets).square().mean(), num_samples=len(features))

    with RunLogger(job.run_dir, is_main_process=accelerator.is_main_process) as logger:
        trainer = Trainer(accelerator, model, optimizer, DataLoader(data, batch_size=16, shuffle=True), step,
                          ema_decay=0.9, logger=logger)
        state = trainer.train(TrainConfig(epochs=int(job.config.get("epochs", 2)), log_every=1),
                              checkpoint_dir=job.checkpoint_dir, resume_from=job.resume_from, stop=job.stop)
        if state.stop_reason is None:
            trainer.save_model(job.run_dir / "model.pt", weights="ema")
    accelerator.end_training()
    return state
