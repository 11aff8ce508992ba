"""The training loop: one explicit loop that decides when to update, evaluate, checkpoint and stop.

For each accumulation window the loop runs the microbatches (one forward graph alive at a time),
agrees with the other ranks on the window's denominator and on whether to stop, takes one optimizer
update whose loss is exactly the declared mean over the samples consumed, and then, at that boundary,
maybe logs, maybe evaluates, maybe checkpoints, and maybe stops.
"""

from __future__ import annotations

import itertools
import math
import operator
import time
import warnings
from collections.abc import Iterator, Mapping
from contextlib import closing, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from accelerate import Accelerator
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau
from torch.utils.data import DataLoader

from elfes.records import RunLogger

from .checkpoint import (
    FORMAT,
    VERSION,
    CheckpointDirectory,
    CheckpointError,
    CheckpointName,
    Weights,
    plain_state_dict,
    read_checkpoint,
    save_state_dict,
)
from .config import Monitor, TrainConfig, TrainState, planned_steps
from .data import (
    EpochData,
    check_distributed_batching,
    check_process_group,
    give_shuffle_its_own_generator,
    shared_data_seed,
    verify_rank_lengths,
)
from .ema import ExponentialMovingAverage
from .evaluator import Evaluator
from .metrics import MetricAccumulator
from .objective import (
    Objective,
    Step,
    check_metric_names,
    finish_loss_metrics,
    record_objective_losses,
    record_scalar_loss,
    scalar_loss_and_weight,
)
from .rng import capture_rng, restore_rng
from .schedule import WarmupDecay
from .stop import StopRequest

Scheduler = LRScheduler | ReduceLROnPlateau
# Layout entries that change rounding but not meaning: a mismatch warns instead of refusing.
_ADVISORY_LAYOUT = ("torch_threads",)


@dataclass
class Progress:
    """Loop bookkeeping that must survive a restart besides :class:`TrainState`."""

    data_seed: int | None = None
    last_evaluation: list[int] | None = None  # [step, batches] of the latest evaluation
    # The previous window's global loss denominator. The next window's backward divides by it so that
    # fp16 gradients keep mean-sized magnitudes; the exact denominator is applied after the window.
    weight_reference: float = 1.0
    # An evaluation (and checkpoint) that a stop deferred from the paused boundary to the resume.
    deferred_boundary: dict[str, bool] | None = None

    def state_dict(self) -> dict[str, Any]:
        return {
            "data_seed": self.data_seed,
            "last_evaluation": self.last_evaluation,
            "weight_reference": self.weight_reference,
            "deferred_boundary": self.deferred_boundary,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.data_seed = state["data_seed"]
        self.last_evaluation = state["last_evaluation"]
        self.weight_reference = state["weight_reference"]
        self.deferred_boundary = state["deferred_boundary"]


@dataclass
class WindowResult:
    """What one accumulation window did, identical on every rank."""

    stepped: bool
    skip_reason: str | None
    batches: int  # global
    samples: int  # global
    stop_requested: bool
    metrics: MetricAccumulator
    grad_norm: float | None = None
    learning_rates: list[float] = field(default_factory=list)


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


@dataclass
class LogInterval:
    """Statistics accumulated between two ``train`` events."""

    metrics: MetricAccumulator = field(default_factory=MetricAccumulator)
    grad_norms: list[float] = field(default_factory=list)
    samples: int = 0
    seconds: float = 0.0


class Trainer:
    """Trains ``model`` with exact accumulation windows, evaluation, checkpoints and resumable stops.

    The trainer prepares the model and the training DataLoader with ``accelerator``; pass them
    unprepared. ``accelerator.gradient_accumulation_steps`` sets the window length. Every rank
    constructs the trainer and calls :meth:`train` with the same arguments.

    >>> trainer = Trainer(accelerator, model, optimizer, train_loader, step,
    ...                   evaluator=evaluator, ema_decay=0.999, logger=logger)
    >>> state = trainer.train(TrainConfig(epochs=10), checkpoint_dir=run_dir / "checkpoints")
    """

    def __init__(
        self,
        accelerator: Accelerator,
        model: nn.Module,
        optimizer: Optimizer,
        train_dataloader: DataLoader,
        step: Step,
        *,
        evaluator: Evaluator | None = None,
        objective: Objective | None = None,
        scheduler: Scheduler | None = None,
        ema_decay: float | None = None,
        logger: RunLogger | None = None,
    ) -> None:
        check_process_group(accelerator)
        check_distributed_batching(accelerator, train_dataloader)
        self.accelerator = accelerator
        self.optimizer = optimizer
        self.step = step
        self.evaluator = evaluator
        self.objective = objective
        self.scheduler = scheduler
        self.logger = logger
        self.model = accelerator.prepare_model(model)
        # The plain module owns the parameter names used in checkpoints and exports.
        self.module = accelerator.unwrap_model(self.model, keep_fp32_wrapper=True, keep_torch_compile=False)
        total_batches = len(train_dataloader)
        give_shuffle_its_own_generator(train_dataloader)
        self.train_dataloader = accelerator.prepare_data_loader(train_dataloader)
        self.batches_per_epoch = verify_rank_lengths(accelerator, self.train_dataloader, total_batches)
        self.accumulation_steps = accelerator.gradient_accumulation_steps
        self.updates_per_epoch = math.ceil(self.batches_per_epoch / self.accumulation_steps)
        self.ema = ExponentialMovingAverage(self.module, ema_decay) if ema_decay is not None else None
        self.state = TrainState()
        self.progress = Progress()
        self._parameters = [p for group in optimizer.param_groups for p in group["params"]]
        self._clock = PhaseClock()
        self._saved: CheckpointName | None = None  # the position this train() call last published
        self._restored: tuple[Path, dict[str, Any], dict[str, Any]] | None = None  # file, state, progress
        self._max_grad_norm: float | None = None
        self._scheduler_interval = "step"
        self._scheduler_steps_per_update = True
        self._last_learning_rates = [float(group["lr"]) for group in optimizer.param_groups]

    # ----------------------------------------------------------------------------------------
    # Public API

    def planned_steps(self, config: TrainConfig) -> int:
        """The cumulative number of updates ``config`` allows: epochs times updates per epoch, capped by max_steps."""
        return planned_steps(config, self.updates_per_epoch)

    def train(
        self,
        config: TrainConfig,
        *,
        checkpoint_dir: Path | None = None,
        resume_from: Path | None = None,
        stop: StopRequest | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> TrainState:
        """Train until ``config``'s cumulative budget is spent, early stopping fires, or ``stop`` is requested.

        A requested stop finishes the current window, saves ``last`` and returns with
        ``state.stop_reason`` set; a normal end evaluates (unless this position was just evaluated)
        and saves ``final``. Call on every rank.
        """
        self._check_setup(config)
        self._clock = PhaseClock()
        self._saved, self._restored = None, None
        directory = CheckpointDirectory(Path(checkpoint_dir)) if checkpoint_dir is not None else None
        stop = stop if stop is not None else StopRequest()
        fresh = resume_from is None and self.state.batches == 0
        if fresh and directory is not None and directory.checkpoints():
            raise ValueError(
                f"checkpoint_dir {directory.path} already holds checkpoints of another run. Continue it with "
                f"resume_from={directory.path / 'last'}, or give this run an empty directory."
            )
        resumed_from = None
        if resume_from is not None:
            resumed_from = self._restore(Path(resume_from), config)
        elif self.progress.data_seed is None:
            self.progress.data_seed = shared_data_seed(self.accelerator)
        self._log_start(config, metadata or {}, resumed_from)  # with the restored state, stop reason included
        self.state.stop_reason = None

        self.model.train()
        data = EpochData(self.train_dataloader, self.progress.data_seed)
        interval = LogInterval()
        early_stop = self._finish_deferred_boundary(config, directory) or self._patience_exhausted(config)
        while not early_stop and not self._budget_spent(config):
            with closing(data.batches(self.state.epoch, self.state.next_batch)) as batches:
                epoch_ended = False
                while not (epoch_ended or early_stop or self._budget_spent(config)):
                    size = min(self.accumulation_steps, self.batches_per_epoch - self.state.next_batch)
                    started = time.perf_counter()
                    result = self._run_window(itertools.islice(batches, size), size, stop)
                    seconds = time.perf_counter() - started
                    self._clock.train_s += seconds
                    epoch_ended = self._advance(result)
                    self._record_interval(interval, result, seconds, config)

                    evaluate = self._evaluation_due(config, result, epoch_ended)
                    checkpoint = self._checkpoint_due(config, result, epoch_ended)
                    if result.stop_requested:
                        return self._pause(stop, config, directory, evaluate=evaluate, checkpoint=checkpoint)
                    early_stop = self._close_boundary(config, directory, evaluate=evaluate, checkpoint=checkpoint)

        return self._finish(config, directory)

    def evaluate(self, *, weights: Weights = "raw") -> dict[str, dict[str, float]]:
        """Evaluate the raw or EMA weights with the trainer's evaluator. Call on every rank.

        >>> trainer.evaluate(weights="ema")["validation"]["loss"]
        """
        if self.evaluator is None:
            raise ValueError("Trainer.evaluate() needs an evaluator; pass Trainer(..., evaluator=Evaluator(...)).")
        self._check_weight_choice(weights)
        if weights == "ema":
            with self.ema.swapped_in():
                return self.evaluator.evaluate(self.model)
        return self.evaluator.evaluate(self.model)

    def save_model(self, path: Path, *, weights: Weights = "raw") -> None:
        """Write the raw or EMA weights as a plain state dict (no DDP or compile prefixes).

        Call on every rank; the main process writes.

        >>> trainer.save_model(run_dir / "model.pt", weights="ema")
        """
        self._check_weight_choice(weights)
        state = plain_state_dict(self.module)
        if weights == "ema":
            state.update({name: tensor.detach().cpu().clone() for name, tensor in self.ema.state_dict().items()})
        if self.accelerator.is_main_process:
            save_state_dict(state, Path(path))
        self.accelerator.wait_for_everyone()
        self._log("export", weights=weights, path=str(path))

    # ----------------------------------------------------------------------------------------
    # One accumulation window

    def _run_window(self, window: Iterator[Any], size: int, stop: StopRequest) -> WindowResult:
        self.optimizer.zero_grad(set_to_none=True)
        device = self.accelerator.device
        metrics = MetricAccumulator()
        losses: list[tuple[int, torch.Tensor]] = []
        local_weight = torch.zeros((), dtype=torch.float64, device=device)
        invalid_weights: list[tuple[int, torch.Tensor]] = []
        local_samples = 0

        labelled = True
        reference = self.progress.weight_reference
        if self.objective is not None:
            window = list(window)  # counts of the whole global window are needed before any backward
            batch_counts = [self.objective.batch_counts(batch, device) for batch in window]
            coefficients, present = self._objective_coefficients(batch_counts)
            labelled = any(present)

        consumed = 0
        for index, batch in enumerate(window):
            consumed += 1
            last = index == size - 1
            grad_enabled = labelled
            # Gradients are all-reduced once per window, on its last microbatch.
            synchronisation = nullcontext() if last else self.accelerator.no_sync(self.model)
            with synchronisation, torch.set_grad_enabled(grad_enabled):
                output = self.step(self.model, batch)
                local_samples += _sample_count(output.num_samples, self.state.epoch, self.state.next_batch + index)
                check_metric_names(output.metrics, self.objective)
                if self.objective is None:
                    loss, weight = scalar_loss_and_weight(output)
                    invalid_weights.append((index, ~torch.isfinite(weight) | (weight < 0)))
                    record_scalar_loss(metrics, loss, weight)
                    local_weight = local_weight + weight
                    # A batch that declares weight 0 (no tokens, no labels) contributes nothing, even when
                    # its mean over nothing is NaN; every rank still runs backward so DDP stays in step.
                    scaled = loss * (weight / reference).to(loss.dtype)
                    contribution = torch.where(weight > 0, scaled, torch.zeros_like(loss))
                    losses.append((index, torch.where(weight > 0, loss.detach(), torch.zeros_like(loss))))
                else:
                    terms = self.objective.term_losses(output)
                    record_objective_losses(metrics, self.objective, terms, batch_counts[index])
                    # Terms absent from the whole window have coefficient 0 and contribute nothing.
                    observed = [(c, t) for c, t, p in zip(coefficients.tolist(), terms, present) if p]
                    contribution = sum((c * t for c, t in observed), start=torch.zeros((), device=device))
                    losses.append((index, torch.stack([t.detach().double() for _, t in observed] or [torch.zeros((), device=device)]).sum()))
                if grad_enabled:
                    self._backward(contribution)
            metrics.update(output.metrics)
        if consumed != size:
            raise RuntimeError(
                f"The training DataLoader yielded {self.state.next_batch + consumed} batches in epoch "
                f"{self.state.epoch} where its length promised {self.batches_per_epoch}. Exact training needs a "
                "map-style Dataset whose sampler yields exactly len(dataloader) batches."
            )

        self._check_weights_of_window(invalid_weights)
        nonfinite = torch.stack([(~torch.isfinite(loss)).any() for _, loss in losses]).any().double()
        flags = torch.stack(
            [
                local_weight,
                torch.tensor(float(local_samples), dtype=torch.float64, device=device),
                torch.tensor(1.0 if stop.reason is not None else 0.0, dtype=torch.float64, device=device),
                nonfinite.to(device),
            ]
        )
        weight_total, samples, stop_flag, nonfinite_flag = self._sum_over_ranks(flags).tolist()
        result = WindowResult(
            stepped=False,
            skip_reason=None,
            batches=size * self.accelerator.num_processes,
            samples=int(samples),
            stop_requested=stop_flag > 0,
            metrics=metrics,
        )
        if nonfinite_flag > 0:
            self._raise_nonfinite_loss(losses)
        if self.objective is None and weight_total > 0:
            self.progress.weight_reference = weight_total
        if not labelled or (self.objective is None and weight_total == 0):
            result.skip_reason = "unlabelled_window"
            return result

        # DDP averaged the gradients of local sums over ranks; undo the average and divide by the
        # window's global denominator (the objective's terms are already normalised).
        world = self.accelerator.num_processes
        factor = world * reference / weight_total if self.objective is None else float(world)
        result.grad_norm, result.learning_rates = self._optimizer_update(factor, size)
        result.stepped = result.grad_norm is not None
        if not result.stepped:
            result.skip_reason = "amp_overflow"
        return result

    def _check_weights_of_window(self, invalid_weights: list[tuple[int, torch.Tensor]]) -> None:
        if not invalid_weights or not bool(torch.stack([bad for _, bad in invalid_weights]).any()):
            return
        index = next(index for index, bad in invalid_weights if bool(bad))
        raise ValueError(
            f"StepOutput.loss_weight at epoch {self.state.epoch}, batch {self.state.next_batch + index} is negative or "
            "nonfinite; a loss denominator must be a finite count >= 0 (tokens, atoms, labelled components)."
        )

    def _objective_coefficients(self, batch_counts: list[torch.Tensor]) -> tuple[torch.Tensor, list[bool]]:
        """Each term's weight over its count summed across the global window, and whether it is present."""
        device = self.accelerator.device
        local_counts = torch.stack(batch_counts).sum(0)
        global_counts = self._sum_over_ranks(local_counts)
        weights = torch.tensor(list(self.objective.weights.values()), dtype=torch.float64, device=device)
        present = global_counts > 0
        return torch.where(present, weights / global_counts.clamp_min(1e-300), 0.0), present.tolist()

    def _backward(self, loss: torch.Tensor) -> None:
        scaler = self.accelerator.scaler
        (scaler.scale(loss) if scaler is not None else loss).backward()

    def _optimizer_update(self, factor: float, size: int) -> tuple[float | None, list[float]]:
        """Unscale once, rescale to the window mean, clip, step. Returns (pre-clip norm or None if skipped, lrs)."""
        scaler = self.accelerator.scaler
        if scaler is not None:
            scaler.unscale_(self.optimizer)
        gradients = [p.grad for p in self._parameters if p.grad is not None]
        if factor != 1.0:
            torch._foreach_mul_(gradients, factor)
        norm = torch.nn.utils.get_total_norm(gradients) if gradients else torch.zeros(())
        learning_rates = [float(group["lr"]) for group in self.optimizer.param_groups]
        finite = bool(torch.isfinite(norm))
        if scaler is None and not finite:
            raise FloatingPointError(
                f"Nonfinite gradient norm ({norm.item()}) in the window of epoch {self.state.epoch}, "
                f"{_batch_range(self.state.next_batch, size)} (step {self.state.step}); parameters were "
                "not updated. Lower the learning rate, clip with TrainConfig(max_grad_norm=...), or look for "
                "operations that overflow."
            )
        if self._max_grad_norm is not None and finite:
            torch.nn.utils.clip_grads_with_norm_(self._parameters, self._max_grad_norm, norm)
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
        if self.scheduler is not None and self._scheduler_steps_per_update:
            self.scheduler.step()
        return float(norm), learning_rates

    def _raise_nonfinite_loss(self, losses: list[tuple[int, torch.Tensor]]) -> None:
        for index, loss in losses:
            if not bool(torch.isfinite(loss).all()):
                raise FloatingPointError(
                    f"Nonfinite loss ({loss.item()}) at epoch {self.state.epoch}, batch "
                    f"{self.state.next_batch + index} (step {self.state.step}, rank "
                    f"{self.accelerator.process_index}); parameters were not updated. Check that batch's inputs "
                    "and targets, and lower the learning rate if the loss grew before it."
                )
        raise FloatingPointError(
            f"Another rank saw a nonfinite loss in the window starting at epoch {self.state.epoch}, batch "
            f"{self.state.next_batch} (step {self.state.step}); parameters were not updated. See that rank's error."
        )

    def _sum_over_ranks(self, values: torch.Tensor) -> torch.Tensor:
        if self.accelerator.num_processes > 1:
            values = values.clone()
            dist.all_reduce(values, op=dist.ReduceOp.SUM)
        return values

    # ----------------------------------------------------------------------------------------
    # Position, budget and policy

    def _advance(self, result: WindowResult) -> bool:
        """Move the data position past the window; returns whether the epoch ended."""
        state = self.state
        state.next_batch += result.batches // self.accelerator.num_processes
        state.batches += result.batches
        state.samples += result.samples
        if result.stepped:
            state.step += 1
        else:
            self._log("skipped", epoch=state.epoch, step=state.step, reason=result.skip_reason)
        if state.next_batch < self.batches_per_epoch:
            return False
        state.epoch += 1
        state.next_batch = 0
        if self.scheduler is not None and self._scheduler_interval == "epoch" and not isinstance(self.scheduler, ReduceLROnPlateau):
            self.scheduler.step()
        return True

    def _evaluation_due(self, config: TrainConfig, result: WindowResult, epoch_ended: bool) -> bool:
        return (
            self.evaluator is not None
            and config.evaluate_every is not None
            and config.evaluate_every.due(step=self.state.step, epoch=self.state.epoch, stepped=result.stepped, epoch_ended=epoch_ended)
        )

    def _checkpoint_due(self, config: TrainConfig, result: WindowResult, epoch_ended: bool) -> bool:
        every = config.checkpoint_every
        return every is not None and every.due(
            step=self.state.step, epoch=self.state.epoch, stepped=result.stepped, epoch_ended=epoch_ended
        )

    def _patience_exhausted(self, config: TrainConfig) -> bool:
        monitor = config.monitor
        exhausted = bool(monitor and monitor.patience and self.state.evaluations_without_improvement >= monitor.patience)
        if exhausted:
            self.state.stop_reason = "early_stopping"
        return exhausted

    def _close_boundary(self, config: TrainConfig, directory: CheckpointDirectory | None, *, evaluate: bool, checkpoint: bool) -> bool:
        """Evaluate and checkpoint as this window boundary requires; returns whether to stop early."""
        early_stop, improved = False, None
        if evaluate:
            early_stop, improved = self._evaluate_and_monitor(config)
        if early_stop:
            self.state.stop_reason = "early_stopping"
        if directory is not None and (checkpoint or improved):
            self._save(directory, config, reason="interval" if checkpoint else "best", best=bool(improved))
        return early_stop

    def _pause(
        self, stop: StopRequest, config: TrainConfig, directory: CheckpointDirectory | None, *, evaluate: bool, checkpoint: bool
    ) -> TrainState:
        """Save ``last`` at once and return. An evaluation due here runs first thing after the resume,
        so a job within its preemption grace period is not killed while evaluating."""
        self._agree_on_stop(stop)
        if evaluate:
            self.progress.deferred_boundary = {"evaluate": True, "checkpoint": checkpoint}
        if directory is not None:
            self._save(directory, config, reason="stop")
        self._log("stopped", reason=self.state.stop_reason, state=self.state.state_dict(), **self._clock.totals())
        return self.state

    def _finish(self, config: TrainConfig, directory: CheckpointDirectory | None) -> TrainState:
        """A normal end (budget spent or early stop): evaluate this position unless done, save ``final``."""
        improved = None
        if self.evaluator is not None and self.progress.last_evaluation != self._position():
            _, improved = self._evaluate_and_monitor(config)
        if directory is not None:
            self._save(directory, config, reason="final", best=bool(improved), final=True)
        self._log("finished", state=self.state.state_dict(), **self._clock.totals())
        return self.state

    def _finish_deferred_boundary(self, config: TrainConfig, directory: CheckpointDirectory | None) -> bool:
        deferred, self.progress.deferred_boundary = self.progress.deferred_boundary, None
        if deferred is None:
            return False
        return self._close_boundary(config, directory, evaluate=deferred["evaluate"], checkpoint=deferred["checkpoint"])

    def _budget_spent(self, config: TrainConfig) -> bool:
        return self.state.epoch >= config.epochs or (config.max_steps is not None and self.state.step >= config.max_steps)

    def _position(self) -> list[int]:
        return [self.state.step, self.state.batches]

    def _check_setup(self, config: TrainConfig) -> None:
        if not isinstance(config, TrainConfig):
            raise TypeError(f"Trainer.train(config) needs a TrainConfig; got {type(config).__name__}.")
        if config.monitor is not None and self.evaluator is None:
            raise ValueError(
                f"TrainConfig.monitor watches {config.monitor.metric!r} but the trainer has no evaluator; pass "
                "Trainer(..., evaluator=Evaluator(...)) or remove the monitor."
            )
        if config.monitor is not None and config.evaluate_every is None:
            raise ValueError(
                "TrainConfig.monitor needs periodic evaluation but evaluate_every is None; set "
                "evaluate_every=Interval(...) or remove the monitor."
            )
        if isinstance(self.scheduler, ReduceLROnPlateau) and config.monitor is None:
            raise ValueError(
                "ReduceLROnPlateau steps on the monitored metric, but TrainConfig.monitor is None; set "
                "monitor=Monitor('<loader>/<metric>') (and mode to match the scheduler's mode)."
            )
        if isinstance(self.scheduler, ReduceLROnPlateau) and self.scheduler.mode != config.monitor.mode:
            raise ValueError(
                f"ReduceLROnPlateau(mode={self.scheduler.mode!r}) would read {config.monitor.metric!r} the opposite "
                f"way from Monitor(mode={config.monitor.mode!r}); give both the same mode."
            )
        if self.scheduler is not None and not isinstance(self.scheduler, (LRScheduler, ReduceLROnPlateau)):
            raise TypeError(f"Trainer.scheduler is a {type(self.scheduler).__name__}; use a torch LR scheduler.")
        self._max_grad_norm = config.max_grad_norm
        self._scheduler_interval = config.scheduler_interval
        self._scheduler_steps_per_update = config.scheduler_interval == "step" and not isinstance(
            self.scheduler, ReduceLROnPlateau
        )

    # ----------------------------------------------------------------------------------------
    # Evaluation and the monitor

    def _evaluate_and_monitor(self, config: TrainConfig) -> tuple[bool, bool | None]:
        """Evaluate (EMA weights when EMA is on) and update the monitor.

        Returns whether to stop early and whether the monitored metric improved (None without a monitor).
        """
        started = time.perf_counter()
        weights: Weights = "ema" if self.ema is not None else "raw"
        results = self.evaluate(weights=weights)
        duration = time.perf_counter() - started
        self._clock.evaluation_s += duration
        self.progress.last_evaluation = self._position()
        self._saved = None  # the monitor and progress changed: a checkpoint of this position is now stale
        monitor, improved, stop_early = config.monitor, None, False
        if monitor is not None:
            value = _monitored_value(results, monitor)
            improved = monitor.improves(value, self.state.best_metric)
            if improved:
                self.state.best_metric = value
                self.state.best_step = self.state.step
                self.state.evaluations_without_improvement = 0
            else:
                self.state.evaluations_without_improvement += 1
            if isinstance(self.scheduler, ReduceLROnPlateau):
                self.scheduler.step(value)
            stop_early = monitor.patience is not None and self.state.evaluations_without_improvement >= monitor.patience
        self._log(
            "evaluation",
            epoch=self.state.epoch,
            step=self.state.step,
            weights=weights,
            metrics=results,
            duration_s=duration,
            monitor=monitor.metric if monitor else None,
            improved=improved,
            best_metric=self.state.best_metric,
            best_step=self.state.best_step,
        )
        return stop_early, improved

    # ----------------------------------------------------------------------------------------
    # Checkpoints and resume

    def _stateful(self) -> dict[str, Any]:
        """Everything that must survive a restart, by name. Each has state_dict/load_state_dict."""
        return {
            "model": self.module,
            "ema": self.ema,
            "optimizer": self.optimizer,
            "scheduler": self.scheduler,
            "scaler": self.accelerator.scaler,
            "state": self.state,
            "progress": self.progress,
        }

    def _layout(self) -> dict[str, Any]:
        """What a checkpoint must share with the run that resumes it."""
        return {
            "world_size": self.accelerator.num_processes,
            "gradient_accumulation_steps": self.accumulation_steps,
            "batches_per_epoch": self.batches_per_epoch,
            "mixed_precision": str(self.accelerator.mixed_precision),
            "objective": self.objective.describe() if self.objective is not None else None,
            "ema_decay": self.ema.decay if self.ema is not None else None,
            "optimizer": type(self.optimizer).__name__,
            "optimizer_groups": [[list(p.shape) for p in group["params"]] for group in self.optimizer.param_groups],
            "scheduler": type(self.scheduler).__name__ if self.scheduler is not None else None,
            "torch_threads": torch.get_num_threads(),
        }

    def _save(self, directory: CheckpointDirectory, config: TrainConfig, *, reason: str, best: bool = False, final: bool = False) -> None:
        started = time.perf_counter()
        rng_states: list[Any] = [capture_rng()]
        if self.accelerator.num_processes > 1:
            gathered: list[Any] = [None] * self.accelerator.num_processes
            dist.all_gather_object(gathered, rng_states[0])
            rng_states = gathered
        name = CheckpointName(self.state.step, self.state.batches)
        path, size = directory.file(name), 0
        if self.accelerator.is_main_process and self._already_published(path, name):
            size = path.stat().st_size
        elif self.accelerator.is_main_process:
            payload = {"format": FORMAT, "version": VERSION, "layout": self._layout(), "rng": rng_states}
            for key, component in self._stateful().items():
                payload[key] = _component_state(component)
            path, size = directory.save(payload, name)
        if self.accelerator.is_main_process:
            directory.point("last", path)
            if best:
                directory.point("best", path)
            if final:
                directory.point("final", path)
            directory.apply_retention(config.keep_checkpoints)
        self._saved = name
        self.accelerator.wait_for_everyone()
        duration = time.perf_counter() - started
        self._clock.checkpoint_s += duration
        self._log(
            "checkpoint",
            path=str(path),
            epoch=self.state.epoch,
            step=self.state.step,
            next_batch=self.state.next_batch,
            reason=reason,
            best=best,
            final=final,
            bytes=size,
            duration_s=duration,
        )

    def _already_published(self, path: Path, name: CheckpointName) -> bool:
        """Whether ``path`` already holds exactly this state: written earlier in this call (an interval
        save before the final one), or the checkpoint this call resumed from, unchanged since."""
        if name == self._saved and path.exists():
            return True
        if self._restored is None or not path.exists() or path.resolve() != self._restored[0]:
            return False
        return self._restored[1:] == (self.state.state_dict(), self.progress.state_dict())

    def _restore(self, source: Path, config: TrainConfig) -> str:
        """Load every stateful part from a checkpoint, after checking that all of it fits this run."""
        payload = read_checkpoint(source)
        resolved = source.resolve()
        expected, found = self._layout(), payload["layout"]
        mismatches = [
            f"{key}: the checkpoint has {found.get(key)!r}, this run has {expected[key]!r}"
            for key in expected
            if key not in _ADVISORY_LAYOUT and found.get(key) != expected[key]
        ]
        mismatches += _model_mismatches(payload["model"], self.module.state_dict())
        if mismatches:
            raise CheckpointError(
                f"Checkpoint {resolved} does not match this run:\n  - " + "\n  - ".join(mismatches) + "\n"
                "Resume with the same world size, batching, objective, EMA, precision, optimizer and scheduler; "
                "to change them, start a new run from its weights (load_weights)."
            )
        if found.get("torch_threads") != expected["torch_threads"]:
            warnings.warn(
                f"Checkpoint {resolved} was written with {found.get('torch_threads')} torch threads per process and "
                f"this run uses {expected['torch_threads']}; CPU kernels may round differently, so the continuation "
                "may not be bitwise identical. Set the same OMP_NUM_THREADS (or torch.set_num_threads) to keep it exact.",
                stacklevel=3,
            )
        for key, component in self._stateful().items():
            if component is not None:
                component.load_state_dict(payload[key])
        restore_rng(payload["rng"][self.accelerator.process_index])
        self._restored = (resolved, payload["state"], payload["progress"])
        self._warn_if_schedule_budget_differs(config, resolved)
        return str(resolved)

    def _warn_if_schedule_budget_differs(self, config: TrainConfig, source: Path) -> None:
        planned = self.planned_steps(config)
        for schedule in getattr(self.scheduler, "lr_lambdas", []):
            if isinstance(schedule, WarmupDecay) and schedule.total_steps != planned:
                warnings.warn(
                    f"The learning-rate schedule restored from {source} decays until step {schedule.total_steps}, "
                    f"but this run now plans {planned} steps. The checkpoint's schedule is kept, as exact "
                    "continuation requires; to decay over the new budget, start a new run from its weights.",
                    stacklevel=4,
                )

    def _agree_on_stop(self, stop: StopRequest) -> None:
        """Give every rank the same stop reason (the first rank's that has one) and record it."""
        reason, signal_name = stop.reason, stop.signal
        if self.accelerator.num_processes > 1:
            gathered: list[Any] = [None] * self.accelerator.num_processes
            dist.all_gather_object(gathered, (reason, signal_name))
            reason, signal_name = next((r, s) for r, s in gathered if r is not None)
        stop.request(reason)
        self.state.stop_reason = reason
        self._log("stop_requested", reason=reason, signal=signal_name, epoch=self.state.epoch, step=self.state.step)

    # ----------------------------------------------------------------------------------------
    # Run records

    def _record_interval(self, interval: LogInterval, result: WindowResult, seconds: float, config: TrainConfig) -> None:
        interval.metrics.merge(result.metrics)
        interval.samples += result.samples
        interval.seconds += seconds
        if result.stepped:
            interval.grad_norms.append(result.grad_norm)
        if result.learning_rates:
            self._last_learning_rates = result.learning_rates
        if not (result.stepped and self.state.step % config.log_every == 0):
            return
        metrics = finish_loss_metrics(interval.metrics.compute(self.accelerator), self.objective)
        for index, lr in enumerate(self._last_learning_rates):
            metrics[f"lr/{index}"] = lr
        metrics["grad_norm"] = sum(interval.grad_norms) / len(interval.grad_norms)
        metrics["last_update_samples"] = float(result.samples)
        metrics["samples_per_second"] = interval.samples / interval.seconds if interval.seconds > 0 else 0.0
        self._log(
            "train",
            epoch=self.state.epoch,
            step=self.state.step,
            planned_steps=self.planned_steps(config),
            samples=self.state.samples,
            metrics=metrics,
        )
        interval.metrics.reset()
        interval.grad_norms.clear()
        interval.samples, interval.seconds = 0, 0.0

    def _log_start(self, config: TrainConfig, metadata: Mapping[str, Any], resumed_from: str | None) -> None:
        fields = dict(
            world_size=self.accelerator.num_processes,
            precision=str(self.accelerator.mixed_precision),
            device=str(self.accelerator.device),
            gradient_accumulation_steps=self.accumulation_steps,
            config=config.describe(),
            budget={
                "epochs": config.epochs,
                "max_steps": config.max_steps,
                "planned_steps": self.planned_steps(config),
                "updates_per_epoch": self.updates_per_epoch,
                "batches_per_epoch": self.batches_per_epoch,
            },
            optimizer={
                "class": type(self.optimizer).__name__,
                "groups": [
                    {
                        "name": group.get("name", str(index)),
                        "lr": float(group["lr"]),
                        "weight_decay": float(group.get("weight_decay", 0.0)),
                        "num_parameters": sum(p.numel() for p in group["params"]),
                    }
                    for index, group in enumerate(self.optimizer.param_groups)
                ],
            },
            ema_decay=self.ema.decay if self.ema is not None else None,
            objective=self.objective.describe() if self.objective is not None else None,
            metadata=dict(metadata),
            state=self.state.state_dict(),
        )
        self._last_learning_rates = [float(group["lr"]) for group in self.optimizer.param_groups]
        if resumed_from is None and self.state.batches == 0:
            self._log("started", **fields)
        else:
            self._log("resumed", resumed_from=resumed_from, **fields)

    def _log(self, event: str, **fields: Any) -> None:
        if self.logger is not None:
            self.logger.log({"event": event, **fields})

    def _check_weight_choice(self, weights: str) -> None:
        if weights not in ("raw", "ema"):
            raise ValueError(f"weights is {weights!r}; use 'raw' or 'ema'.")
        if weights == "ema" and self.ema is None:
            raise ValueError(
                "weights='ema' was requested but this trainer keeps no EMA; pass Trainer(..., ema_decay=0.999) "
                "or ask for weights='raw'."
            )


def _monitored_value(results: Mapping[str, Mapping[str, float]], monitor: Monitor) -> float:
    value = results.get(monitor.loader, {}).get(monitor.name)
    if value is None:
        available = sorted(f"{key}/{inner}" for key, values in results.items() for inner in values)
        raise ValueError(
            f"Monitor metric {monitor.metric!r} is not among the evaluation results {available}; name one of them "
            "(an unobserved mean is omitted rather than reported as zero)."
        )
    return value


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


def _model_mismatches(saved: Mapping[str, torch.Tensor], current: Mapping[str, torch.Tensor]) -> list[str]:
    """Differences between a checkpoint's model and this run's, at most a few of each kind."""
    missing = sorted(set(current) - set(saved))
    unexpected = sorted(set(saved) - set(current))
    reshaped = sorted(
        f"{name} {tuple(saved[name].shape)} -> {tuple(current[name].shape)}"
        for name in set(saved) & set(current)
        if saved[name].shape != current[name].shape
    )
    problems = []
    for label, names in (("missing from the checkpoint", missing), ("unknown to this model", unexpected), ("reshaped", reshaped)):
        if names:
            shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            problems.append(f"model parameters {label}: {shown}")
    return problems


def _component_state(component: Any) -> Any:
    if component is None:
        return None
    if isinstance(component, nn.Module):
        return plain_state_dict(component)
    return component.state_dict()
