"""Small real training workloads shared by the engine tests and their torchrun scripts.

A :class:`RunSpec` names every knob; :func:`build` turns it into a ready trainer and config, on
one process or under torchrun. :func:`snapshot` collects every tensor that must match bitwise
after a resume: raw and EMA weights, optimizer state, scheduler and scaler state.
"""

from __future__ import annotations

import io
import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.state import AcceleratorState, GradientState
from accelerate.utils import set_seed
from rich.console import Console
from torch import nn
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader, Dataset

from elfes.engine import (
    Evaluator,
    Interval,
    MaxMetric,
    MeanMetric,
    Monitor,
    Objective,
    RunLogger,
    StepOutput,
    StopRequest,
    TrainConfig,
    Trainer,
    WarmupDecay,
    weight_decay_groups,
)
from elfes.engine.publish import BackgroundWriter
from elfes.records import read_events


def fresh_accelerate() -> None:
    """Forget accelerate's process-wide singletons before building another Accelerator in one process."""
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def quiet_logger(run_dir: Path, *, is_main_process: bool = True) -> RunLogger:
    """A real RunLogger whose console output goes nowhere."""
    return RunLogger(run_dir, is_main_process=is_main_process, console=Console(file=io.StringIO()))


def events_named(run_dir: Path, name: str) -> list[dict]:
    return [event for event in read_events(run_dir) if event["event"] == name]


class RegressionData(Dataset):
    """A deterministic map-style regression dataset that counts its reads (per process)."""

    def __init__(self, samples: int, features: int = 4, seed: int = 0, dtype: torch.dtype = torch.float32, augment: bool = False) -> None:
        self.augment = augment  # noise drawn from the process's torch generator at each read
        generator = torch.Generator().manual_seed(seed)
        self.inputs = torch.randn(samples, features, generator=generator, dtype=torch.float64).to(dtype)
        weights = torch.linspace(-1.0, 1.0, features, dtype=torch.float64).unsqueeze(1)
        self.targets = (self.inputs.double() @ weights + 0.1 * torch.randn(samples, 1, generator=generator, dtype=torch.float64)).to(dtype)
        self.reads: list[int] = []

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.reads.append(int(index))
        if self.augment:
            return self.inputs[index] + 0.01 * torch.randn(self.inputs.shape[1], dtype=self.inputs.dtype), self.targets[index]
        return self.inputs[index], self.targets[index]


class DropoutMLP(nn.Module):
    def __init__(self, features: int = 4, hidden: int = 16, dropout: float = 0.2) -> None:
        super().__init__()
        self.hidden = nn.Linear(features, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.dropout = nn.Dropout(dropout)
        self.output = nn.Linear(hidden, 1)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.output(self.dropout(torch.tanh(self.norm(self.hidden(inputs)))))


def auxiliary_mask(inputs: torch.Tensor) -> torch.Tensor:
    """Which samples carry the auxiliary label: a data property, so counts need no model."""
    return inputs[:, 0] > 0.5


def two_term_step(model: nn.Module, batch: Any) -> StepOutput:
    """An Objective step: squared-error sums of a primary term and a sparsely labelled auxiliary one."""
    inputs, targets = batch
    prediction = model(inputs)
    mask = auxiliary_mask(inputs)
    return StepOutput(
        loss={
            "primary": (prediction - targets).square().sum(),
            "auxiliary": (prediction[mask] - 2 * targets[mask]).square().sum(),
        },
        num_samples=len(inputs),
    )


TWO_TERMS = Objective(
    weights={"primary": 1.0, "auxiliary": 0.5},
    counts=lambda batch: {"primary": batch[1].numel(), "auxiliary": auxiliary_mask(batch[0]).sum()},
)


def mse_step(model: nn.Module, batch: Any) -> StepOutput:
    inputs, targets = batch
    error = model(inputs) - targets
    return StepOutput(
        loss=error.square().mean(),
        num_samples=len(inputs),
        metrics={"mae": MeanMetric(error.abs().sum(), error.numel()), "max_error": MaxMetric(error.abs().max())},
    )


@dataclass(frozen=True)
class RunSpec:
    """Every knob of a test run; two runs with equal specs must end bitwise equal."""

    samples: int = 38  # 10 batches of 4 with a short last batch of 2
    batch_size: int = 4
    accumulation: int = 3  # windows of 3, 3, 3, 1 batches per epoch on one rank
    epochs: int = 2
    max_steps: int | None = None
    shuffle: bool = True
    num_workers: int = 0
    worker_start: str | None = None  # the DataLoader's multiprocessing_context: "fork" (None), "forkserver", "spawn"
    dropout: float = 0.2
    ema_decay: float | None = 0.9
    optimizer: str = "adamw"  # "adamw" | "adamw_fused" | "adam_fused" | "sgd"
    learning_rate: float = 0.05
    warmup: bool = True
    evaluate: bool = True
    evaluate_every: Interval | None = Interval(2, "step")
    checkpoint_every: Interval | None = Interval(1, "epoch")
    monitor: bool = True
    max_grad_norm: float | None = 1.0
    mixed_precision: str = "no"
    cpu: bool = True
    dtype: str = "float32"
    seed: int = 1234
    log_every: int = 1
    keep_checkpoints: int | None = None
    objective: bool = False  # train TWO_TERMS with two_term_step instead of the mean squared error
    async_checkpoints: bool = False
    shard: tuple[int, ...] | None = None  # a device mesh shape: the model sharded with FSDP2's fully_shard over it
    augment: bool = False  # random noise drawn in the training dataset
    validation_samples: int = 13

    def with_(self, **changes: Any) -> RunSpec:
        return replace(self, **changes)


@dataclass
class Run:
    spec: RunSpec
    accelerator: Accelerator
    trainer: Trainer
    config: TrainConfig
    train_data: RegressionData
    extras: dict[str, Any] = field(default_factory=dict)


def build(spec: RunSpec, *, logger: Any | None = None) -> Run:
    """A fresh accelerator, model, optimizer, loaders, trainer and config for ``spec``."""
    accelerator = Accelerator(
        cpu=spec.cpu,
        mixed_precision=spec.mixed_precision,
        gradient_accumulation_steps=spec.accumulation,
        dataloader_config=DataLoaderConfiguration(even_batches=False),
    )
    set_seed(spec.seed)
    dtype = getattr(torch, spec.dtype)
    model = DropoutMLP(dropout=spec.dropout).to(dtype)
    if spec.shard is not None:
        shard(model, spec.shard)
    groups = weight_decay_groups(model, 0.01)
    if spec.optimizer == "adamw":
        optimizer = torch.optim.AdamW(groups, lr=spec.learning_rate)
    elif spec.optimizer == "adam_fused":
        optimizer = torch.optim.Adam(groups, lr=spec.learning_rate, fused=True)
    elif spec.optimizer == "adamw_fused":
        optimizer = torch.optim.AdamW(groups, lr=spec.learning_rate, fused=True)
    elif spec.optimizer == "sgd":
        optimizer = torch.optim.SGD(groups, lr=spec.learning_rate, momentum=0.9)
    else:
        raise ValueError(spec.optimizer)
    train_data = RegressionData(spec.samples, seed=1, dtype=dtype, augment=spec.augment)
    train_loader = DataLoader(train_data, batch_size=spec.batch_size, shuffle=spec.shuffle, num_workers=spec.num_workers,
                              multiprocessing_context=spec.worker_start if spec.num_workers else None)
    evaluator = None
    step, objective = (two_term_step, TWO_TERMS) if spec.objective else (mse_step, None)
    if spec.evaluate:
        validation = DataLoader(RegressionData(spec.validation_samples, seed=2, dtype=dtype), batch_size=4)
        evaluator = Evaluator(accelerator, {"validation": validation}, step, objective=objective)
    trainer = Trainer(
        accelerator, model, optimizer, train_loader, step,
        evaluator=evaluator, objective=objective, ema_decay=spec.ema_decay, logger=logger,
    )
    config = TrainConfig(
        epochs=spec.epochs,
        max_steps=spec.max_steps,
        log_every=spec.log_every,
        evaluate_every=spec.evaluate_every if spec.evaluate else None,
        checkpoint_every=spec.checkpoint_every,
        keep_checkpoints=spec.keep_checkpoints,
        max_grad_norm=spec.max_grad_norm,
        monitor=Monitor("validation/loss") if spec.evaluate and spec.monitor else None,
        async_checkpoints=spec.async_checkpoints,
    )
    if spec.warmup:
        total = trainer.planned_steps(config)
        trainer.scheduler = LambdaLR(optimizer, WarmupDecay(total_steps=total, warmup_steps=max(total // 4, 1), start_factor=0.1, minimum_factor=0.05))
    return Run(spec, accelerator, trainer, config, train_data)


def shard(model: nn.Module, mesh_shape: tuple[int, ...]) -> None:
    """Shard ``model`` with FSDP2 as a job does: each block, then the root (a 2-D mesh: HSDP)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    names = ("replicate", "shard") if len(mesh_shape) == 2 else ("shard",)
    mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
    for block in (model.hidden, model.output):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


def _whole(tensor: Any) -> torch.Tensor:
    """A tensor on the CPU, a sharded one gathered whole (every rank must call this for it)."""
    from torch.distributed.tensor import DTensor

    tensor = torch.as_tensor(tensor) if not isinstance(tensor, torch.Tensor) else tensor
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach().cpu().clone()


def snapshot(trainer: Trainer) -> dict[str, torch.Tensor]:
    """Every tensor that a bitwise resume must reproduce, by a readable name, on the CPU (a sharded model's
    gathered whole: call on every rank)."""
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in trainer.module.state_dict().items():
        tensors[f"raw/{name}"] = _whole(tensor)
    if trainer.ema is not None:
        for name, tensor in trainer.ema.state_dict().items():
            tensors[f"ema/{name}"] = _whole(tensor)
    optimizer_state = trainer.optimizer.state_dict()
    for index, state in optimizer_state["state"].items():
        for key, value in state.items():
            tensors[f"optimizer/{index}/{key}"] = _whole(value)
    for index, group in enumerate(optimizer_state["param_groups"]):
        tensors[f"optimizer/group{index}/lr"] = torch.tensor(float(group["lr"]), dtype=torch.float64)
    if trainer.scheduler is not None:
        tensors["scheduler/last_epoch"] = torch.tensor(getattr(trainer.scheduler, "last_epoch", -1))
    scaler = trainer.accelerator.scaler
    if scaler is not None:
        tensors["scaler/scale"] = torch.tensor(float(scaler.get_scale()), dtype=torch.float64)
    return tensors


def assert_bitwise_equal(expected: dict[str, torch.Tensor], actual: dict[str, torch.Tensor], context: str = "") -> None:
    assert expected.keys() == actual.keys(), f"{context}: tensors differ in names: {sorted(expected.keys() ^ actual.keys())}"
    different = [name for name in expected if not torch.equal(expected[name], actual[name])]
    assert not different, f"{context}: not bitwise equal: {different}"


def save_snapshot(trainer: Trainer, path: Path) -> None:
    torch.save(snapshot(trainer), path)


def windows_per_epoch(spec: RunSpec, world_size: int = 1) -> int:
    batches = math.ceil(spec.samples / spec.batch_size) // world_size
    return math.ceil(batches / spec.accumulation)


class StopInWindow:
    """A step that requests a stop during a chosen microbatch (counting training microbatches from 1)."""

    def __init__(self, stop: StopRequest, at_call: int, action=None) -> None:
        self.stop, self.at_call, self.calls = stop, at_call, 0
        self.action = action or (lambda: self.stop.request("test pause"))

    def __call__(self, model, batch):
        self.calls += 1
        if self.calls == self.at_call:
            self.action()
        return mse_step(model, batch)


def first_call_of_window(spec: RunSpec, window: int) -> int:
    """The 1-based microbatch index that opens ``window`` (counted over epochs) on one rank."""
    batches = -(-spec.samples // spec.batch_size)
    per_epoch = windows_per_epoch(spec)
    epoch, index = divmod(window, per_epoch)
    return epoch * batches + index * spec.accumulation + 1


def pause_and_resume(spec: RunSpec, directory: Path, pause_calls: list[int]):
    """Run with a pause at each of ``pause_calls`` (one per launch), resuming from ``last`` each time."""
    resume_from = None
    for at_call in pause_calls:
        fresh_accelerate()
        run = build(spec)
        stop = StopRequest()
        run.trainer.step = StopInWindow(stop, at_call)  # calls are counted from this launch's start
        state = run.trainer.train(run.config, checkpoint_dir=directory, resume_from=resume_from, stop=stop)
        assert state.stop_reason == "test pause"
        assert stop.reason == "test pause"
        assert (directory / "last").is_symlink()
        resume_from = directory / "last"
    fresh_accelerate()
    run = build(spec)
    state = run.trainer.train(run.config, checkpoint_dir=directory, resume_from=resume_from)
    assert state.stop_reason is None
    return run, state


def gloo_threads() -> list[str]:
    """Names of this process's gloo threads (the transport loop and the process group's workers)."""
    names = []
    for task in Path("/proc/self/task").iterdir():
        try:
            names.append((task / "comm").read_text().strip())
        except OSError:  # the thread ended meanwhile
            continue
    return sorted(name for name in names if "gloo" in name)


def gloo_threads_left(timeout_s: float = 10.0) -> list[str]:
    """The gloo threads still listed once the ones already joined have finished exiting (up to ``timeout_s``).

    The kernel wakes ``pthread_join`` before it removes the ending thread from ``/proc/self/task``, so a
    thread joined by the group's teardown can be listed for a moment after the teardown returned."""
    deadline = time.monotonic() + timeout_s
    while (left := gloo_threads()) and time.monotonic() < deadline:
        time.sleep(0.01)  # polling interval
    return left


WRITER_THREAD = "elfes-checkpoint-writer"


def writer_threads() -> list[threading.Thread]:
    """The background checkpoint writers still running in this process."""
    return [thread for thread in threading.enumerate() if thread.name == WRITER_THREAD and thread.is_alive()]


@dataclass
class HeldWrites:
    """What :func:`held_background_writes` saw: microbatches trained, and how each write was released."""

    microbatches: int = 0
    trained_over: int = 0  # writes that began serialising only after training had changed the live tensors
    waited_for: int = 0  # writes still held when the loop came to wait for them
    serialised: int = 0  # torch.save calls into a stream (checkpoint files), in any thread
    job: dict[str, Any] = field(default_factory=dict)


@contextmanager
def held_background_writes(trainer: Trainer, *, until: str) -> Iterator[HeldWrites]:
    """Hold each background checkpoint write before it serialises anything.

    ``until="microbatch"`` releases it once the loop has trained a microbatch after the snapshot (or
    waits for the write, at the end of a run): writing and training overlap. ``until="wait"`` holds it
    until the loop waits for it, at the next checkpoint boundary, stop or error: a write stays in
    flight through a whole window, whose update changes every live tensor (weights, EMA, optimizer
    state, RNG, position), so a payload that is not a copy of the boundary's shows it.
    """
    held, condition = HeldWrites(), threading.Condition()
    original_step, original_start, original_collect, original_save = trainer.step, BackgroundWriter.start, BackgroundWriter.collect, torch.save

    def step(model, batch):
        with condition:
            held.microbatches += 1
            condition.notify_all()
        return original_step(model, batch)

    def start(writer, publication, record):
        with condition:
            held.job = {"microbatches": held.microbatches, "waited": False}
        original_start(writer, publication, record)

    def collect(writer):
        with condition:
            held.job["waited"] = True
            condition.notify_all()
        return original_collect(writer)

    def save(obj, stream, *args, **kwargs):
        held.serialised += not isinstance(stream, (str, Path))
        if threading.current_thread().name == WRITER_THREAD:
            with condition:
                job = held.job
                condition.wait_for(lambda: job["waited"] or (until == "microbatch" and held.microbatches > job["microbatches"]))
                held.trained_over += held.microbatches > job["microbatches"]
                held.waited_for += job["waited"]
        return original_save(obj, stream, *args, **kwargs)

    trainer.step = step
    BackgroundWriter.start, BackgroundWriter.collect, torch.save = start, collect, save
    try:
        yield held
    finally:
        trainer.step = original_step
        BackgroundWriter.start, BackgroundWriter.collect, torch.save = original_start, original_collect, original_save
