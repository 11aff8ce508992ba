"""One protocol for the two loss paths: the scalar mean path and an :class:`Objective`.

The training window and the evaluator ask a :class:`LossPath` the same questions (how to count a
batch, what a microbatch contributes to the backward pass, how to record and finish its loss
metrics) and never branch on which path they hold.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, Protocol, cast

import torch

from .metrics import MeanMetric, MetricAccumulator
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
# What a microbatch's backward pass differentiates, and the gradient to start it from (None: 1).
Contribution = tuple[torch.Tensor, torch.Tensor | None]


class WindowLoss(Protocol):
    """The loss of one accumulation window on one rank."""

    labelled: bool  # False when no term of the window has a sample: no gradient is taken

    @property
    def batches(self) -> Iterable[Any]:
        """The window's microbatches (read as the window runs, or buffered when its counts come first)."""

    @property
    def local_weight(self) -> float | torch.Tensor:
        """This rank's share of the window denominator (scalar path): a float, or a float64 tensor
        when the step gave tensor weights."""

    def contribution(self, output: StepOutput, index: int, metrics: MetricAccumulator) -> Contribution:
        """Return what the microbatch's backward pass differentiates and the gradient it starts from
        (``loss.backward(gradient)`` computes exactly what ``(loss * gradient).backward()`` would)."""

    def finish(self, metrics: MetricAccumulator) -> None:
        """Record the loss metrics of the microbatches that :meth:`contribution` has not recorded."""

    def check(self, epoch: int, first_batch: int) -> None:
        """Refuse invalid loss weights of the window (raises ValueError naming the batch)."""

    def nonfinite(self) -> bool | torch.Tensor:
        """True (or a boolean tensor flag) when a recorded loss of this rank is NaN or infinite."""

    def gradient_factor(self, weight_total: float, world: int) -> float | None:
        """The factor turning the summed gradients into the window mean, or None to skip the update."""

    def losses(self) -> list[torch.Tensor]:
        """Each microbatch's loss on this rank (0 where it counts for nothing), to name a nonfinite one."""


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
        # The backward factor weight / reference in the loss dtype, by (weight, reference, dtype, device):
        # consecutive windows of equal batches reuse one tensor instead of building it per microbatch.
        self.factors: dict[tuple[float, float, torch.dtype, torch.device], torch.Tensor] = {}

    def describe(self) -> None:
        return None

    def batch_counts(self, batch: Any) -> None:
        return None

    def record(self, metrics: MetricAccumulator, output: StepOutput, counts: torch.Tensor | None) -> None:
        check_metric_names(output.metrics, None)
        loss, weight = scalar_loss_and_weight(output)
        record_scalar_loss(metrics, loss, weight)

    def finish(self, values: dict[str, float]) -> dict[str, float]:
        return finish_loss_metrics(values, None)

    def open_window(self, batches: Iterable[Any], sum_over_ranks: SumOverRanks, reference: float) -> MeanWindow:
        if len(self.factors) > 64:
            self.factors.clear()
        return MeanWindow(batches, reference, self.factors)


class MeanWindow:
    """Streams microbatches: each backward differentiates ``loss * weight / reference``; the exact
    global denominator rescales the summed gradients once the window is complete.

    A weight given as a number stays a Python float: its checks, sums and the decision to skip a batch
    of weight 0 cost no tensor operation; a positive finite weight's backward starts from the factor
    ``weight / reference`` instead of multiplying the loss by it (the same arithmetic, two graph nodes
    fewer), and the window's losses reach the host in one transfer at its end (:meth:`finish`). A
    weight given as a tensor stays on the device, with the tensor operations that needs.
    """

    labelled = True

    def __init__(self, batches: Iterable[Any], reference: float, factors: dict[Any, torch.Tensor]) -> None:
        self.batches = batches
        self.reference = reference
        self._factors = factors
        self._losses: list[torch.Tensor] = []  # detached, one per microbatch
        self._weights: list[float | torch.Tensor] = []  # one per microbatch; tensors are float64
        self._positive = True  # every weight so far a positive finite number: no check or skip to do
        self._values: list[float] | None = None  # the losses of positive weight, on the host (number weights)

    def contribution(self, output: StepOutput, index: int, metrics: MetricAccumulator) -> Contribution:
        if output.metrics:
            check_metric_names(output.metrics, None)
        loss, weight = _loss_and_weight(output)
        self._losses.append(loss.detach())
        self._weights.append(weight)
        if weight.__class__ is float and 0.0 < weight < math.inf:
            return loss, self._factor(weight, loss)
        self._positive = False
        # A batch that declares weight 0 (no tokens, no labels) contributes nothing, even when its
        # mean over nothing is NaN; every rank still runs backward so DDP stays in step.
        weight = _as_tensor(weight, loss.device)
        scaled = loss * (weight / self.reference).to(loss.dtype)
        return torch.where(weight > 0, scaled, torch.zeros_like(loss)), None

    def _factor(self, weight: float, loss: torch.Tensor) -> torch.Tensor:
        key = (weight, self.reference, loss.dtype, loss.device)
        factor = self._factors.get(key)
        if factor is None:  # the operations of the tensor path, so that both round alike
            factor = (_as_tensor(weight, loss.device) / self.reference).to(loss.dtype)
            self._factors[key] = factor
        return factor

    @property
    def local_weight(self) -> float | torch.Tensor:
        total: float | torch.Tensor = 0.0
        for weight in self._weights:
            total = total + weight
        return total

    def finish(self, metrics: MetricAccumulator) -> None:
        """Record the window's ``loss`` statistics (sum of loss x weight, sum of weights).

        With number weights the losses of the window are fetched to the host once (the nonfinite
        check needs them there anyway) and the sums are Python float64 arithmetic, in microbatch order:
        the very additions and products the tensor path performs, without a tensor operation each.
        """
        if not self._losses:
            return
        if self._positive:  # the common case: every loss counts, every weight a float
            weights = cast("list[float]", self._weights)
            self._values = values = _host_values(self._losses)
            total, count = values[0] * weights[0], weights[0]
            for value, weight in zip(values[1:], weights[1:]):
                total += value * weight
                count += weight
            metrics.add_mean_values("loss", total, count)
            return
        if not all(isinstance(weight, float) for weight in self._weights):
            metrics.add("loss", MeanMetric(*self._tensor_statistics()))
            return
        weights = cast("list[float]", self._weights)  # every one a float, as checked just above
        counted = [loss for loss, weight in zip(self._losses, weights) if weight > 0]
        self._values = _host_values(counted)
        remaining = iter(self._values)
        # A batch of weight 0 adds 0, as a tensor where would; the sums in microbatch order, as above.
        products = [next(remaining) * weight if weight > 0 else 0.0 for weight in weights]
        total, count = products[0], weights[0]
        for product, weight in zip(products[1:], weights[1:]):
            total += product
            count += weight
        metrics.add_mean_values("loss", total, count)

    def _tensor_statistics(self) -> tuple[torch.Tensor, torch.Tensor]:
        total: torch.Tensor | None = None
        count: torch.Tensor | None = None
        for loss, weight in zip(self._losses, self._weights):
            weight = _as_tensor(weight, loss.device)
            product = loss.double() * weight
            product = torch.where(weight > 0, product, torch.zeros_like(product))
            total = product if total is None else total + product
            count = weight if count is None else count + weight
        assert total is not None and count is not None  # finish() asks only for a window with losses
        return total, count

    def check(self, epoch: int, first_batch: int) -> None:
        if self._positive:
            return
        tensors = [weight for weight in self._weights if isinstance(weight, torch.Tensor)]
        if tensors and bool(torch.stack([~torch.isfinite(w) | (w < 0) for w in tensors]).any()):
            bad: int | None = next(i for i, w in enumerate(self._weights) if not _valid_weight(w))
        else:
            bad = next((i for i, w in enumerate(self._weights) if isinstance(w, float) and not _valid_weight(w)), None)
        if bad is None:
            return
        raise ValueError(
            f"StepOutput.loss_weight at epoch {epoch}, batch {first_batch + bad} is negative or nonfinite; a "
            "loss denominator must be a finite count >= 0 (tokens, atoms, labelled components)."
        )

    def nonfinite(self) -> bool | torch.Tensor:
        if self._values is not None:
            return not all(math.isfinite(value) for value in self._values)
        return _any_nonfinite(self.losses())

    def losses(self) -> list[torch.Tensor]:
        """Each microbatch's loss, or 0 where its weight is not positive."""
        return [
            torch.where(_as_tensor(weight, loss.device) > 0, loss, torch.zeros_like(loss)) for loss, weight in zip(self._losses, self._weights)
        ]

    def gradient_factor(self, weight_total: float, world: int) -> float | None:
        # DDP averaged the gradients of local sums over ranks: undo the average and divide by the
        # window's global denominator (the backward already divided by the reference).
        return None if weight_total == 0 else world * self.reference / weight_total


def _loss_and_weight(output: StepOutput) -> tuple[torch.Tensor, float | torch.Tensor]:
    """The mean loss (0-dimensional) and its weight: a float, or a float64 tensor when given as one."""
    loss = output.loss
    weight = output.num_samples if output.loss_weight is None else output.loss_weight
    if isinstance(weight, torch.Tensor) or not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        return scalar_loss_and_weight(output)  # refuses a bad loss; keeps a tensor weight on the device
    return (loss if loss.dim() == 0 else loss.reshape(())), float(weight)


def _host_values(losses: list[torch.Tensor]) -> list[float]:
    """The values of 0-dimensional tensors as Python floats (exact): in one transfer from an accelerator,
    each read directly on the CPU (where stacking them would cost more than reading them)."""
    if len(losses) > 1 and losses[0].device.type != "cpu":
        return torch.stack(losses).tolist()
    return [float(loss.item()) for loss in losses]


def _as_tensor(weight: float | torch.Tensor, device: torch.device) -> torch.Tensor:
    return weight if isinstance(weight, torch.Tensor) else torch.tensor(weight, dtype=torch.float64, device=device)


def _valid_weight(weight: float | torch.Tensor) -> bool:
    if isinstance(weight, torch.Tensor):
        return bool(torch.isfinite(weight)) and bool(weight >= 0)
    return math.isfinite(weight) and weight >= 0


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

    def record(self, metrics: MetricAccumulator, output: StepOutput, counts: torch.Tensor | None) -> None:
        if counts is None:
            raise ValueError("ObjectiveLoss.record needs the batch's counts, as its batch_counts(batch) returned them.")
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
        self.device = global_counts.device
        self.local_weight = 0.0  # the terms carry their own denominators
        self._losses: list[torch.Tensor] = []

    def contribution(self, output: StepOutput, index: int, metrics: MetricAccumulator) -> Contribution:
        check_metric_names(output.metrics, self.objective)
        terms = self.objective.term_losses(output)
        record_objective_losses(metrics, self.objective, terms, self._counts[index])
        # Terms absent from the whole window have coefficient 0 and never enter the graph.
        observed = [(c, t) for c, t, p in zip(self._coefficients, terms, self._present) if p]
        zero = torch.zeros((), device=self.device)
        self._losses.append(torch.stack([t.detach().double() for _, t in observed] or [zero.double()]).sum())
        return sum((c * t for c, t in observed), start=zero), None

    def finish(self, metrics: MetricAccumulator) -> None:
        return None  # each microbatch recorded its terms

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
    """Whether any of the 0-dimensional ``losses`` is NaN or infinite (one check for the window)."""
    if not losses:
        return torch.zeros((), dtype=torch.bool)
    return ~torch.isfinite(torch.stack(losses)).all()
