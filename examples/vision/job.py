"""A small CNN on augmented images, read by four DataLoader workers: `elfes submit examples/vision/job.yaml`.

Every image is augmented as it is read (a random resized crop, a random flip, noise: see ``data.py``),
in four persistent workers. A preempted run continues with the very crops and flips an uninterrupted
run draws: the trainer fetches each batch in a worker under generators seeded from the run's data
seed, the epoch and the batch's place, and reads no batch ahead of the step that needs it.
"""

from __future__ import annotations

from typing import Any

import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from elfes.engine import Evaluator, MeanMetric, Monitor, RunLogger, Step, StepOutput, TrainConfig, Trainer, TrainState
from examples.vision.data import CHANNELS, CLASSES, AugmentedBars, augmentation, bars

# What `config:` in job.yaml may set; anything else is refused by name.
DEFAULTS: dict[str, Any] = {
    "epochs": 6, "train_images": 1024, "validation_images": 256, "side": 16, "batch_size": 32, "accumulation": 1,
    "lr": 3e-3, "seed": 0, "workers": 4, "log_every": 4,
}


class SmallCNN(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(CHANNELS, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )
        self.head = nn.Sequential(nn.Dropout(0.2), nn.Linear(2 * width, CLASSES))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(images))


def step(model: nn.Module, batch: Any) -> StepOutput:
    images, labels = batch
    logits = model(images)
    correct = (logits.argmax(dim=1) == labels).sum()
    return StepOutput(loss=nn.functional.cross_entropy(logits, labels), num_samples=len(labels),
                      metrics={"accuracy": MeanMetric(correct, len(labels))})


def main(job: Any) -> TrainState:
    """Train the CNN from ``job``; every task calls it. Returns the trainer's state."""
    return run(job, step)


def run(job: Any, step_function: Step) -> TrainState:
    """:func:`main` with another step function (a test holds it to land a preemption mid-run)."""
    unknown = sorted(set(job.config) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"config has unknown keys {unknown}; the vision job reads {sorted(DEFAULTS)}.")
    config = {**DEFAULTS, **job.config}
    accelerator = Accelerator(gradient_accumulation_steps=config["accumulation"],
                              dataloader_config=DataLoaderConfiguration(even_batches=False))
    set_seed(config["seed"])
    model = SmallCNN()
    optimizer = torch.optim.AdamW(model.parameters(), lr=config["lr"], weight_decay=0.01)
    transform, transforms_from = augmentation(config["side"])
    images, labels = bars(config["train_images"], config["side"] + 4, seed=1)
    train_loader = DataLoader(AugmentedBars(images, labels, transform), batch_size=config["batch_size"], shuffle=True,
                              num_workers=config["workers"], persistent_workers=config["workers"] > 0)
    held_out, held_out_labels = bars(config["validation_images"], config["side"] + 4, seed=2)
    validation = TensorDataset(held_out[:, :, 2:-2, 2:-2].contiguous(), held_out_labels)  # the centre crop
    evaluator = Evaluator(accelerator, {"validation": DataLoader(validation, batch_size=128)}, step_function)
    with RunLogger(job.run_dir, is_main_process=accelerator.is_main_process) as logger:
        trainer = Trainer(accelerator, model, optimizer, train_loader, step_function, evaluator=evaluator, ema_decay=0.99,
                          logger=logger)
        state = trainer.train(
            TrainConfig(epochs=config["epochs"], log_every=config["log_every"], monitor=Monitor("validation/loss")),
            checkpoint_dir=job.checkpoint_dir, resume_from=job.resume_from, stop=job.stop,
            metadata={"dataset": "synthetic bars", "transforms": transforms_from, "workers": config["workers"]},
        )
        if state.stop_reason is None or state.stop_reason == "early_stopping":
            trainer.save_model(job.run_dir / "model.pt", weights="ema")
    accelerator.end_training()
    return state
