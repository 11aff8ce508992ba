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

from .collectives import every_rank_value, reduce_over_ranks

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
        """The reported value from the reduced ``statistics`` (in the order of :attr:`statistics`), or None when
        nothing was observed."""
        raise NotImplementedError


class MeanMetric(Metric):
    """A mean reported as ``total`` over ``count``; omitted when nothing was counted.

    >>> MeanMetric(error.abs().sum(), error.numel())  # doctest: +SKIP
    """

    kind = "mean"

    def __init__(self, total: Scalar, count: Scalar) -> None:
        self.statistics = (_as_statistic(total, "MeanMetric total"), _as_statistic(count, "MeanMetric count"))

    @staticmethod
    def value(*statistics: float) -> float | None:
        total, count = statistics
        return total / count if count > 0 else None


class RootMeanSquareMetric(Metric):
    """The root of ``sum_squared`` over ``count``; omitted when nothing was counted.

    >>> RootMeanSquareMetric(error.square().sum(), error.numel())  # doctest: +SKIP
    """

    kind = "rms"

    def __init__(self, sum_squared: Scalar, count: Scalar) -> None:
        self.statistics = (
            _as_statistic(sum_squared, "RootMeanSquareMetric sum_squared"),
            _as_statistic(count, "RootMeanSquareMetric count"),
        )

    @staticmethod
    def value(*statistics: float) -> float | None:
        sum_squared, count = statistics
        return math.sqrt(sum_squared / count) if count > 0 else None


class SumMetric(Metric):
    """A total summed over every batch and rank.

    >>> SumMetric(mask.sum())  # doctest: +SKIP
    """

    kind = "sum"

    def __init__(self, total: Scalar) -> None:
        self.statistics = (_as_statistic(total, "SumMetric total"),)

    @staticmethod
    def value(*statistics: float) -> float | None:
        (total,) = statistics
        return total


class MaxMetric(Metric):
    """The largest value seen on any batch and rank.

    >>> MaxMetric(error.abs().max())  # doctest: +SKIP
    """

    kind = "max"

    def __init__(self, value: Scalar) -> None:
        self.statistics = (_as_statistic(value, "MaxMetric value"),)

    @staticmethod
    def value(*statistics: float) -> float | None:
        (value,) = statistics
        return value if value != -math.inf else None


_KINDS: dict[str, type[Metric]] = {
    cls.kind: cls for cls in (MeanMetric, RootMeanSquareMetric, SumMetric, MaxMetric)
}


class MetricAccumulator:
    """Running statistics of named metrics on one rank, reduced across ranks on demand.

    Statistics stay on the device in float64 until :meth:`compute`, so accumulating costs no
    host synchronisation. Statistics already on the host (the training loss of a window, whose
    values the loop fetched to check them) are kept as Python floats and folded in, in order, when
    they are read: accumulating them costs no tensor operation. ``compute`` is a collective: every
    rank must call it at the same point.
    """

    def __init__(self) -> None:
        self._kinds: dict[str, str] = {}
        self._statistics: dict[str, torch.Tensor] = {}
        self._pending: dict[str, list[tuple[float, float]]] = {}  # (total, count) of means, not yet folded in

    def add(self, name: str, metric: Metric) -> None:
        if not isinstance(metric, Metric):
            raise TypeError(
                f"Metric {name!r} is a {type(metric).__name__}; report metrics as MeanMetric, "
                "RootMeanSquareMetric, SumMetric or MaxMetric."
            )
        self._add_statistics(name, metric.kind, torch.stack(metric.statistics))

    def add_mean_values(self, name: str, total: float, count: float) -> None:
        """Add a mean's statistics given as Python floats; the same arithmetic as adding
        ``MeanMetric(total, count)`` (float64 additions in the same order), done when read."""
        self._check_kind(name, "mean")
        self._pending.setdefault(name, []).append((total, count))

    def _check_kind(self, name: str, kind: str) -> None:
        known = self._kinds.setdefault(name, kind)
        if known != kind:
            raise ValueError(
                f"Metric {name!r} was reported as a {known} metric and now as a {kind} metric; "
                "report each name with one metric class."
            )

    def _add_statistics(self, name: str, kind: str, new: torch.Tensor) -> None:
        self._check_kind(name, kind)
        if name in self._pending:
            self._settle(name)
        old = self._statistics.get(name)
        if old is None:
            self._statistics[name] = new
        elif kind == "max":
            self._statistics[name] = torch.maximum(old, new.to(old.device))
        else:
            self._statistics[name] = old + new.to(old.device)

    def _settle(self, name: str) -> None:
        """Fold the pending host statistics of ``name`` into its tensor, oldest first."""
        pairs = self._pending.pop(name)
        old = self._statistics.get(name)
        total, count = old.tolist() if old is not None else pairs[0]
        for pair_total, pair_count in pairs if old is not None else pairs[1:]:
            total += pair_total
            count += pair_count
        device = old.device if old is not None else None
        self._statistics[name] = torch.tensor([total, count], dtype=torch.float64, device=device)

    def _settle_all(self) -> None:
        for name in list(self._pending):
            self._settle(name)

    def update(self, metrics: Mapping[str, Metric]) -> None:
        for name, metric in metrics.items():
            self.add(name, metric)

    def merge(self, other: MetricAccumulator) -> None:
        """Add ``other``'s statistics, which came after this accumulator's."""
        for name, statistics in other._statistics.items():
            self._add_statistics(name, other._kinds[name], statistics)
        for name, pairs in other._pending.items():
            self._check_kind(name, other._kinds[name])
            self._pending.setdefault(name, []).extend(pairs)

    def reset(self) -> None:
        self._kinds.clear()
        self._statistics.clear()
        self._pending.clear()

    def __bool__(self) -> bool:
        return bool(self._statistics) or bool(self._pending)

    def state_dict(self) -> dict[str, Any]:
        """This rank's running statistics, on the CPU (a paused log interval resumes from them)."""
        self._settle_all()
        return {
            "kinds": dict(self._kinds),
            "statistics": {name: value.detach().to("cpu", copy=True) for name, value in self._statistics.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any], device: torch.device | None = None) -> None:
        self._pending.clear()
        self._kinds = dict(state["kinds"])
        self._statistics = {name: value.to(device) if device else value.clone() for name, value in state["statistics"].items()}

    def compute(self, accelerator: Accelerator | None = None) -> dict[str, float]:
        """Reduce over all ranks and return ``{name: value}``, omitting unobserved means.

        Every rank must call this (it is a collective when several processes run), even a rank
        that saw no batch: its names are learned from the others.
        """
        self._settle_all()
        kinds = dict(self._kinds)
        distributed = accelerator is not None and accelerator.num_processes > 1
        if distributed:
            for rank_kinds in every_rank_value(kinds, accelerator):
                for name, kind in rank_kinds.items():
                    if kinds.setdefault(name, kind) != kind:
                        raise ValueError(
                            f"Metric {name!r} is a {kinds[name]} metric on one rank and a {kind} metric "
                            "on another; report each name with one metric class on every rank."
                        )
        names = sorted(kinds)
        device = accelerator.device if accelerator is not None else torch.device("cpu")
        sums: list[torch.Tensor] = []
        maxima: list[torch.Tensor] = []
        for name in names:
            width = 2 if kinds[name] in ("mean", "rms") else 1
            local = self._statistics.get(name)
            if local is None:
                local = torch.full((width,), -math.inf if kinds[name] == "max" else 0.0, dtype=torch.float64)
            (maxima if kinds[name] == "max" else sums).append(local.to(device))
        summed = torch.cat(sums) if sums else torch.zeros(0, dtype=torch.float64, device=device)
        maxed = torch.cat(maxima) if maxima else torch.zeros(0, dtype=torch.float64, device=device)
        if distributed:
            summed = reduce_over_ranks(summed, accelerator, dist.ReduceOp.SUM)
            maxed = reduce_over_ranks(maxed, accelerator, dist.ReduceOp.MAX)
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
