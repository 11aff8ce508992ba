"""Metrics that reduce exactly over accumulation windows, epochs and ranks.

A step function reports each metric as its sufficient statistics (a sum and a count, a maximum), never
as a local mean, so that combining microbatches of different sizes on different ranks gives the value
the whole data would give. Example::

    error = model(inputs) - targets
    metrics = {
        "mae": MeanMetric(error.abs().sum(), error.numel()),
        "rmse": RootMeanSquareMetric(error.square().sum(), error.numel()),
        "worst": MaxMetric(error.abs().max()),
    }
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from accelerate import Accelerator

Scalar = torch.Tensor | float | int


def _as_statistic(value: Scalar, what: str) -> torch.Tensor:
    tensor = value.detach() if isinstance(value, torch.Tensor) else torch.tensor(value)
    if tensor.numel() != 1:
        raise ValueError(f"{what} must be a scalar; got a tensor of shape {tuple(tensor.shape)}.")
    return tensor.reshape(()).to(torch.float64)


class Metric:
    """Sufficient statistics of one metric; subclasses say how they combine and what they report."""

    kind: str = ""
    statistics: tuple[torch.Tensor, ...]

    @staticmethod
    def value(*statistics: float) -> float | None:
        """The reported value from reduced statistics, or None when nothing was observed."""
        raise NotImplementedError


class MeanMetric(Metric):
    """A mean reported as ``total`` over ``count``; omitted when nothing was counted.

    >>> MeanMetric(error.abs().sum(), error.numel())
    """

    kind = "mean"

    def __init__(self, total: Scalar, count: Scalar) -> None:
        self.statistics = (_as_statistic(total, "MeanMetric total"), _as_statistic(count, "MeanMetric count"))

    @staticmethod
    def value(total: float, count: float) -> float | None:
        return total / count if count > 0 else None


class RootMeanSquareMetric(Metric):
    """The root of ``sum_squared`` over ``count``; omitted when nothing was counted.

    >>> RootMeanSquareMetric(error.square().sum(), error.numel())
    """

    kind = "rms"

    def __init__(self, sum_squared: Scalar, count: Scalar) -> None:
        self.statistics = (
            _as_statistic(sum_squared, "RootMeanSquareMetric sum_squared"),
            _as_statistic(count, "RootMeanSquareMetric count"),
        )

    @staticmethod
    def value(sum_squared: float, count: float) -> float | None:
        return math.sqrt(sum_squared / count) if count > 0 else None


class SumMetric(Metric):
    """A total summed over every batch and rank.

    >>> SumMetric(mask.sum())
    """

    kind = "sum"

    def __init__(self, total: Scalar) -> None:
        self.statistics = (_as_statistic(total, "SumMetric total"),)

    @staticmethod
    def value(total: float) -> float | None:
        return total


class MaxMetric(Metric):
    """The largest value seen on any batch and rank.

    >>> MaxMetric(error.abs().max())
    """

    kind = "max"

    def __init__(self, value: Scalar) -> None:
        self.statistics = (_as_statistic(value, "MaxMetric value"),)

    @staticmethod
    def value(value: float) -> float | None:
        return value if value != -math.inf else None


_KINDS: dict[str, type[Metric]] = {
    cls.kind: cls for cls in (MeanMetric, RootMeanSquareMetric, SumMetric, MaxMetric)
}


class MetricAccumulator:
    """Running statistics of named metrics on one rank, reduced across ranks on demand.

    Statistics stay on the device in float64 until :meth:`compute`, so accumulating costs no
    host synchronisation. ``compute`` is a collective: every rank must call it at the same point.
    """

    def __init__(self) -> None:
        self._kinds: dict[str, str] = {}
        self._statistics: dict[str, torch.Tensor] = {}

    def add(self, name: str, metric: Metric) -> None:
        if not isinstance(metric, Metric):
            raise TypeError(
                f"Metric {name!r} is a {type(metric).__name__}; report metrics as MeanMetric, "
                "RootMeanSquareMetric, SumMetric or MaxMetric."
            )
        self._add_statistics(name, metric.kind, torch.stack(metric.statistics))

    def _add_statistics(self, name: str, kind: str, new: torch.Tensor) -> None:
        known = self._kinds.setdefault(name, kind)
        if known != kind:
            raise ValueError(
                f"Metric {name!r} was reported as a {known} metric and now as a {kind} metric; "
                "report each name with one metric class."
            )
        old = self._statistics.get(name)
        if old is None:
            self._statistics[name] = new
        elif kind == "max":
            self._statistics[name] = torch.maximum(old, new.to(old.device))
        else:
            self._statistics[name] = old + new.to(old.device)

    def update(self, metrics: Mapping[str, Metric]) -> None:
        for name, metric in metrics.items():
            self.add(name, metric)

    def merge(self, other: MetricAccumulator) -> None:
        for name, statistics in other._statistics.items():
            self._add_statistics(name, other._kinds[name], statistics)

    def reset(self) -> None:
        self._kinds.clear()
        self._statistics.clear()

    def __bool__(self) -> bool:
        return bool(self._statistics)

    def state_dict(self) -> dict[str, Any]:
        """This rank's running statistics, on the CPU (a paused log interval resumes from them)."""
        return {
            "kinds": dict(self._kinds),
            "statistics": {name: value.detach().to("cpu", copy=True) for name, value in self._statistics.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any], device: torch.device | None = None) -> None:
        self._kinds = dict(state["kinds"])
        self._statistics = {name: value.to(device) if device else value.clone() for name, value in state["statistics"].items()}

    def compute(self, accelerator: Accelerator | None = None) -> dict[str, float]:
        """Reduce over all ranks and return ``{name: value}``, omitting unobserved means.

        Every rank must call this (it is a collective when several processes run), even a rank
        that saw no batch: its names are learned from the others.
        """
        kinds = dict(self._kinds)
        distributed = accelerator is not None and accelerator.num_processes > 1
        if distributed:
            gathered: list[dict[str, str]] = [{} for _ in range(accelerator.num_processes)]
            dist.all_gather_object(gathered, kinds)
            for rank_kinds in gathered:
                for name, kind in rank_kinds.items():
                    if kinds.setdefault(name, kind) != kind:
                        raise ValueError(
                            f"Metric {name!r} is a {kinds[name]} metric on one rank and a {kind} metric "
                            "on another; report each name with one metric class on every rank."
                        )
        names = sorted(kinds)
        device = accelerator.device if accelerator is not None else torch.device("cpu")
        sums, maxima = [], []
        for name in names:
            width = 2 if kinds[name] in ("mean", "rms") else 1
            local = self._statistics.get(name)
            if local is None:
                local = torch.full((width,), -math.inf if kinds[name] == "max" else 0.0, dtype=torch.float64)
            (maxima if kinds[name] == "max" else sums).append(local.to(device))
        summed = torch.cat(sums) if sums else torch.zeros(0, dtype=torch.float64, device=device)
        maxed = torch.cat(maxima) if maxima else torch.zeros(0, dtype=torch.float64, device=device)
        if distributed:
            dist.all_reduce(summed, op=dist.ReduceOp.SUM)
            dist.all_reduce(maxed, op=dist.ReduceOp.MAX)
        summed_values, maxed_values = summed.tolist(), maxed.tolist()
        results: dict[str, float] = {}
        for name in names:
            kind = kinds[name]
            if kind == "max":
                statistics = [maxed_values.pop(0)]
            else:
                width = 2 if kind in ("mean", "rms") else 1
                statistics, summed_values = summed_values[:width], summed_values[width:]
            value = _KINDS[kind].value(*statistics)
            if value is not None:
                results[name] = value
        return results
