"""What the trainer writes to the run records: positions for people, the run's setup and budget, and the
statistics of a log interval."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch.optim import Optimizer

from elfes.records import epoch_number as records_epoch_number

from .config import TrainConfig, TrainState
from .metrics import MetricAccumulator


def epoch_number(state: TrainState) -> int:
    """The 1-based epoch a position belongs to (see :func:`elfes.records.epoch_number`): every event's
    ``epoch`` field. The boundary at an epoch's end belongs to the epoch that just ended."""
    return records_epoch_number(state.epoch, state.next_batch)


def learning_rate_names(param_groups: list[dict[str, Any]]) -> list[str]:
    """``lr/<group name>`` for named parameter groups (``weight_decay_groups`` names them), else ``lr/<index>``."""
    return [f"lr/{group.get('name', index)}" for index, group in enumerate(param_groups)]


class LogInterval:
    """Statistics accumulated between two ``train`` events, on one rank.

    They are checkpointed (per rank) so that a paused run logs the same ``train`` events as an
    uninterrupted one.
    """

    def __init__(self, learning_rates: list[float], device: torch.device) -> None:
        self.device = device
        self.metrics = MetricAccumulator()
        self.grad_norms: list[float] = []
        self.samples = 0
        self.seconds = 0.0
        self.learning_rates = learning_rates  # of the latest update

    def add(self, metrics: MetricAccumulator, samples: int, seconds: float, grad_norm: float | None, learning_rates: list[float]) -> None:
        self.metrics.merge(metrics)
        self.samples += samples
        self.seconds += seconds
        if grad_norm is not None:
            self.grad_norms.append(grad_norm)
        if learning_rates:
            self.learning_rates = learning_rates

    def summary(self, param_groups: list[dict[str, Any]]) -> dict[str, float]:
        """Learning rates by group name, mean gradient norm and throughput of the interval."""
        values = dict(zip(learning_rate_names(param_groups), self.learning_rates))
        values["grad_norm"] = sum(self.grad_norms) / len(self.grad_norms)
        values["samples_per_second"] = self.samples / self.seconds if self.seconds > 0 else 0.0
        return values

    def reset(self) -> None:
        self.metrics.reset()
        self.grad_norms.clear()
        self.samples, self.seconds = 0, 0.0

    def state_dict(self) -> dict[str, Any]:
        return {
            "metrics": self.metrics.state_dict(),
            "grad_norms": list(self.grad_norms),
            "samples": self.samples,
            "seconds": self.seconds,
            "learning_rates": list(self.learning_rates),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.metrics.load_state_dict(state["metrics"], self.device)
        self.grad_norms = list(state["grad_norms"])
        self.samples = state["samples"]
        self.seconds = state["seconds"]
        self.learning_rates = list(state["learning_rates"])


@dataclass
class PhaseClock:
    """Wall time of one ``train`` call, split into training, evaluation and checkpoint phases."""

    started: float = field(default_factory=time.perf_counter)
    train_s: float = 0.0
    evaluation_s: float = 0.0
    checkpoint_s: float = 0.0

    def totals(self) -> dict[str, float]:
        return {
            "train_s": self.train_s,
            "evaluation_s": self.evaluation_s,
            "checkpoint_s": self.checkpoint_s,
            "wall_s": time.perf_counter() - self.started,
        }


@dataclass(frozen=True)
class Budget:
    """How far one ``train`` call may go: its config's limits, and what they mean for this trainer's data."""

    epochs: int
    max_steps: int | None
    planned_steps: int  # the cumulative updates allowed (see Trainer.planned_steps)
    updates_per_epoch: int | None  # None: a stream without __len__
    batches_per_epoch: int | None  # per rank

    def spent(self, state: TrainState) -> bool:
        """Whether ``state`` has trained all that this budget allows."""
        return state.epoch >= self.epochs or (self.max_steps is not None and state.step >= self.max_steps)


@dataclass(frozen=True)
class RunSetup:
    """What ``started`` and ``resumed`` events record of the trainer's setup (fixed for one ``train`` call)."""

    world_size: int
    precision: str
    device: str
    gradient_accumulation_steps: int
    ema_decay: float | None
    objective: dict[str, float] | None  # the objective's coefficients (None: the scalar mean loss)
    per_rank_data: str | None = None  # what of the training loader keeps a position per rank (no resize takes it)


def describe_run(
    setup: RunSetup, config: TrainConfig, budget: Budget, optimizer: Optimizer, metadata: Mapping[str, Any], *, run_id: str | None
) -> dict[str, Any]:
    """The fields of a ``started`` or ``resumed`` event: the run's setup, budget and optimizer groups
    (as they are now: a resumed run's are the checkpoint's)."""
    return dict(
        world_size=setup.world_size,
        precision=setup.precision,
        device=setup.device,
        gradient_accumulation_steps=setup.gradient_accumulation_steps,
        config=config.describe(),
        budget=asdict(budget),
        optimizer={
            "class": type(optimizer).__name__,
            "groups": [
                {
                    "name": group.get("name", str(index)),
                    "lr": float(group["lr"]),
                    "weight_decay": float(group.get("weight_decay", 0.0)),
                    "num_parameters": sum(p.numel() for p in group["params"]),
                }
                for index, group in enumerate(optimizer.param_groups)
            ],
        },
        ema_decay=setup.ema_decay,
        objective=setup.objective,
        per_rank_data=setup.per_rank_data,
        metadata=dict(metadata),
        run_id=run_id,
    )
