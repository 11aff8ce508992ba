"""One protocol for the two loss paths: the scalar mean path and an :class:`Objective`.

The training window and the evaluator ask a :class:`LossPath` the same questions (how to count a
batch, what a microbatch contributes to the backward pass, how to record and finish its loss
metrics) and never branch on which path they hold.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

import torch

from .metrics import MetricAccumulator
from .objective import (
    Objective,
    StepOutput,
    check_metric_names,
    finish_loss_metrics,
    record_objective_losses,
    record_scalar_loss,
    scalar_loss_and_weight,
)

SumOverRanks = Callable[[torch.Tensor], torch.Tensor]


class WindowLoss(Protocol):
    """The loss of one accumulation window on one rank."""

    batches: list[Any] | Iterable[Any]
    labelled: bool  # False when no term of the window has a sample: no gradient is taken
    local_weight: torch.Tensor  # this rank's share of the window denominator (scalar path), float64

    def contribution(self, output: StepOutput, index: int, metrics: MetricAccumulator) -> torch.Tensor:
        """Record the microbatch's loss metrics and return what its backward pass differentiates."""

    def check(self, epoch: int, first_batch: int) -> None:
        """Refuse invalid loss weights of the window (raises ValueError naming the batch)."""

    def nonfinite(self) -> torch.Tensor:
        """A float64 flag: 1 when a recorded loss of this rank is NaN or infinite."""

    def gradient_factor(self, weight_total: float, world: int) -> float | None:
        """The factor turning the summed gradients into the window mean, or None to skip the update."""


class LossPath(Protocol):
    """How a step's loss is normalised, recorded and reported."""

    def describe(self) -> dict[str, float] | None: ...

    def batch_counts(self, batch: Any) -> torch.Tensor | None: ...

    def record(self, metrics: MetricAccumulator, output: StepOutput, counts: torch.Tensor | None) -> None: ...

    def finish(self, values: dict[str, float]) -> dict[str, float]: ...

    def open_window(self, batches: Iterable[Any], sum_over_ranks: SumOverRanks, reference: float) -> WindowLoss: ...


def loss_path(objective: Objective | None, device: torch.device) -> LossPath:
    """The scalar mean path without an objective, the objective's path with one."""
    return MeanLoss(device) if objective is None else ObjectiveLoss(objective, device)


class MeanLoss:
    """``StepOutput.loss`` is a local mean whose denominator is ``loss_weight`` (default ``num_samples``)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def describe(self) -> None:
        return None

    def batch_counts(self, batch: Any) -> None:
        return None

    def record(self, metrics: MetricAccumulator, output: StepOutput, counts: None) -> None:
        check_metric_names(output.metrics, None)
        loss, weight = scalar_loss_and_weight(output)
        record_scalar_loss(metrics, loss, weight)

    def finish(self, values: dict[str, float]) -> dict[str, float]:
        return finish_loss_metrics(values, None)

    def open_window(self, batches: Iterable[Any], sum_over_ranks: SumOverRanks, reference: float) -> MeanWindow:
        return MeanWindow(batches, reference, self.device)


class MeanWindow:
    """Streams microbatches: each backward differentiates ``loss * weight / reference``; the exact
    global denominator rescales the summed gradients once the window is complete."""

    labelled = True

    def __init__(self, batches: Iterable[Any], reference: float, device: torch.device) -> None:
        self.batches = batches
        self.reference = reference
        self.local_weight = torch.zeros((), dtype=torch.float64, device=device)
        self._invalid: list[torch.Tensor] = []
        self._losses: list[torch.Tensor] = []

    def contribution(self, output: StepOutput, index: int, metrics: MetricAccumulator) -> torch.Tensor:
        check_metric_names(output.metrics, None)
        loss, weight = scalar_loss_and_weight(output)
        self._invalid.append(~torch.isfinite(weight) | (weight < 0))
        record_scalar_loss(metrics, loss, weight)
        self.local_weight = self.local_weight + weight
        # A batch that declares weight 0 (no tokens, no labels) contributes nothing, even when its
        # mean over nothing is NaN; every rank still runs backward so DDP stays in step.
        scaled = loss * (weight / self.reference).to(loss.dtype)
        self._losses.append(torch.where(weight > 0, loss.detach(), torch.zeros_like(loss)))
        return torch.where(weight > 0, scaled, torch.zeros_like(loss))

    def check(self, epoch: int, first_batch: int) -> None:
        if not self._invalid or not bool(torch.stack(self._invalid).any()):
            return
        index = next(index for index, bad in enumerate(self._invalid) if bool(bad))
        raise ValueError(
            f"StepOutput.loss_weight at epoch {epoch}, batch {first_batch + index} is negative or nonfinite; a "
            "loss denominator must be a finite count >= 0 (tokens, atoms, labelled components)."
        )

    def nonfinite(self) -> torch.Tensor:
        return _any_nonfinite(self._losses)

    def losses(self) -> list[torch.Tensor]:
        return self._losses

    def gradient_factor(self, weight_total: float, world: int) -> float | None:
        # DDP averaged the gradients of local sums over ranks: undo the average and divide by the
        # window's global denominator (the backward already divided by the reference).
        return None if weight_total == 0 else world * self.reference / weight_total


class ObjectiveLoss:
    """``StepOutput.loss`` maps each term to its sum; a term is divided by its own count summed over
    the global window, then the terms are weighted and added."""

    def __init__(self, objective: Objective, device: torch.device) -> None:
        self.objective = objective
        self.device = device

    def describe(self) -> dict[str, float]:
        return self.objective.describe()

    def batch_counts(self, batch: Any) -> torch.Tensor:
        return self.objective.batch_counts(batch, self.device)

    def record(self, metrics: MetricAccumulator, output: StepOutput, counts: torch.Tensor) -> None:
        check_metric_names(output.metrics, self.objective)
        record_objective_losses(metrics, self.objective, self.objective.term_losses(output), counts)

    def finish(self, values: dict[str, float]) -> dict[str, float]:
        return finish_loss_metrics(values, self.objective)

    def open_window(self, batches: Iterable[Any], sum_over_ranks: SumOverRanks, reference: float) -> ObjectiveWindow:
        window = list(batches)  # the counts of the whole global window are needed before any backward
        counts = [self.batch_counts(batch) for batch in window]
        global_counts = sum_over_ranks(torch.stack(counts).sum(0)) if counts else sum_over_ranks(
            torch.zeros(len(self.objective.weights), dtype=torch.float64, device=self.device)
        )
        return ObjectiveWindow(self.objective, window, counts, global_counts)


class ObjectiveWindow:
    """A buffered window whose term coefficients are known before the first backward."""

    def __init__(self, objective: Objective, batches: list[Any], counts: list[torch.Tensor], global_counts: torch.Tensor) -> None:
        self.objective = objective
        self.batches = batches
        self._counts = counts
        weights = torch.tensor(list(objective.weights.values()), dtype=torch.float64, device=global_counts.device)
        present = global_counts > 0
        self._coefficients = torch.where(present, weights / global_counts.clamp_min(1e-300), 0.0).tolist()
        self._present = present.tolist()
        self.labelled = any(self._present)
        self.local_weight = torch.zeros((), dtype=torch.float64, device=global_counts.device)
        self._losses: list[torch.Tensor] = []

    def contribution(self, output: StepOutput, index: int, metrics: MetricAccumulator) -> torch.Tensor:
        check_metric_names(output.metrics, self.objective)
        terms = self.objective.term_losses(output)
        record_objective_losses(metrics, self.objective, terms, self._counts[index])
        # Terms absent from the whole window have coefficient 0 and never enter the graph.
        observed = [(c, t) for c, t, p in zip(self._coefficients, terms, self._present) if p]
        zero = torch.zeros((), device=self.local_weight.device)
        self._losses.append(torch.stack([t.detach().double() for _, t in observed] or [zero.double()]).sum())
        return sum((c * t for c, t in observed), start=zero)

    def check(self, epoch: int, first_batch: int) -> None:
        return None

    def nonfinite(self) -> torch.Tensor:
        return _any_nonfinite(self._losses)

    def losses(self) -> list[torch.Tensor]:
        return self._losses

    def gradient_factor(self, weight_total: float, world: int) -> float | None:
        # The terms are already normalised by their global counts; only DDP's average is undone.
        return float(world) if self.labelled else None


def _any_nonfinite(losses: list[torch.Tensor]) -> torch.Tensor:
    if not losses:
        return torch.zeros((), dtype=torch.float64)
    return torch.stack([(~torch.isfinite(loss)).any() for loss in losses]).any().double()
