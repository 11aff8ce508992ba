"""One accumulation window: its microbatches, the agreement between ranks, and one optimizer update.

The update's loss is exactly the declared mean over the samples the window consumed on all ranks:
each microbatch's backward runs as soon as it is computed (one graph alive at a time), and one
all-reduce at the end of the window carries the denominator, the sample count, the stop flag and
the nonfinite flag together (a single process needs no all-reduce: the window's own figures are the
global ones).

Per microbatch the engine adds to the user's step only what exactness needs: no host
synchronisation, no collective, and for a weight given as a number no tensor operation besides
keeping the detached loss; the loss metrics, the nonfinite check and the denominator are computed
once per window.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch
from accelerate import Accelerator
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

from .collectives import sum_over_ranks
from .config import TrainState
from .ema import ExponentialMovingAverage
from .fsdp import is_sharded, local_part
from .loss import LossPath, WindowLoss
from .metrics import MetricAccumulator
from .objective import Step
from .resize import BatchKeyedRandomness
from .stop import StopRequest

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule

Scheduler = LRScheduler | ReduceLROnPlateau
_NO_CONTEXT = nullcontext()


@dataclass
class WindowResult:
    """What one accumulation window did, identical on every rank."""

    stepped: bool
    skip_reason: str | None
    batches: int  # global
    samples: int  # global
    stop_requested: bool
    metrics: MetricAccumulator
    weight_total: float = 0.0  # the global denominator of the scalar mean path
    grad_norm: float | None = None
    learning_rates: list[float] = field(default_factory=list)
    stream_ended: bool = False  # a stream without __len__ ran out within this window


@dataclass(frozen=True)
class UpdateRule:
    """The per-call knobs of an optimizer update."""

    max_grad_norm: float | None
    step_scheduler: bool  # whether the scheduler steps once per successful update


class WindowRunner:
    """Runs accumulation windows for a :class:`~elfes.engine.Trainer`. Every rank runs each window."""

    def __init__(
        self,
        accelerator: Accelerator,
        model: nn.Module,
        optimizer: Optimizer,
        step: Step,
        loss: LossPath,
        ema: ExponentialMovingAverage | None,
        scheduler: Scheduler | None,
        batches_per_epoch: int | None,
    ) -> None:
        self.accelerator = accelerator
        self.batches_per_epoch = batches_per_epoch
        self.model = model
        self.optimizer = optimizer
        self.step = step
        self.loss = loss
        self.ema = ema
        self.scheduler = scheduler
        self.parameters = [p for group in optimizer.param_groups for p in group["params"]]
        self.world_size = accelerator.num_processes
        self.distributed = self.world_size > 1
        self.sharded = is_sharded(model)
        self.keyed_randomness: BatchKeyedRandomness | None = None  # TrainConfig.model_randomness="per_batch"

    def run(
        self,
        batches: Iterable[Any],
        size: int,
        stop: StopRequest,
        state: TrainState,
        reference: float,
        rule: UpdateRule,
        on_stop: Callable[[], None] = lambda: None,
    ) -> WindowResult:
        """Train on the next ``size`` batches; ``reference`` is the previous window's denominator.

        ``on_stop`` is called before each microbatch while a stop is requested (to announce it).
        """
        self.optimizer.zero_grad(set_to_none=True)
        metrics = MetricAccumulator()
        window = self.loss.open_window(batches, self.sum_over_ranks, reference)
        scaler = self.accelerator.scaler
        model, step, contribute, labelled = self.model, self.step, window.contribution, window.labelled
        sharded = cast("FSDPModule", model) if self.sharded else None  # or a compiled one, which forwards its calls
        keyed = self.keyed_randomness
        last = size - 1
        local_samples = consumed = 0
        # Grad mode is set once for the window: its microbatches all run with the same.
        with torch.set_grad_enabled(labelled):
            for index, batch in enumerate(window.batches):
                if stop.reason is not None:
                    on_stop()
                consumed += 1
                # Gradients are all-reduced (reduce-scattered: FSDP2) once per window, on its last microbatch.
                if sharded is not None:
                    sharded.set_requires_gradient_sync(index == last)
                if keyed is not None:
                    keyed.seed(state.epoch, state.next_batch + index)
                with self.accelerator.no_sync(model) if self.distributed and sharded is None and index != last else _NO_CONTEXT:
                    output = step(model, batch)
                    count = output.num_samples
                    if count.__class__ is not int or count < 0:  # the exact type: a bool or a NumPy integer is checked
                        count = _sample_count(count, state.epoch, state.next_batch + index)
                    local_samples += count
                    contribution, gradient = contribute(output, index, metrics)
                    if labelled and scaler is not None:
                        scaler.scale(contribution if gradient is None else contribution * gradient).backward()
                    elif labelled:
                        contribution.backward(gradient)  # type: ignore[no-untyped-call]  # torch leaves it unannotated
                if output.metrics:
                    metrics.update(output.metrics)
        stream_ended = consumed < size and self.batches_per_epoch is None
        if consumed != size:
            if self.batches_per_epoch is not None or self.distributed:
                self._raise_short_window(state, consumed)
            size = consumed  # the last window of a stream that ended: its epoch ends with it

        window.finish(metrics)
        window.check(state.epoch, state.next_batch)
        weight_total, samples, stop_requested, nonfinite = self._agree(window, local_samples, stop)
        result = WindowResult(
            stepped=False,
            skip_reason=None,
            batches=size * self.world_size,
            samples=samples,
            stop_requested=stop_requested,
            metrics=metrics,
            weight_total=weight_total,
            stream_ended=stream_ended,
        )
        if nonfinite:
            self._raise_nonfinite_loss(window.losses(), state)
        factor = window.gradient_factor(weight_total, self.world_size)
        if factor is None:
            result.skip_reason = "unlabelled_window"
            return result
        result.grad_norm, result.learning_rates = self._update(factor, size, state, rule)
        result.stepped = result.grad_norm is not None
        if not result.stepped:
            result.skip_reason = "amp_overflow"
        return result

    def _raise_short_window(self, state: TrainState, consumed: int) -> None:
        where = f"{state.next_batch + consumed} batches in epoch {state.epoch}"
        if self.batches_per_epoch is not None:
            raise RuntimeError(
                f"The training DataLoader yielded {where} where its length promised {self.batches_per_epoch}. "
                "Exact training needs a dataset whose sampler (or stream) yields exactly len(dataloader) batches."
            )
        raise RuntimeError(
            f"Rank {self.accelerator.process_index}'s training stream ended after {where}, in the middle of an "
            "accumulation window. With several ranks an epoch of a stream must have a known length: give each "
            "rank's dataset a __len__ with the same number of batches (or a stream that outlasts max_steps)."
        )

    def _agree(self, window: WindowLoss, local_samples: int, stop: StopRequest) -> tuple[float, int, bool, bool]:
        """The window's global denominator and sample count, and whether any rank asked to stop or saw a
        nonfinite loss: one all-reduce of the four together, or none in a single process."""
        local_weight = window.local_weight
        if not self.distributed:
            return float(local_weight), local_samples, stop.reason is not None, bool(window.nonfinite())
        device = self.accelerator.device
        parts = [local_weight, float(local_samples), 1.0 if stop.reason is not None else 0.0, window.nonfinite()]
        if any(isinstance(part, torch.Tensor) for part in parts):  # tensor weights, or the objective path
            flags = torch.stack([torch.as_tensor(part).to(device=device, dtype=torch.float64).reshape(()) for part in parts])
        else:
            flags = torch.tensor([float(part) for part in parts], dtype=torch.float64, device=device)
        weight_total, samples, stop_flag, nonfinite_flag = self.sum_over_ranks(flags).tolist()
        return weight_total, int(samples), stop_flag > 0, nonfinite_flag > 0

    def sum_over_ranks(self, values: torch.Tensor) -> torch.Tensor:
        return sum_over_ranks(values, self.accelerator)

    def _update(self, factor: float, size: int, state: TrainState, rule: UpdateRule) -> tuple[float | None, list[float]]:
        """Unscale once, rescale to the window mean, clip, step. Returns (pre-clip norm or None if skipped, lrs)."""
        scaler = self.accelerator.scaler
        if scaler is not None:
            scaler.unscale_(self.optimizer)
        gradients = [p.grad for p in self.parameters if p.grad is not None]
        if factor != 1.0:
            torch._foreach_mul_(gradients, factor)
        norm = torch.nn.utils.get_total_norm(gradients) if gradients else torch.zeros(())  # over all shards
        learning_rates = [float(group["lr"]) for group in self.optimizer.param_groups]
        # the window's one host synchronisation after the agreement (a sharded model's norm is a replicated DTensor)
        norm_value = (local_part(norm) if self.sharded else norm).item()
        finite = math.isfinite(norm_value)
        if scaler is None and not finite:
            raise FloatingPointError(
                f"Nonfinite gradient norm ({norm_value}) in the window of epoch {state.epoch}, "
                f"{_batch_range(state.next_batch, size)} (step {state.step}); parameters were not updated. Lower "
                "the learning rate, clip with TrainConfig(max_grad_norm=...), or look for operations that overflow."
            )
        if rule.max_grad_norm is not None and finite:
            torch.nn.utils.clip_grads_with_norm_(self.parameters, rule.max_grad_norm, norm)
        if scaler is not None:
            scale = scaler.get_scale()
            scaler.step(self.optimizer)
            scaler.update()
            if scaler.get_scale() < scale:  # the standard scaler shrinks its scale exactly when it skipped
                return None, learning_rates
        else:
            self.optimizer.step()
        if self.ema is not None:
            self.ema.update()
        if self.scheduler is not None and rule.step_scheduler:
            self.scheduler.step()
        return norm_value, learning_rates

    def _raise_nonfinite_loss(self, losses: list[torch.Tensor], state: TrainState) -> None:
        for index, loss in enumerate(losses):
            if not bool(torch.isfinite(loss).all()):
                raise FloatingPointError(
                    f"Nonfinite loss ({loss.item()}) at epoch {state.epoch}, batch {state.next_batch + index} "
                    f"(step {state.step}, rank {self.accelerator.process_index}); parameters were not updated. "
                    "Check that batch's inputs and targets, and lower the learning rate if the loss grew before it."
                )
        raise FloatingPointError(
            f"Another rank saw a nonfinite loss in the window starting at epoch {state.epoch}, batch "
            f"{state.next_batch} (step {state.step}); parameters were not updated. See that rank's error."
        )


def _sample_count(num_samples: Any, epoch: int, batch: int) -> int:
    try:
        count = operator.index(num_samples)
    except TypeError:
        count = -1
    if count < 0:
        raise ValueError(
            f"StepOutput.num_samples at epoch {epoch}, batch {batch} is {num_samples!r}; give the batch's number of "
            "samples as an int >= 0 (e.g. len(inputs))."
        )
    return count


def _batch_range(first: int, size: int) -> str:
    return f"batch {first}" if size == 1 else f"batches {first}-{first + size - 1}"
