"""Learning-rate multiplier schedules for ``torch.optim.lr_scheduler.LambdaLR``, and where a scheduler
built over a number of its steps ends (:func:`schedule_horizons`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

from torch.optim.lr_scheduler import ChainedScheduler, CosineAnnealingLR, OneCycleLR, PolynomialLR, SequentialLR

Decay = Literal["cosine", "linear", "constant"]
DECAY_KINDS: tuple[str, ...] = get_args(Decay)


@dataclass
class WarmupDecay:
    """Linear warmup followed by cosine, linear or no decay of the learning rate.

    An instance is the ``lr_lambda`` of a ``LambdaLR``: called with the number of
    optimizer updates completed so far, it returns the factor applied to the base
    learning rate, so the first update uses ``factor(0)``.

    * Warmup: the factor rises linearly from ``start_factor`` at step 0 to exactly
      1.0 at ``warmup_steps``. With ``warmup_steps == 0`` the schedule starts at 1.0.
    * Decay: with ``p = (step - warmup_steps) / (total_steps - warmup_steps)``,
      ``"cosine"`` gives ``minimum + (1 - minimum) * (1 + cos(pi * p)) / 2`` and
      ``"linear"`` gives ``1 - (1 - minimum) * p``. Both reach exactly
      ``minimum_factor`` at ``total_steps`` and stay there afterwards.
      ``"constant"`` keeps 1.0 after warmup.

    The instance ``__dict__`` holds only the five fields, as plain ints, floats and
    a str, because ``LambdaLR.state_dict()`` saves it and ``load_state_dict()``
    restores it with ``__dict__.update``; this keeps scheduler checkpoints loadable
    with ``torch.load(weights_only=True)``.

    Example:
        >>> import torch
        >>> schedule = WarmupDecay(total_steps=10, warmup_steps=2, minimum_factor=0.1)
        >>> [schedule(step) for step in (0, 1, 2)]
        [0.0, 0.5, 1.0]
        >>> schedule(10), schedule(50)
        (0.1, 0.1)
        >>> optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.5)
        >>> scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        >>> optimizer.param_groups[0]["lr"]
        0.0
    """

    total_steps: int
    warmup_steps: int = 0
    start_factor: float = 0.0
    minimum_factor: float = 0.0
    decay: Decay = "cosine"

    def __post_init__(self) -> None:
        _require_int("total_steps", self.total_steps)
        _require_int("warmup_steps", self.warmup_steps)
        # Stored as float so a checkpoint holds the same types whatever was passed.
        self.start_factor = _require_fraction("start_factor", self.start_factor)
        self.minimum_factor = _require_fraction("minimum_factor", self.minimum_factor)

        if self.decay not in DECAY_KINDS:
            raise ValueError(
                f"decay must be one of {DECAY_KINDS}, got {self.decay!r}; "
                "pick one of those names."
            )
        if self.total_steps < 1:
            raise ValueError(
                f"total_steps must be at least 1, got {self.total_steps}; "
                "pass the number of optimizer updates in the whole run."
            )
        if self.warmup_steps < 0:
            raise ValueError(
                f"warmup_steps must be non-negative, got {self.warmup_steps}; "
                "pass 0 to start at the full learning rate."
            )
        if self.decay == "constant":
            if self.warmup_steps > self.total_steps:
                raise ValueError(
                    f"warmup_steps ({self.warmup_steps}) must not exceed total_steps "
                    f"({self.total_steps}); shorten the warmup or raise total_steps."
                )
        elif self.warmup_steps >= self.total_steps:
            raise ValueError(
                f"warmup_steps ({self.warmup_steps}) must be less than total_steps "
                f"({self.total_steps}) for {self.decay!r} decay, which needs at least "
                "one decay step; shorten the warmup or raise total_steps."
            )

    def __call__(self, step: int) -> float:
        """Return the learning-rate factor after ``step`` completed optimizer updates."""
        if step < 0:
            raise ValueError(
                f"step must be non-negative, got {step}; it counts completed "
                "optimizer updates, starting at 0."
            )
        if step < self.warmup_steps:
            return self.start_factor + (1.0 - self.start_factor) * step / self.warmup_steps
        if self.decay == "constant":
            return 1.0
        if step >= self.total_steps:
            return self.minimum_factor

        progress = (step - self.warmup_steps) / (self.total_steps - self.warmup_steps)
        if self.decay == "cosine":
            drop = (1.0 - math.cos(math.pi * progress)) / 2.0
        else:
            drop = progress
        # Written as "1 - drop" so that the end of warmup gives exactly 1.0; the
        # max() keeps rounding from dipping below the floor just before the end.
        return max(self.minimum_factor, 1.0 - (1.0 - self.minimum_factor) * drop)


def _require_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"{name} must be an int, got {value!r} of type {type(value).__name__}; "
            "pass a whole number of optimizer steps."
        )


def _require_fraction(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"{name} must be a float, got {value!r} of type {type(value).__name__}; "
            "pass a number between 0 and 1."
        )
    if not 0.0 <= value <= 1.0:
        raise ValueError(
            f"{name} must be between 0 and 1, got {value!r}; it multiplies the base "
            "learning rate, so pass a fraction such as 0.1."
        )
    return float(value)


@dataclass(frozen=True)
class Horizon:
    """The step at which a schedule built over a number of its steps ends, and the field that says so."""

    kind: str  # "CosineAnnealingLR"
    field: str  # "T_max"
    steps: int


def schedule_horizons(scheduler: object) -> list[Horizon]:
    """The horizons of ``scheduler``, counted in its own steps. Past its horizon a ``WarmupDecay`` and a
    ``PolynomialLR`` hold their last factor, a ``CosineAnnealingLR`` climbs back up, and a ``OneCycleLR``
    climbs once then refuses to step. Only the last part of a ``SequentialLR`` runs to the end."""
    if isinstance(scheduler, SequentialLR):
        start = scheduler._milestones[-1] if scheduler._milestones else 0
        return [Horizon(h.kind, h.field, start + h.steps) for h in schedule_horizons(scheduler._schedulers[-1])]
    if isinstance(scheduler, ChainedScheduler):
        return [horizon for part in scheduler._schedulers for horizon in schedule_horizons(part)]
    if isinstance(scheduler, CosineAnnealingLR):
        return [Horizon("CosineAnnealingLR", "T_max", scheduler.T_max)]
    if isinstance(scheduler, OneCycleLR):
        return [Horizon("OneCycleLR", "total_steps", scheduler.total_steps)]
    if isinstance(scheduler, PolynomialLR):
        return [Horizon("PolynomialLR", "total_iters", scheduler.total_iters)]
    lambdas = getattr(scheduler, "lr_lambdas", [])  # LambdaLR's, one per parameter group
    steps = sorted({function.total_steps for function in lambdas if isinstance(function, WarmupDecay)})
    return [Horizon("WarmupDecay", "total_steps", total) for total in steps]
