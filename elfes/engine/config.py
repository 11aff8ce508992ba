"""Training configuration (what to do) and training state (where a run is)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

from elfes.refusals import ConfigurationError, ConfigurationTypeError


def _require(well_typed: bool, valid: bool, message: str) -> None:
    """Raise ``TypeError`` for a value of the wrong type, ``ValueError`` for a bad value of the right one."""
    if not well_typed:
        raise ConfigurationTypeError(message)
    if not valid:
        raise ConfigurationError(message)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Interval:
    """A repeating trigger: every ``every`` successful optimizer steps, or every ``every`` completed epochs.

    >>> TrainConfig(epochs=10, evaluate_every=Interval(500, "step"), checkpoint_every=Interval(1, "epoch"))  # doctest: +SKIP
    """

    every: int
    unit: Literal["step", "epoch"]

    def __post_init__(self) -> None:
        _require(_is_int(self.every), _is_int(self.every) and self.every >= 1, f"Interval.every is {self.every!r}; use an integer >= 1.")
        _require(isinstance(self.unit, str), self.unit in ("step", "epoch"), f"Interval.unit is {self.unit!r}; use 'step' or 'epoch'.")

    def due(self, *, step: int, epoch: int, stepped: bool, epoch_ended: bool) -> bool:
        """Whether the trigger fires at a window boundary that did (not) update and did (not) end an epoch."""
        if self.unit == "step":
            return stepped and step % self.every == 0
        return epoch_ended and epoch % self.every == 0


@dataclass(frozen=True)
class Monitor:
    """Best-model selection and early stopping on one evaluation metric, named ``"<loader>/<metric>"``.

    >>> Monitor("validation/loss", mode="min", patience=5, min_delta=1e-4)  # doctest: +SKIP
    """

    metric: str
    mode: Literal["min", "max"] = "min"
    patience: int | None = None
    min_delta: float = 0.0

    def __post_init__(self) -> None:
        _require(
            isinstance(self.metric, str),
            isinstance(self.metric, str) and self.metric.count("/") >= 1 and not self.metric.startswith("/"),
            f"Monitor.metric is {self.metric!r}; name an evaluation metric as '<loader>/<metric>', "
            "for example 'validation/loss'.",
        )
        _require(isinstance(self.mode, str), self.mode in ("min", "max"), f"Monitor.mode is {self.mode!r}; use 'min' or 'max'.")
        _require(
            self.patience is None or _is_int(self.patience),
            self.patience is None or (_is_int(self.patience) and self.patience >= 1),
            f"Monitor.patience is {self.patience!r}; use None (never stop early) or an integer >= 1.",
        )
        _require(
            _is_number(self.min_delta),
            _is_number(self.min_delta) and math.isfinite(self.min_delta) and self.min_delta >= 0,
            f"Monitor.min_delta is {self.min_delta!r}; use a finite number >= 0.",
        )

    @property
    def loader(self) -> str:
        return self.metric.split("/", 1)[0]

    @property
    def name(self) -> str:
        return self.metric.split("/", 1)[1]

    def improves(self, value: float, best: float | None) -> bool:
        if best is None:
            return True
        if self.mode == "min":
            return value < best - self.min_delta
        return value > best + self.min_delta


@dataclass(frozen=True)
class TrainConfig:
    """How long to train and when to evaluate, checkpoint and log.

    ``epochs`` and ``max_steps`` are cumulative limits: raising them on a finished run continues it.
    ``async_checkpoints`` writes interval and best checkpoints in the background: the loop only waits
    for a copy of the payload in host memory (stop and final checkpoints stay synchronous).
    ``model_randomness="per_batch"`` seeds torch's generators before each microbatch's step from the batch's
    place in the run, so that its dropout is the same on any world size (``"per_rank"``: each rank's own stream).

    >>> TrainConfig(epochs=100, max_grad_norm=1.0, monitor=Monitor("validation/loss", patience=10))  # doctest: +SKIP
    """

    epochs: int
    max_steps: int | None = None
    log_every: int = 10
    evaluate_every: Interval | None = Interval(1, "epoch")
    checkpoint_every: Interval | None = Interval(1, "epoch")
    keep_checkpoints: int | None = None
    max_grad_norm: float | None = None
    monitor: Monitor | None = None
    scheduler_interval: Literal["step", "epoch"] = "step"
    async_checkpoints: bool = False
    model_randomness: Literal["per_rank", "per_batch"] = "per_rank"

    def __post_init__(self) -> None:
        _require(
            _is_int(self.epochs),
            _is_int(self.epochs) and self.epochs >= 1,
            f"TrainConfig.epochs is {self.epochs!r}; use an integer >= 1 (cap a shorter run with max_steps).",
        )
        _require(
            self.max_steps is None or _is_int(self.max_steps),
            self.max_steps is None or (_is_int(self.max_steps) and self.max_steps >= 0),
            f"TrainConfig.max_steps is {self.max_steps!r}; use None or an integer >= 0.",
        )
        _require(
            _is_int(self.log_every),
            _is_int(self.log_every) and self.log_every >= 1,
            f"TrainConfig.log_every is {self.log_every!r}; use an integer >= 1.",
        )
        for name in ("evaluate_every", "checkpoint_every"):
            value = getattr(self, name)
            _require(
                value is None or isinstance(value, Interval),
                True,
                f"TrainConfig.{name} is {value!r}; use None or Interval(every, 'step'|'epoch').",
            )
        _require(
            self.keep_checkpoints is None or _is_int(self.keep_checkpoints),
            self.keep_checkpoints is None or (_is_int(self.keep_checkpoints) and self.keep_checkpoints >= 1),
            f"TrainConfig.keep_checkpoints is {self.keep_checkpoints!r}; use None (keep all) or an integer >= 1.",
        )
        _require(
            self.max_grad_norm is None or _is_number(self.max_grad_norm),
            self.max_grad_norm is None
            or (_is_number(self.max_grad_norm) and math.isfinite(self.max_grad_norm) and self.max_grad_norm > 0),
            f"TrainConfig.max_grad_norm is {self.max_grad_norm!r}; use None or a finite number > 0.",
        )
        _require(
            self.monitor is None or isinstance(self.monitor, Monitor),
            True,
            f"TrainConfig.monitor is {self.monitor!r}; use None or Monitor('<loader>/<metric>').",
        )
        _require(
            isinstance(self.scheduler_interval, str),
            self.scheduler_interval in ("step", "epoch"),
            f"TrainConfig.scheduler_interval is {self.scheduler_interval!r}; use 'step' or 'epoch'.",
        )
        _require(
            isinstance(self.async_checkpoints, bool),
            True,
            f"TrainConfig.async_checkpoints is {self.async_checkpoints!r}; use True (write interval and best "
            "checkpoints in the background) or False.",
        )
        _require(
            isinstance(self.model_randomness, str),
            self.model_randomness in ("per_rank", "per_batch"),
            f"TrainConfig.model_randomness is {self.model_randomness!r}; use 'per_rank' (each rank's own generator "
            "stream) or 'per_batch' (every microbatch's torch draws seeded by the batch's place in the run).",
        )

    def describe(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class TrainState:
    """Where a run is: its data position and counters. Saved in every checkpoint.

    ``epoch`` counts completed epochs and ``next_batch`` is the next batch of epoch ``epoch`` on
    each rank; ``step`` counts successful optimizer updates; ``batches`` and ``samples`` count what
    all ranks together consumed, skipped updates included.
    """

    epoch: int = 0
    next_batch: int = 0
    step: int = 0
    batches: int = 0
    samples: int = 0
    best_metric: float | None = None
    best_step: int | None = None
    evaluations_without_improvement: int = 0
    stop_reason: str | None = None

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in asdict(self):
            setattr(self, name, state[name])


def planned_steps(config: TrainConfig, updates_per_epoch: int | None) -> int:
    """The cumulative update budget, assuming no skipped updates and no early stop.

    ``updates_per_epoch`` is None for a stream without ``__len__``: then ``max_steps`` is the budget.
    """
    if updates_per_epoch is None:
        if config.max_steps is None:
            raise ConfigurationError(
                "The training DataLoader reads a stream without __len__, so an epoch's length is unknown and "
                f"epochs={config.epochs} sets no budget. Set TrainConfig(max_steps=...), or give the dataset a __len__."
            )
        return config.max_steps
    steps = config.epochs * updates_per_epoch
    return steps if config.max_steps is None else min(steps, config.max_steps)


@dataclass
class Progress:
    """Loop bookkeeping that must survive a restart besides :class:`TrainState`."""

    data_seed: int | None = None
    run_id: str | None = None  # stored in every checkpoint: a folder's checkpoints of one run share it
    last_evaluation: list[int] | None = None  # [step, batches] of the latest evaluation
    # The previous window's global loss denominator. The next window's backward divides by it so that
    # fp16 gradients keep mean-sized magnitudes; the exact denominator is applied after the window.
    weight_reference: float = 1.0
    # An evaluation (and checkpoint) that a stop deferred from the paused boundary to the resume.
    deferred_boundary: dict[str, bool] | None = None
    best_checkpoint: str | None = None  # the file name of the best checkpoint, which retention keeps
    # The monitor as it was before a finished run's end-of-budget evaluation (see TrainingSession.finish).
    before_final_evaluation: dict[str, Any] | None = None
    # TrainConfig.model_randomness of the run: a continuation that changes it is refused (Checkpointer.check_fits).
    model_randomness: str | None = None

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in asdict(self):
            # A checkpoint older than a field holds none of it: the field keeps this call's value.
            setattr(self, name, state[name] if name in state or name not in _NEWER_PROGRESS else getattr(self, name))


_NEWER_PROGRESS = ("model_randomness",)  # Progress fields that checkpoints of this format version may lack
