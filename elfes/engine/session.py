"""One ``Trainer.train`` call: its config, checkpoint folder, stop request, clock, and the boundary policy.

The trainer's loop asks a :class:`TrainingSession` small questions (is the budget spent, is an
evaluation due) and tells it what happened at each window boundary (close it, pause, finish). The
session evaluates, updates the monitor, saves, restores and writes the run records, through the
parts of the trainer it is handed when the call begins.
"""

from __future__ import annotations

import functools
import time
import uuid
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from torch.optim import Optimizer
from torch.optim.lr_scheduler import ReduceLROnPlateau

from elfes.contract import EARLY_STOPPING, CheckpointName, EventKind, Phase, Pointer, SaveReason, WarningKind
from elfes.records import RunLogger
from elfes.refusals import ConfigurationError

from .checkpoint import CheckpointDirectory, Weights, resume_source
from .checkpointer import Checkpointer
from .collectives import every_rank_value, main_process_value, sum_over_ranks
from .config import Interval, Progress, TrainConfig, TrainState
from .events import Budget, LogInterval, PhaseClock, RunSetup, describe_run, epoch_number
from .loss import LossPath
from .monitor import missing_metric_message, monitored_value, restore_monitor, snapshot_monitor, update_monitor
from .publish import BackgroundWriter, HostBuffers, publish
from .resize import resize_warning
from .resumption import check_schedule_horizons, checkpoint_dir_problem, repair_pointers
from .stop import StopRequest, decisive_reason
from .window import Scheduler, UpdateRule, WindowResult


class TrainingSession:
    """What belongs to one ``train`` call; the trainer keeps what survives it (state, progress, weights).

    ``state``, ``progress`` and ``log_interval`` are the trainer's own, changed in place. ``evaluate`` is
    None without an evaluator; it is called with ``weights=evaluation_weights``.
    """

    def __init__(
        self, config: TrainConfig, budget: Budget, setup: RunSetup, *,
        state: TrainState, progress: Progress, log_interval: LogInterval,
        accelerator: Accelerator, optimizer: Optimizer, scheduler: Scheduler | None, loss: LossPath, checkpointer: Checkpointer,
        logger: RunLogger | None, evaluate: Callable[..., dict[str, dict[str, float]]] | None, evaluation_weights: Weights,
        checkpoint_dir: Path | None, stop: StopRequest | None,
    ) -> None:
        self.config, self.budget, self.setup = config, budget, setup
        self.state, self.progress, self.log_interval = state, progress, log_interval
        self.accelerator, self.optimizer, self.scheduler, self.loss = accelerator, optimizer, scheduler, loss
        self.checkpointer, self.logger = checkpointer, logger
        self.evaluate, self.evaluation_weights = evaluate, evaluation_weights
        self.directory = CheckpointDirectory(Path(checkpoint_dir)) if checkpoint_dir is not None else None
        self.stop = stop if stop is not None else StopRequest()
        self.clock = PhaseClock()
        self.rule = UpdateRule(
            max_grad_norm=config.max_grad_norm,
            step_scheduler=config.scheduler_interval == "step" and not isinstance(scheduler, ReduceLROnPlateau),
        )
        self.saved: CheckpointName | None = None  # the position this call last published
        self.restored: tuple[Path, dict[str, Any], dict[str, Any]] | None = None  # file, state, progress
        self.resized: str | None = None  # what a continuation on another world size changes
        self.writer = BackgroundWriter()  # writes asynchronous checkpoints (main process)
        self.host_buffers = HostBuffers()  # what their snapshots copy into, freed when the call ends
        self.world_size = accelerator.num_processes
        self._stop_announced = False

    # Start -------------------------------------------------------------------------------------

    def start(self, resume_from: Path | None, metadata: Mapping[str, Any]) -> None:
        """Check the checkpoint folder, restore or seed the run, and log ``started`` or ``resumed``."""
        if self.directory is not None:
            fresh = resume_from is None and self.state.batches == 0
            problem = checkpoint_dir_problem(self.directory, fresh=fresh) if self.accelerator.is_main_process else None
            self._agree_on_error(problem)
        resumed_from = None
        if resume_from is not None:
            resumed_from = self._restore(Path(resume_from))
        elif self.progress.data_seed is None:
            seed = (int(torch.randint(0, 2**62, ()).item()), uuid.uuid4().hex)
            self.progress.data_seed, self.progress.run_id = main_process_value(seed, self.accelerator)
        budget = self.budget
        past_budget = self.state.step > budget.planned_steps or self.state.epoch > budget.epochs
        if past_budget:
            warnings.warn(
                f"The run is already at step {self.state.step} (epoch {self.state.epoch}), past the "
                f"{budget.planned_steps} steps ({budget.epochs} epochs) this TrainConfig allows: nothing is trained. "
                "Raise epochs or max_steps to continue it.",
                stacklevel=4,
            )
        self._log_start(metadata, resumed_from, past_budget)
        if self.resized is not None:
            self.warn(WarningKind.WORLD_SIZE_CHANGED, self.resized)
        self.state.stop_reason = None
        if not self.budget_spent():
            self._forget_unscheduled_final_evaluation()

    def _agree_on_error(self, message: str | None) -> None:
        """Raise ``message`` (the main process's finding) on every rank, so that no rank waits alone."""
        message = main_process_value(message, self.accelerator)
        if message is not None:
            raise ConfigurationError(message)

    def _restore(self, source: Path) -> str:
        source, fallback = resume_source(source)
        if fallback is not None:
            warnings.warn(fallback, stacklevel=4)
        payload = self.checkpointer.restore(source)
        resolved = source.resolve()
        self.restored = (resolved, payload["state"], payload["progress"])
        self.resized = resize_warning(payload["layout"], self.checkpointer.layout(), self.config.model_randomness)
        check_schedule_horizons(self.scheduler, self.budget, self.config.scheduler_interval, resolved)
        if self.directory is not None and self.accelerator.is_main_process:
            repair_pointers(self.directory, resolved, self._best_file())
        return str(resolved)

    def _best_file(self) -> Path | None:
        name = self.progress.best_checkpoint
        return self.directory.path / name if name and self.directory is not None else None

    def stop_already_requested(self) -> bool:
        """Whether any rank's stop was requested before training began (one small collective)."""
        flag = torch.tensor(1.0 if self.stop.reason is not None else 0.0, dtype=torch.float64, device=self.accelerator.device)
        return bool(sum_over_ranks(flag, self.accelerator) > 0)

    # Policy ------------------------------------------------------------------------------------

    def budget_spent(self) -> bool:
        return self.budget.spent(self.state)

    def evaluation_due(self, result: WindowResult, epoch_ended: bool) -> bool:
        every = self.config.evaluate_every
        return self.evaluate is not None and every is not None and self._due(every, result, epoch_ended)

    def checkpoint_due(self, result: WindowResult, epoch_ended: bool) -> bool:
        every = self.config.checkpoint_every
        return every is not None and self._due(every, result, epoch_ended)

    def _due(self, every: Interval, result: WindowResult, epoch_ended: bool) -> bool:
        return every.due(step=self.state.step, epoch=self.state.epoch, stepped=result.stepped, epoch_ended=epoch_ended)

    def patience_exhausted(self) -> bool:
        monitor = self.config.monitor
        exhausted = bool(monitor and monitor.patience and self.state.evaluations_without_improvement >= monitor.patience)
        if exhausted:
            self.state.stop_reason = EARLY_STOPPING
        return exhausted

    def position(self) -> list[int]:
        return [self.state.step, self.state.batches]

    # Windows and boundaries --------------------------------------------------------------------

    def announce_stop(self) -> None:
        """Log ``stop_signal`` once, as soon as a stop request is seen (between microbatches, or at the pause)."""
        if self.stop.reason is not None and not self._stop_announced:
            self._stop_announced = True
            self.log(EventKind.STOP_SIGNAL, signal=self.stop.signal, reason=self.stop.reason, **self._where())

    def advance(self, result: WindowResult, seconds: float) -> bool:
        """Move the data position past the window and record it; returns whether the epoch ended."""
        state = self.state
        self.clock.train_s += seconds
        if result.weight_total > 0:
            self.progress.weight_reference = result.weight_total
        state.next_batch += result.batches // self.world_size
        state.batches += result.batches
        state.samples += result.samples
        if result.stepped:
            state.step += 1
        else:
            self.log(EventKind.SKIPPED, reason=result.skip_reason, **self._where())
        per_epoch = self.budget.batches_per_epoch
        epoch_ended = result.stream_ended or (per_epoch is not None and state.next_batch >= per_epoch)
        if epoch_ended:
            self._next_epoch()
        self._record_interval(result, seconds)
        return epoch_ended

    def end_stream_epoch(self) -> tuple[bool, bool]:
        """Begin the next epoch after a stream without ``__len__`` ended at a window boundary; returns
        whether an evaluation and a checkpoint are due at this epoch end."""
        if self.accelerator.num_processes > 1:
            raise RuntimeError(
                f"Rank {self.accelerator.process_index}'s training stream ended after {self.state.next_batch} batches "
                f"of epoch {self.state.epoch}. With several ranks an epoch of a stream must have a known length: give "
                "each rank's dataset a __len__ with the same number of batches (or a stream that outlasts max_steps)."
            )
        self._next_epoch()
        due = functools.partial(Interval.due, step=self.state.step, epoch=self.state.epoch, stepped=False, epoch_ended=True)
        evaluate = self.evaluate is not None and self.config.evaluate_every is not None and due(self.config.evaluate_every)
        checkpoint = self.config.checkpoint_every is not None and due(self.config.checkpoint_every)
        return evaluate, checkpoint

    def _next_epoch(self) -> None:
        self.state.epoch += 1
        self.state.next_batch = 0
        scheduler = self.scheduler
        if scheduler is not None and self.config.scheduler_interval == "epoch" and not isinstance(scheduler, ReduceLROnPlateau):
            scheduler.step()

    def close_boundary(self, *, evaluate: bool, checkpoint: bool) -> bool:
        """Evaluate and checkpoint as this window boundary requires; returns whether to stop early."""
        self.collect_write(wait=False)
        early_stop, improved = False, None
        if evaluate:
            early_stop, improved = self._evaluate_and_monitor(checkpoint_due=checkpoint)
        if early_stop:
            self.state.stop_reason = EARLY_STOPPING
        if self.directory is not None and (checkpoint or improved):
            self.save(reason=SaveReason.INTERVAL if checkpoint else SaveReason.BEST, best=bool(improved))
        return early_stop

    def finish_deferred_boundary(self) -> bool:
        deferred, self.progress.deferred_boundary = self.progress.deferred_boundary, None
        if deferred is None:
            return False
        return self.close_boundary(evaluate=deferred["evaluate"], checkpoint=deferred["checkpoint"])

    def pause(self, *, evaluate: bool = False, checkpoint: bool = False) -> TrainState:
        """Save ``last`` at once and return. An evaluation due here runs first thing after the resume,
        so a job within its preemption grace period is not killed while evaluating."""
        self.announce_stop()
        reason, signal_name = decisive_reason(every_rank_value((self.stop.reason, self.stop.signal), self.accelerator))
        self.stop.request(reason)
        self.state.stop_reason = reason
        self.log(EventKind.STOP_REQUESTED, reason=reason, signal=signal_name, **self._where())
        if evaluate:
            self.progress.deferred_boundary = {"evaluate": True, "checkpoint": checkpoint}
        if self.directory is not None:
            self.save(reason=SaveReason.STOP)
        self.log(EventKind.STOPPED, reason=reason, signal=signal_name, state=self.state.state_dict(), **self.clock.totals())
        return self.state

    def finish(self) -> TrainState:
        """A normal end (budget spent or early stop): evaluate this position unless done, save ``final``.

        That evaluation is not one the schedule asked for: what it did to the monitor and a plateau
        scheduler is remembered so that raising the budget later continues like the straight run.
        """
        improved = None
        if self.evaluate is not None and self.progress.last_evaluation != self.position():
            self.progress.before_final_evaluation = snapshot_monitor(self.state, self.progress, self.scheduler, self.optimizer)
            _, improved = self._evaluate_and_monitor(checkpoint_due=False)
        if self.directory is not None:
            self.save(reason=SaveReason.FINAL, best=bool(improved), final=True)
        self.log(EventKind.FINISHED, state=self.state.state_dict(), **self.clock.totals())
        return self.state

    def log_failure(self, error: BaseException) -> None:
        message = str(error) or repr(error)
        self.log(EventKind.FAILED, exception=type(error).__name__, message=message, **self._where())

    # Evaluation and the monitor ----------------------------------------------------------------

    def _evaluate_and_monitor(self, *, checkpoint_due: bool) -> tuple[bool, bool | None]:
        """Evaluate (EMA weights when EMA is on) and update the monitor.

        Returns whether to stop early and whether the monitored metric improved (None without a monitor).
        """
        state, weights, evaluate = self.state, self.evaluation_weights, self.evaluate
        assert evaluate is not None  # a boundary evaluates only with an evaluator (evaluation_due, finish)
        started = time.perf_counter()
        results = evaluate(weights=weights, heartbeat=self.stop.heartbeat)
        duration = time.perf_counter() - started
        self.clock.evaluation_s += duration
        self.progress.last_evaluation = self.position()
        self.saved = None  # the monitor and progress changed: a checkpoint of this position is now stale
        monitor, improved, stop_early = self.config.monitor, None, False
        if monitor is not None:
            value = monitored_value(results, monitor)
            if value is None:
                if checkpoint_due and self.directory is not None:
                    self.save(reason=SaveReason.INTERVAL)  # keep the work of this boundary before refusing
                raise ValueError(missing_metric_message(results, monitor))
            improved, stop_early = update_monitor(monitor, value, state, self.progress, self.scheduler, self.checkpointer.sharded)
        self.log(EventKind.EVALUATION, **self._where(), weights=weights, metrics=results, duration_s=duration,
                 monitor=monitor.metric if monitor else None, improved=improved, best_metric=state.best_metric,
                 best_step=state.best_step)
        return stop_early, improved

    def _forget_unscheduled_final_evaluation(self) -> None:
        """Undo what a finished run's end-of-budget evaluation did to the monitor, plateau scheduler
        and learning rates, now that a larger budget continues the run past that point."""
        snapshot, self.progress.before_final_evaluation = self.progress.before_final_evaluation, None
        if snapshot is None:
            return
        restore_monitor(snapshot, self.state, self.progress, self.scheduler, self.optimizer)
        best = self._best_file()
        if self.accelerator.is_main_process and best is not None and best.exists() and self.directory is not None:
            self.directory.point(Pointer.BEST, best)

    # Checkpoints -------------------------------------------------------------------------------

    def save(self, *, reason: str, best: bool = False, final: bool = False) -> None:
        """Publish this position's checkpoint: in the background for interval and best checkpoints when
        ``async_checkpoints`` (the loop waits only for the previous write and the snapshot), else now."""
        state, directory = self.state, self.directory
        assert directory is not None  # every caller saves only into a checkpoint folder
        started = time.perf_counter()
        self.stop.heartbeat.beat(Phase.CHECKPOINTING)
        waited = self.collect_write(wait=True)
        name = CheckpointName(state.step, state.batches, self.checkpointer.sharded)
        asynchronous = self.config.async_checkpoints and reason in (SaveReason.INTERVAL, SaveReason.BEST)
        snapshot = self.host_buffers.snapshot() if asynchronous else None
        pending = self.checkpointer.snapshot(
            directory, name, reuse=self._already_published(directory, name), run_id=self.progress.run_id, copy=snapshot
        )
        best_file = self._best_file()
        publication = functools.partial(
            publish, pending, best=best, final=final, keep=self.config.keep_checkpoints, protect=(best_file,) if best_file else ()
        )
        self.saved = name
        record = dict(path=str(pending.path), **self._where(), next_batch=state.next_batch, reason=reason, best=best,
                      final=final, asynchronous=asynchronous, waited_s=waited)
        if snapshot is not None:  # asynchronous
            snapshot.wait()
            blocked = time.perf_counter() - started
            if pending.main or pending.every_rank_writes:
                self.writer.start(publication, {**record, "blocked_s": blocked})
        else:
            writing = time.perf_counter()
            _, size = publication()
            self.accelerator.wait_for_everyone()
            blocked = time.perf_counter() - started
            self.log(EventKind.CHECKPOINT, **record, bytes=size, duration_s=time.perf_counter() - writing, blocked_s=blocked)
        self.clock.checkpoint_s += blocked
        self.stop.heartbeat.beat(Phase.BOUNDARY)

    def collect_write(self, *, wait: bool) -> float:
        """Record the background write once it ended (waiting for it when ``wait``), or raise its failure; seconds waited."""
        if not self.writer.busy or not (wait or self.writer.finished()):
            return 0.0
        started = time.perf_counter()
        record, _, size, duration = self.writer.collect()
        waited = time.perf_counter() - started
        self.log(EventKind.CHECKPOINT, **record, bytes=size, duration_s=duration)
        return waited

    def _already_published(self, directory: CheckpointDirectory, name: CheckpointName) -> bool:
        """Whether this position's file already holds exactly this state: written earlier in this call
        (an interval save before the final one), or the checkpoint this call resumed from, unchanged since."""
        path = directory.file(name)
        if name == self.saved and path.exists():
            return True
        if self.restored is None or not path.exists() or path.resolve() != self.restored[0]:
            return False
        return self.restored[1:] == (self.state.state_dict(), self.progress.state_dict())

    # Run records -------------------------------------------------------------------------------

    def warn(self, kind: WarningKind, message: str) -> None:
        """Warn the user of what the run cannot do exactly or cheaply (main process), and record it as a
        ``warning`` event, which ``elfes status`` shows until the run starts again."""
        if self.accelerator.is_main_process:
            warnings.warn(message, stacklevel=2)
        self.log(EventKind.WARNING, kind=kind, message=message, **self._where())

    def log(self, event: EventKind, **fields: Any) -> None:
        if self.logger is not None:
            self.logger.log({"event": event, **fields})

    def _where(self) -> dict[str, int]:
        return {"epoch": epoch_number(self.state), "step": self.state.step}

    def _record_interval(self, result: WindowResult, seconds: float) -> None:
        interval = self.log_interval
        interval.add(result.metrics, result.samples, seconds, result.grad_norm if result.stepped else None, result.learning_rates)
        if not (result.stepped and self.state.step % self.config.log_every == 0):
            return
        if self.logger is None and self.world_size == 1:  # a train event nobody receives (no rank waits for it)
            interval.reset()
            return
        metrics = self.loss.finish(interval.metrics.compute(self.accelerator))
        metrics.update(interval.summary(self.optimizer.param_groups))
        metrics["last_update_samples"] = float(result.samples)
        self.log(EventKind.TRAIN, **self._where(), planned_steps=self.budget.planned_steps, samples=self.state.samples, metrics=metrics)
        interval.reset()

    def _log_start(self, metadata: Mapping[str, Any], resumed_from: str | None, past_budget: bool) -> None:
        fields = describe_run(self.setup, self.config, self.budget, self.optimizer, metadata, run_id=self.progress.run_id)
        fields.update(epoch=epoch_number(self.state), state=self.state.state_dict())
        if resumed_from is None and self.state.batches == 0:
            self.log(EventKind.STARTED, **fields)
        else:
            self.log(EventKind.RESUMED, resumed_from=resumed_from, past_budget=past_budget, **fields)
