"""The training loop: one explicit loop that decides when to update, evaluate, checkpoint and stop.

For each accumulation window the loop runs the microbatches (:mod:`.window`), and then, at that
boundary, maybe logs, maybe evaluates, maybe checkpoints, and maybe stops (:mod:`.session`).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterator, Mapping
from contextlib import closing
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau
from torch.utils.data import DataLoader

from elfes.contract import EventKind, Phase
from elfes.records import RunLogger
from elfes.refusals import ConfigurationError, ConfigurationTypeError

from .checkpoint import Weights
from .checkpointer import CheckpointContents, Checkpointer, FileCheckpointer
from .components import (
    Component,
    DataPosition,
    Generators,
    LogStatistics,
    ModelWeights,
    SharedComponent,
    TrainingPosition,
)
from .config import Progress, TrainConfig, TrainState, planned_steps
from .data import TrainingData, check_process_group
from .ema import ExponentialMovingAverage
from .evaluator import Evaluator
from .events import Budget, LogInterval, RunSetup
from .fsdp import checkpoint_group, full_state_dict, is_sharded, mesh_shape
from .heartbeat import Heartbeat
from .loss import loss_path
from .objective import Objective, Step
from .process_group import hold_process_group, release_process_groups
from .resize import BatchKeyedRandomness
from .rng import RandomState
from .session import TrainingSession
from .stop import StopRequest
from .weights import plain_state_dict, save_state_dict
from .window import Scheduler, WindowRunner


class Trainer:
    """Trains ``model`` with exact accumulation windows, evaluation, checkpoints and resumable stops.

    The trainer prepares the model and the training DataLoader with ``accelerator``; pass them
    unprepared. A model sharded with FSDP2's ``fully_shard`` is used as it is (never wrapped in DDP) and
    checkpointed in shards. ``accelerator.gradient_accumulation_steps`` sets the window length. Every rank
    constructs the trainer and calls :meth:`train` with the same arguments.

    >>> trainer = Trainer(accelerator, model, optimizer, train_loader, step,  # doctest: +SKIP
    ...                   evaluator=evaluator, ema_decay=0.999, logger=logger)
    >>> state = trainer.train(TrainConfig(epochs=10), checkpoint_dir=run_dir / "checkpoints")  # doctest: +SKIP
    """

    def __init__(
        self,
        accelerator: Accelerator,
        model: nn.Module,
        optimizer: Optimizer,
        train_dataloader: DataLoader[Any],
        step: Step,
        *,
        evaluator: Evaluator | None = None,
        objective: Objective | None = None,
        scheduler: Scheduler | None = None,
        ema_decay: float | None = None,
        logger: RunLogger | None = None,
    ) -> None:
        check_process_group(accelerator)
        self.sharded = is_sharded(model)
        _check_sharding(accelerator, self.sharded)
        self.accelerator = accelerator
        self.optimizer = optimizer
        self.evaluator = evaluator
        self.objective = objective
        self.loss = loss_path(objective, accelerator.device)
        self.logger = logger
        # A sharded model's checkpoints are written on a process group of their own (see .sharded).
        self._checkpoint_group = checkpoint_group() if self.sharded else None
        self.model = model if self.sharded else accelerator.prepare_model(model)
        # Python, not the DDP wrapper's Reducer, frees the process group (see .process_group).
        release_process_groups()
        hold_process_group(self.model)
        # The plain module owns the parameter names used in checkpoints and exports.
        self.module = accelerator.unwrap_model(self.model, keep_fp32_wrapper=True, keep_torch_compile=False)
        self.data = TrainingData(accelerator, train_dataloader)
        self.train_dataloader = self.data.prepared
        self.batches_per_epoch = self.data.batches_per_epoch  # None: a stream whose epoch ends with it
        self.accumulation_steps = accelerator.gradient_accumulation_steps
        self.updates_per_epoch = (
            None if self.batches_per_epoch is None else math.ceil(self.batches_per_epoch / self.accumulation_steps)
        )
        self.ema = ExponentialMovingAverage(self.module, ema_decay) if ema_decay is not None else None
        self.state = TrainState()
        self.progress = Progress()
        self.rng = RandomState()
        self.log_interval = LogInterval([float(group["lr"]) for group in optimizer.param_groups], accelerator.device)
        self.runner = WindowRunner(accelerator, self.model, optimizer, step, self.loss, self.ema, scheduler, self.batches_per_epoch)
        self.scheduler = scheduler

    # The step function and scheduler may be replaced after construction (e.g. a scheduler built
    # from planned_steps); the window runner always uses the current ones.
    @property
    def step(self) -> Step:
        return self.runner.step

    @step.setter
    def step(self, step: Step) -> None:
        self.runner.step = step

    @property
    def scheduler(self) -> Scheduler | None:
        return self.runner.scheduler

    @scheduler.setter
    def scheduler(self, scheduler: Scheduler | None) -> None:
        self.runner.scheduler = scheduler

    def checkpoint_components(self) -> tuple[Component, ...]:
        """Everything that must survive a restart, each a named component of every checkpoint: the one list (a new
        part goes here, with a component that says how it continues on another world size: :mod:`.components`)."""
        return (
            ModelWeights("model", self.module),
            SharedComponent("ema", self.ema),
            SharedComponent("optimizer", self.optimizer),
            SharedComponent("scheduler", self.scheduler),
            SharedComponent("scaler", self.accelerator.scaler),
            TrainingPosition("state", self.state),
            SharedComponent("progress", self.progress),
            Generators("rng", self.rng),
            LogStatistics("log_interval", self.log_interval),
            DataPosition("data", self.data),
        )

    @property
    def checkpointer(self) -> Checkpointer:
        """Saves and restores :meth:`checkpoint_components`: in shards for a sharded model, else in one file."""
        contents = CheckpointContents(self.accelerator, self.checkpoint_components(), self._layout)
        if self.sharded:  # DCP, imported by a sharded model's run alone
            from .sharded import ShardedCheckpointer
            return ShardedCheckpointer(contents, self._checkpoint_group)
        return FileCheckpointer(contents)

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
        ``state.stop_reason`` set (a stop requested before the call saves at once, training nothing);
        a normal end evaluates (unless this position was just evaluated) and saves ``final``.
        ``resume_from`` names a checkpoint or pointer; a ``last`` that a kill left missing resumes from
        the newest complete checkpoint of its folder, with a warning. An exception is recorded as a
        ``failed`` event, then raised. Call on every rank.
        """
        self._check_setup(config)
        run = self._session(config, checkpoint_dir, stop)
        try:
            run.start(resume_from, metadata or {})
            for kind, message in self.data.setup_warnings:
                run.warn(kind, message)
            run.stop.heartbeat.started(self.state.step)
            state = self._loop(run)  # its stop and final saves collect any write in flight
            run.stop.heartbeat.beat(Phase.ENDED)
            return state
        except BaseException as error:
            try:  # never leave with a checkpoint write in flight
                run.collect_write(wait=True)
            except Exception as failure:
                if hasattr(error, "add_note"):  # Python >= 3.11
                    error.add_note(f"The checkpoint write in flight failed too: {failure}")
            if isinstance(error, (Exception, KeyboardInterrupt)):
                run.log_failure(error)
            raise

    def _session(self, config: TrainConfig, checkpoint_dir: Path | None, stop: StopRequest | None) -> TrainingSession:
        """One call's session, handed the parts of the trainer it drives as they are now (the user may
        have replaced the scheduler or logger since construction)."""
        budget = Budget(config.epochs, config.max_steps, self.planned_steps(config), self.updates_per_epoch, self.batches_per_epoch)
        self.progress.model_randomness = config.model_randomness  # recorded in checkpoints; a restore checks it
        setup = RunSetup(
            world_size=self.accelerator.num_processes,
            precision=str(self.accelerator.mixed_precision),
            device=str(self.accelerator.device),
            gradient_accumulation_steps=self.accumulation_steps,
            ema_decay=self.ema.decay if self.ema is not None else None,
            objective=self.loss.describe(),
            per_rank_data=self.data.per_rank_position(),
        )
        return TrainingSession(
            config, budget, setup,
            state=self.state, progress=self.progress, log_interval=self.log_interval,
            accelerator=self.accelerator, optimizer=self.optimizer, scheduler=self.scheduler, loss=self.loss,
            checkpointer=self.checkpointer, logger=self.logger,
            evaluate=self.evaluate if self.evaluator is not None else None,
            evaluation_weights="ema" if self.ema is not None else "raw",
            checkpoint_dir=checkpoint_dir, stop=stop,
        )

    def _loop(self, run: TrainingSession) -> TrainState:
        if run.stop_already_requested():
            return run.pause()
        self.model.train()
        self.runner.keyed_randomness = None
        assert self.progress.data_seed is not None  # drawn, or restored, by run.start
        if run.config.model_randomness == "per_batch":
            self.runner.keyed_randomness = BatchKeyedRandomness(
                self.progress.data_seed, self.accelerator.process_index, self.accelerator.num_processes,
                self.accelerator.device)
        early_stop = run.finish_deferred_boundary() or run.patience_exhausted()
        while not early_stop and not run.budget_spent():
            epoch = self.data.batches(self.state.epoch, self.state.next_batch, self.progress.data_seed, run.warn)
            with closing(epoch) as batches:
                epoch_ended, opening = False, True
                while not (epoch_ended or early_stop or run.budget_spent()):
                    started = time.perf_counter()
                    if opening:  # a fresh iterator: its workers start, its first fetch; maybe a compilation
                        run.stop.heartbeat.beat_first(Phase.TRAINING)
                        opening = False
                    else:
                        run.stop.heartbeat.beat(Phase.TRAINING)
                    window, size = self._next_window(batches)
                    if window is None:  # a stream without __len__ ended at this boundary: so does its epoch
                        evaluate, checkpoint = run.end_stream_epoch()
                        early_stop = run.close_boundary(evaluate=evaluate, checkpoint=checkpoint)
                        break
                    result = self.runner.run(
                        window, size, run.stop, self.state, self.progress.weight_reference, run.rule, run.announce_stop
                    )
                    if self.state.next_batch + size == self.batches_per_epoch:  # never for a stream without __len__
                        self.data.end_epoch(batches, self.state.epoch)  # as `for` ends an epoch, before its boundary
                    epoch_ended = run.advance(result, time.perf_counter() - started)
                    run.stop.heartbeat.reached(self.state.step)

                    evaluate = run.evaluation_due(result, epoch_ended)
                    checkpoint = run.checkpoint_due(result, epoch_ended)
                    if result.stop_requested:
                        return run.pause(evaluate=evaluate, checkpoint=checkpoint)
                    early_stop = run.close_boundary(evaluate=evaluate, checkpoint=checkpoint)
        return run.finish()

    def _next_window(self, batches: Iterator[Any]) -> tuple[Iterator[Any] | None, int]:
        """The next window's batches and its length; (None, 0) where a stream of unknown length has ended.

        A window of known length is cut from ``batches`` as it is consumed; one of a stream without
        ``__len__`` reads its first batch here (the batch it would read first anyway) to know it exists.
        """
        if self.batches_per_epoch is not None:
            size = min(self.accumulation_steps, self.batches_per_epoch - self.state.next_batch)
            return itertools.islice(batches, size), size
        first = next(batches, _STREAM_END)
        if first is _STREAM_END:
            return None, 0
        return itertools.chain([first], itertools.islice(batches, self.accumulation_steps - 1)), self.accumulation_steps

    def evaluate(self, *, weights: Weights = "raw", heartbeat: Heartbeat | None = None) -> dict[str, dict[str, float]]:
        """Evaluate the raw or EMA weights with the trainer's evaluator. Call on every rank.
        ``heartbeat`` (the training call's) gets a beat per evaluation batch.

        >>> trainer.evaluate(weights="ema")["validation"]["loss"]  # doctest: +SKIP
        """
        if self.evaluator is None:
            raise ValueError("Trainer.evaluate() needs an evaluator; pass Trainer(..., evaluator=Evaluator(...)).")
        ema = self._check_weight_choice(weights)
        if ema is not None:
            with ema.swapped_in():
                return self.evaluator.evaluate(self.model, heartbeat=heartbeat)
        return self.evaluator.evaluate(self.model, heartbeat=heartbeat)

    def save_model(self, path: Path, *, weights: Weights = "raw") -> None:
        """Write the raw or EMA weights as a plain state dict (no DDP or compile prefixes).

        Call on every rank; the main process writes.

        >>> trainer.save_model(run_dir / "model.pt", weights="ema")  # doctest: +SKIP
        """
        ema = self._check_weight_choice(weights)
        average = ema.state_dict() if ema is not None else None
        if self.sharded:  # every rank sends its shards; the main process holds the whole
            state = full_state_dict(self.module, average, self.accelerator.is_main_process)
        else:
            state = plain_state_dict(self.module)
            state.update({name: tensor.detach().cpu().clone() for name, tensor in (average or {}).items()})
        if self.accelerator.is_main_process:
            save_state_dict(state, Path(path))
        self.accelerator.wait_for_everyone()
        if self.logger is not None:
            self.logger.log({"event": EventKind.EXPORT, "weights": weights, "path": str(path)})

    # ----------------------------------------------------------------------------------------
    # Checks

    def _layout(self) -> dict[str, Any]:
        """What a checkpoint must share with the run that resumes it."""
        return {
            "world_size": self.accelerator.num_processes,
            "sharding": mesh_shape(self.module) if self.sharded else None,
            "gradient_accumulation_steps": self.accumulation_steps,
            "batches_per_epoch": self.batches_per_epoch,
            "mixed_precision": str(self.accelerator.mixed_precision),
            "objective": self.loss.describe(),
            "ema_decay": self.ema.decay if self.ema is not None else None,
            "optimizer": type(self.optimizer).__name__,
            "optimizer_groups": [[list(p.shape) for p in group["params"]] for group in self.optimizer.param_groups],
            "scheduler": type(self.scheduler).__name__ if self.scheduler is not None else None,
            "torch_threads": torch.get_num_threads(),
        }

    def _check_setup(self, config: TrainConfig) -> None:
        if not isinstance(config, TrainConfig):
            raise ConfigurationTypeError(f"Trainer.train(config) needs a TrainConfig; got {type(config).__name__}.")
        monitor = config.monitor
        if monitor is not None and self.evaluator is None:
            raise ConfigurationError(
                f"TrainConfig.monitor watches {monitor.metric!r} but the trainer has no evaluator; pass "
                "Trainer(..., evaluator=Evaluator(...)) or remove the monitor."
            )
        if monitor is not None and config.evaluate_every is None:
            raise ConfigurationError(
                "TrainConfig.monitor needs periodic evaluation but evaluate_every is None; set "
                "evaluate_every=Interval(...) or remove the monitor."
            )
        if monitor is not None and self.evaluator is not None and monitor.loader not in self.evaluator.dataloaders:
            raise ConfigurationError(
                f"TrainConfig.monitor watches {monitor.metric!r}, but the evaluator has no loader named "
                f"{monitor.loader!r} (it has {sorted(self.evaluator.dataloaders)}); name one of those loaders."
            )
        if isinstance(self.scheduler, ReduceLROnPlateau) and monitor is None:
            raise ConfigurationError(
                "ReduceLROnPlateau steps on the monitored metric, but TrainConfig.monitor is None; set "
                "monitor=Monitor('<loader>/<metric>') (and mode to match the scheduler's mode)."
            )
        if isinstance(self.scheduler, ReduceLROnPlateau) and monitor is not None and self.scheduler.mode != monitor.mode:
            raise ConfigurationError(
                f"ReduceLROnPlateau(mode={self.scheduler.mode!r}) would read {monitor.metric!r} the opposite "
                f"way from Monitor(mode={monitor.mode!r}); give both the same mode."
            )
        if self.scheduler is not None and not isinstance(self.scheduler, (LRScheduler, ReduceLROnPlateau)):
            raise ConfigurationTypeError(f"Trainer.scheduler is a {type(self.scheduler).__name__}; use a torch LR scheduler.")

    def _check_weight_choice(self, weights: str) -> ExponentialMovingAverage | None:
        """Refuse a choice of weights this trainer cannot give; returns the EMA that ``weights`` asks for (None: raw)."""
        if weights not in ("raw", "ema"):
            raise ConfigurationError(f"weights is {weights!r}; use 'raw' or 'ema'.")
        if weights == "ema" and self.ema is None:
            raise ConfigurationError(
                "weights='ema' was requested but this trainer keeps no EMA; pass Trainer(..., ema_decay=0.999) "
                "or ask for weights='raw'."
            )
        return self.ema if weights == "ema" else None


def _check_sharding(accelerator: Accelerator, sharded: bool) -> None:
    """Refuse Accelerate's own FSDP (one way to shard: the job's ``fully_shard``) and Accelerate's autocast on a
    sharded model (FSDP2 casts by its own policy; a loss scaler would see only this rank's shards)."""
    if accelerator.distributed_type == DistributedType.FSDP:
        raise ConfigurationError(
            "The Accelerator was built with an FSDP plugin; ELFES trains a model sharded by the job itself. Build "
            "Accelerator() without fsdp_plugin (and without ACCELERATE_USE_FSDP), then shard before Trainer(...): "
            "mesh = init_device_mesh(device_type, (world_size,)); fully_shard(block, mesh=mesh) for each block, "
            "then fully_shard(model, mesh=mesh); build the optimizer over model.parameters()."
        )
    if sharded and str(accelerator.mixed_precision) != "no":
        raise ConfigurationError(
            f"Accelerator(mixed_precision={str(accelerator.mixed_precision)!r}) with a model sharded by fully_shard: "
            "Accelerate's autocast and loss scaler do not apply to it. Use Accelerator(mixed_precision='no') and give "
            "fully_shard(..., mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16)) instead."
        )


_STREAM_END = object()
