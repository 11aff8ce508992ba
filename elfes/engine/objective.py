"""What a step returns, and how its losses are normalised over an accumulation window.

Two paths, chosen by the trainer's ``objective`` argument:

* the scalar mean path: ``StepOutput.loss`` is a local mean whose denominator is ``loss_weight``
  (default ``num_samples``); an update optimises the window's weighted mean over all ranks;
* the :class:`Objective` path: ``loss`` maps term names to differentiable *sums*; each term is divided
  by its own count summed over the whole window on all ranks, then the terms are weighted and added.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from .metrics import MeanMetric, Metric, MetricAccumulator, Scalar, SumMetric

RESERVED_METRIC_PREFIXES = ("loss/", "loss_count/", "loss_sum/")


@dataclass
class StepOutput:
    """The result of one step on one microbatch.

    Scalar mean path: ``loss`` is the batch's mean loss, ``loss_weight`` its denominator when that is
    not ``num_samples`` (tokens, atoms, labelled components). Objective path: ``loss`` maps each term
    of the :class:`Objective` to its differentiable sum over the batch.

    >>> StepOutput(loss=error.square().mean(), num_samples=len(inputs),  # doctest: +SKIP
    ...            metrics={"mae": MeanMetric(error.abs().sum(), error.numel())})
    """

    loss: torch.Tensor | Mapping[str, torch.Tensor]
    num_samples: int
    metrics: dict[str, Metric] = field(default_factory=dict)
    loss_weight: Scalar | None = None


Step = Callable[[torch.nn.Module, Any], StepOutput]


class Objective:
    """Independently normalised loss terms with fixed coefficients.

    ``counts(batch)`` returns each term's denominator for a batch: deterministic, nonnegative,
    finite data counts computed without running the model. The engine sums them over the global
    accumulation window before any backward pass, so a rare auxiliary label is averaged over the
    samples that actually carry it.

    >>> objective = Objective(
    ...     weights={"primary": 1.0, "auxiliary": 0.2},
    ...     counts=lambda batch: {"primary": batch["target"].numel(), "auxiliary": batch["mask"].sum()},
    ... )
    """

    def __init__(self, weights: Mapping[str, float], counts: Callable[[Any], Mapping[str, Scalar]]) -> None:
        if not weights:
            raise ValueError("Objective(weights=...) is empty; name at least one loss term and its coefficient.")
        for name, weight in weights.items():
            if not isinstance(name, str) or not name or "/" in name:
                raise ValueError(
                    f"Objective term name {name!r} is invalid; use a non-empty string without '/' "
                    "(it becomes the metric names loss/<name> and loss_count/<name>)."
                )
            if not isinstance(weight, (int, float)) or isinstance(weight, bool):
                raise TypeError(f"Objective weight of {name!r} is {weight!r}; give a finite number.")
            if not math.isfinite(weight):
                raise ValueError(f"Objective weight of {name!r} is {weight!r}; give a finite number.")
        if not callable(counts):
            raise TypeError(f"Objective(counts=...) must be callable batch -> mapping; got {type(counts).__name__}.")
        self.weights: dict[str, float] = {name: float(weight) for name, weight in weights.items()}
        self.counts = counts

    @property
    def names(self) -> list[str]:
        return list(self.weights)

    def batch_counts(self, batch: Any, device: torch.device) -> torch.Tensor:
        """The batch's term counts as a float64 vector in the order of :attr:`names`."""
        counts = self.counts(batch)
        if not isinstance(counts, Mapping) or set(counts) != set(self.weights):
            got = sorted(counts) if isinstance(counts, Mapping) else type(counts).__name__
            raise ValueError(
                f"Objective counts(batch) returned {got}; it must return a mapping with exactly the "
                f"terms {sorted(self.weights)}."
            )
        values = []
        for name in self.weights:
            count = counts[name]
            if isinstance(count, torch.Tensor):
                if count.requires_grad:
                    raise ValueError(
                        f"Objective count {name!r} requires grad; counts must be data counts, "
                        "not functions of trainable parameters (detach or compute them from the batch)."
                    )
                count = count.detach().reshape(()).to(device=device, dtype=torch.float64)
            else:
                count = torch.tensor(float(count), dtype=torch.float64, device=device)
            values.append(count)
        vector = torch.stack(values)
        if not bool(torch.isfinite(vector).all()) or bool((vector < 0).any()):
            raise ValueError(
                f"Objective counts(batch) returned {dict(zip(self.weights, vector.tolist()))}; "
                "counts must be finite and nonnegative."
            )
        return vector

    def term_losses(self, output: StepOutput) -> list[torch.Tensor]:
        """The step's loss sums in the order of :attr:`names`, checked against the objective."""
        loss = output.loss
        if not isinstance(loss, Mapping):
            raise TypeError(
                "The step returned a single loss tensor but the trainer has an Objective; return "
                f"StepOutput(loss={{name: sum}}) with the terms {sorted(self.weights)}."
            )
        if set(loss) != set(self.weights):
            raise ValueError(
                f"The step returned loss terms {sorted(loss)}; the Objective declares {sorted(self.weights)}. "
                "Return exactly one differentiable sum per declared term."
            )
        terms = []
        for name in self.weights:
            term = loss[name]
            if not isinstance(term, torch.Tensor) or term.numel() != 1:
                raise ValueError(f"Loss term {name!r} must be a scalar tensor (a sum over the batch).")
            terms.append(term.reshape(()))
        return terms

    def describe(self) -> dict[str, float]:
        return dict(self.weights)


def check_metric_names(metrics: Mapping[str, Metric], objective: Objective | None) -> None:
    """Refuse user metrics that would collide with the loss metrics the engine reports."""
    for name in metrics:
        reserved = name == "loss" or name.startswith(RESERVED_METRIC_PREFIXES)
        if objective is not None and name in objective.weights:
            reserved = True
        if reserved:
            raise ValueError(
                f"Step metric {name!r} uses a reserved name: 'loss', the loss term names and the prefixes "
                f"{', '.join(RESERVED_METRIC_PREFIXES)} belong to the engine's loss metrics. Rename the metric."
            )


def scalar_loss_and_weight(output: StepOutput) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean loss of a scalar-path step and its denominator as a float64 tensor."""
    loss = output.loss
    if isinstance(loss, Mapping):
        raise TypeError(
            f"The step returned loss terms {sorted(loss)} but the trainer has no Objective; pass "
            "objective=Objective(...) to the Trainer and Evaluator, or return one scalar mean loss."
        )
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise ValueError(f"StepOutput.loss must be a scalar mean loss tensor; got {shape}.")
    weight = output.num_samples if output.loss_weight is None else output.loss_weight
    if isinstance(weight, torch.Tensor):
        weight = weight.detach().reshape(()).to(device=loss.device, dtype=torch.float64)
    else:
        weight = torch.tensor(float(weight), dtype=torch.float64, device=loss.device)
    return loss.reshape(()), weight


def record_scalar_loss(accumulator: MetricAccumulator, loss: torch.Tensor, weight: torch.Tensor) -> None:
    total = loss.detach().double() * weight
    accumulator.add("loss", MeanMetric(torch.where(weight > 0, total, torch.zeros_like(total)), weight))


def record_objective_losses(
    accumulator: MetricAccumulator, objective: Objective, terms: list[torch.Tensor], counts: torch.Tensor
) -> None:
    for name, term, count in zip(objective.names, terms, counts.unbind()):
        accumulator.add(f"loss_sum/{name}", MeanMetric(term.detach().double(), count))
        accumulator.add(f"loss_count/{name}", SumMetric(count))


def finish_loss_metrics(values: dict[str, float], objective: Objective | None) -> dict[str, float]:
    """Turn reduced loss statistics into the reported ``loss``, ``loss/<name>``, ``loss_count/<name>``.

    With an objective, ``loss`` is the weighted sum of the observed term means; a term nobody
    observed is omitted rather than reported as a perfect zero.
    """
    if objective is None:
        return values
    finished = {key: value for key, value in values.items() if not key.startswith("loss_sum/")}
    total, observed = 0.0, False
    for name, weight in objective.weights.items():
        mean = values.get(f"loss_sum/{name}")
        if mean is not None:
            finished[f"loss/{name}"] = mean
            total += weight * mean
            observed = True
    if observed:
        finished["loss"] = total
    return dict(sorted(finished.items()))
