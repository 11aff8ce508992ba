"""Loop overhead, one process: ``Trainer`` against a hand-written loop doing the same math (and Lightning).

Every variant trains one epoch of the same in-memory data, in the same order, from the same initial
weights, with accumulation 2 and the exact mean over each window's samples, AdamW and gradient clipping,
on one CPU thread. The Trainer's and the hand loop's final weights are compared to show that they did
the same arithmetic. Both read each batch when its step comes; a second hand loop that reads a whole
window first (``tiny`` only) shows what that reading order alone costs, and a second Trainer with
``TrainConfig(model_randomness="per_batch")`` (``tiny`` only) what seeding torch before every microbatch costs.
"""

from __future__ import annotations

import functools
import itertools
import logging
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from elfes.engine import Evaluator, Interval, MeanMetric, StepOutput, TrainConfig, Trainer

from .measure import Progress, Row, interleave, median_difference, median_of, median_ratio, timed

ACCUMULATION = 2
LEARNING_RATE = 1e-3
MAX_GRAD_NORM = 1.0
FEATURES = 64


@dataclass(frozen=True)
class LoopCase:
    name: str
    width: int
    depth: int  # hidden layers
    batch_size: int
    samples: int
    evaluate_every: int | None = None  # steps; evaluation uses the EMA weights when ema_decay is set
    ema_decay: float | None = None
    validation_samples: int = 1024
    repeats: int = 1  # epochs of each variant per round, alternating (a round trains samples x repeats)
    target_over_us: float | None = None  # the most CPU microseconds per microbatch ELFES may add
    target_speed: float | None = None  # the least samples/s ratio ELFES / hand loop
    augment: bool = False  # every sample read with random noise and a random sign flip (global torch generator)
    workers: int = 0  # DataLoader worker processes of both loops

    @property
    def microbatches(self) -> int:
        """Per round: of every epoch of the round together."""
        return -(-self.samples // self.batch_size) * self.repeats

    def describe(self) -> str:
        extras = (f", evaluation every {self.evaluate_every} steps" if self.evaluate_every else "") + (
            f", EMA {self.ema_decay}" if self.ema_decay else "") + (", augmented" if self.augment else "") + (
            f", {self.workers} workers" if self.workers else "")
        return f"{self.depth}x{self.width} MLP, batch {self.batch_size}{extras}"


def cases(smoke: bool) -> list[LoopCase]:
    if smoke:
        # Too short for the targets (an epoch's fixed costs weigh on 32 microbatches): a check that it runs.
        return [LoopCase("tiny", 16, 2, 8, 256), LoopCase("tiny+augment", 16, 2, 8, 256, augment=True),
                LoopCase("tiny+augment+2workers", 16, 2, 8, 256, augment=True, workers=2),
                LoopCase("tiny+eval+ema", 16, 2, 8, 256, 16, 0.999, 64)]
    return [
        LoopCase("tiny", 16, 2, 8, 2048, repeats=4, target_over_us=20),
        # The engine's extra CPU per microbatch with augmentation, against the same case without it.
        LoopCase("tiny+augment", 16, 2, 8, 2048, repeats=4, augment=True),
        LoopCase("tiny+2workers", 16, 2, 8, 2048, repeats=4, workers=2),
        LoopCase("tiny+augment+2workers", 16, 2, 8, 2048, repeats=4, augment=True, workers=2),
        LoopCase("mlp", 512, 4, 64, 4096, repeats=4, target_speed=0.98),
        LoopCase("tiny+eval+ema", 16, 2, 8, 4096, evaluate_every=64, ema_decay=0.999, repeats=2),
    ]


def make_model(case: LoopCase) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(FEATURES, case.width), nn.GELU()]
    for _ in range(case.depth - 1):
        layers += [nn.Linear(case.width, case.width), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(case.width, 1))


def make_data(samples: int, seed: int, augment: bool = False) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    tensors = torch.randn(samples, FEATURES, generator=generator), torch.randn(samples, 1, generator=generator)
    return AugmentedData(*tensors) if augment else TensorDataset(*tensors)


class AugmentedData(TensorDataset):
    """Each sample read with noise and a random sign flip, drawn from the global torch generator as
    torchvision's transforms draw."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = super().__getitem__(index)
        sign = -1.0 if torch.rand(()) < 0.5 else 1.0
        return sign * inputs + 0.1 * torch.randn_like(inputs), targets


def train_loader(case: LoopCase, train: TensorDataset) -> DataLoader:
    return DataLoader(train, batch_size=case.batch_size, num_workers=case.workers)


def step(model: nn.Module, batch: Any) -> StepOutput:
    inputs, targets = batch
    return StepOutput(loss=(model(inputs) - targets).square().mean(), num_samples=len(inputs))


def evaluation_step(model: nn.Module, batch: Any) -> StepOutput:
    inputs, targets = batch
    error = model(inputs) - targets
    return StepOutput(loss=error.square().mean(), num_samples=len(inputs), metrics={"mae": MeanMetric(error.abs().sum(), error.numel())})


# ------------------------------------------------------------------------------------------------
# The variants. Each returns the seconds of one epoch (construction of the trainer excluded).


def hand_epoch(case: LoopCase, model: nn.Module, train: TensorDataset, validation: TensorDataset) -> dict[str, float]:
    """The loop a researcher writes by hand, ``for batch in loader``, with exact accumulation: each
    microbatch's summed loss backward as it comes, the window's gradients divided by its sample count, clip,
    step (and keep an EMA and evaluate it, when the case says so). Like the engine, it reads each batch when
    its step comes, so random draws in the dataset fall between steps as in any plain loop."""
    loader = train_loader(case, train)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    parameters = list(model.parameters())
    average = [p.detach().clone() for p in parameters] if case.ema_decay else None
    last = len(loader) - 1

    def run() -> None:
        model.train()
        updates, evaluated, count = 0, False, 0
        for index, (inputs, targets) in enumerate(loader):
            if index % ACCUMULATION == 0:
                optimizer.zero_grad(set_to_none=True)
                count = 0
            loss = (model(inputs) - targets).square().mean()
            (loss * len(inputs)).backward()
            count += len(inputs)
            if index % ACCUMULATION != ACCUMULATION - 1 and index != last:
                continue
            torch._foreach_div_([p.grad for p in parameters], count)
            torch.nn.utils.clip_grad_norm_(parameters, MAX_GRAD_NORM)
            optimizer.step()
            updates += 1
            if average is not None:
                with torch.no_grad():
                    torch._foreach_lerp_(average, [p.detach() for p in parameters], 1.0 - case.ema_decay)
            evaluated = bool(case.evaluate_every) and updates % case.evaluate_every == 0
            if evaluated:
                hand_evaluate(model, parameters, average, validation)
        if case.evaluate_every and not evaluated:
            hand_evaluate(model, parameters, average, validation)

    return timed(run)


def hand_window_ahead_epoch(case: LoopCase, model: nn.Module, train: TensorDataset, validation: TensorDataset) -> dict[str, float]:
    """The hand loop that reads a whole window before its first forward pass, to weigh each microbatch's
    mean by its share of the window's samples. Cheaper on a CPU (fetches run back to back), but it moves a
    dataset's random draws: the engine cannot read this way and stay exact (``tiny`` only, to show the cost)."""
    loader = train_loader(case, train)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    parameters = list(model.parameters())

    def run() -> None:
        model.train()
        batches = iter(loader)
        while window := list(itertools.islice(batches, ACCUMULATION)):
            optimizer.zero_grad(set_to_none=True)
            total = sum(len(inputs) for inputs, _ in window)
            for inputs, targets in window:
                loss = (model(inputs) - targets).square().mean()
                (loss * (len(inputs) / total)).backward()
            torch.nn.utils.clip_grad_norm_(parameters, MAX_GRAD_NORM)
            optimizer.step()

    return timed(run)


def hand_evaluate(model: nn.Module, parameters: list[nn.Parameter], average: list[torch.Tensor] | None, data: TensorDataset) -> float:
    raw = [p.detach().clone() for p in parameters]
    model.eval()
    total = absolute = count = 0.0
    with torch.no_grad():
        if average is not None:
            torch._foreach_copy_(parameters, average)
        for inputs, targets in DataLoader(data, batch_size=64):
            error = model(inputs) - targets
            total += float(error.square().sum())
            absolute += float(error.abs().sum())
            count += len(inputs)
        torch._foreach_copy_(parameters, raw)
    model.train()
    return total / count


def elfes_epoch(case: LoopCase, model: nn.Module, train: TensorDataset, validation: TensorDataset, *,
                model_randomness: str = "per_rank") -> dict[str, float]:
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=ACCUMULATION)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    evaluator = None
    if case.evaluate_every:
        evaluator = Evaluator(accelerator, {"validation": DataLoader(validation, batch_size=64)}, evaluation_step)
    trainer = Trainer(accelerator, model, optimizer, train_loader(case, train), step,
                      evaluator=evaluator, ema_decay=case.ema_decay)
    evaluate_every = Interval(case.evaluate_every, "step") if case.evaluate_every else None
    config = TrainConfig(epochs=1, max_grad_norm=MAX_GRAD_NORM, evaluate_every=evaluate_every, checkpoint_every=None,
                         model_randomness=model_randomness)
    return timed(lambda: trainer.train(config))


def lightning_epoch(case: LoopCase, model: nn.Module, train: TensorDataset, validation: TensorDataset) -> dict[str, float]:
    """PyTorch Lightning's automatic optimization with the same accumulation, clipping and optimizer."""
    import lightning

    class Module(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def training_step(self, batch: Any, batch_index: int) -> torch.Tensor:
            inputs, targets = batch
            return (self.model(inputs) - targets).square().mean()  # Lightning divides by the accumulation

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=LEARNING_RATE)

    trainer = lightning.Trainer(
        accelerator="cpu", devices=1, max_epochs=1, accumulate_grad_batches=ACCUMULATION, gradient_clip_val=MAX_GRAD_NORM,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )
    module = Module()
    return timed(lambda: trainer.fit(module, train_loader(case, train)))


def lightning_available() -> bool:
    try:
        import lightning  # noqa: F401
    except ImportError:
        return False
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("lightning.fabric").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="lightning")
    return True


# ------------------------------------------------------------------------------------------------


def run(rounds: int, progress: Progress, *, smoke: bool = False) -> list[Row]:
    torch.set_num_threads(1)
    with_lightning = lightning_available()
    rows: list[Row] = []
    for case in cases(smoke):
        finals: dict[str, nn.Module] = {}
        variants = {"hand": _Variant(hand_epoch, "hand", case, finals), "elfes": _Variant(elfes_epoch, "elfes", case, finals)}
        if with_lightning and not case.evaluate_every and not (case.augment or case.workers):
            variants["lightning"] = _Variant(lightning_epoch, "lightning", case, finals)
        if not smoke:  # the hand loop against itself: how far apart identical code lands on this machine
            variants["hand again"] = _Variant(hand_epoch, "hand again", case, finals)
        if not smoke and case.name == "tiny":
            variants["hand ahead"] = _Variant(hand_window_ahead_epoch, "hand ahead", case, finals)
            variants["elfes per batch"] = _Variant(
                functools.partial(elfes_epoch, model_randomness="per_batch"), "elfes per batch", case, finals)
        samples = interleave(variants, rounds, progress, f"loop {case.name}", repeats=case.repeats)
        difference = max((a - b).abs().max().item() for a, b in zip(finals["elfes"].parameters(), finals["hand"].parameters()))
        for name in [name for name in variants if name in ("elfes", "lightning")]:
            rows += _rows(case, samples, name, rounds, difference if name == "elfes" else None)
        if "hand again" in variants:
            rows.append(_noise_row(case, samples, rounds))
        if "hand ahead" in variants:
            rows.append(_reading_order_row(case, samples, rounds))
        if "elfes per batch" in variants:
            rows.append(_keyed_randomness_row(case, samples, rounds))
    if not smoke:
        rows.append(_seeding_row(rows))
    return rows + _augmentation_rows(rows)


def _seeding_row(rows: list[Row]) -> Row:
    """The seeding that ``model_randomness="per_batch"`` adds before each microbatch, timed alone (the loop's
    own row above lies within its noise), against the CPU time of one ``tiny`` microbatch of ELFES."""
    import timeit

    from elfes.engine.resize import BatchKeyedRandomness

    keyed = BatchKeyedRandomness(1234, 0, 1, torch.device("cpu"))
    calls = 20_000
    seconds = min(timeit.repeat(lambda: keyed.seed(3, 17), number=calls, repeat=7))
    microbatch = next(row for row in rows if row.case == "tiny" and row.measure.startswith("ELFES: CPU µs"))
    cost = seconds / calls * 1e6
    return Row("loop", "tiny", "model_randomness='per_batch': CPU µs of its seeding per microbatch, share of a "
               "microbatch", "µs", cost, microbatch.value, "ELFES tiny microbatch", "ratio",
               cost / microbatch.value, rounds=7, details={"seeding_us": cost, "calls_per_round": calls})


def _augmentation_rows(rows: list[Row]) -> list[Row]:
    """ELFES's extra CPU per microbatch with augmentation against the same case without it (target: 10%)."""
    over = {row.case: row for row in rows if row.measure == "ELFES: CPU µs per microbatch over the hand loop"}
    derived = []
    for augmented, plain in (("tiny+augment", "tiny"), ("tiny+augment+2workers", "tiny+2workers")):
        if augmented in over and plain in over:
            ours, theirs = over[augmented].result, over[plain].result
            derived.append(Row(
                "loop", augmented, f"ELFES's extra CPU µs per microbatch, augmented against {plain}", "µs", ours, theirs,
                f"{plain} (no augmentation)", "difference", ours - theirs, target=f"<= {0.1 * abs(theirs):.1f}",
                rounds=over[augmented].rounds,
            ))
    return derived


def _noise_row(case: LoopCase, samples: dict[str, list[dict[str, float]]], rounds: int) -> Row:
    """The same hand loop run twice per round: the spread that any ratio of this case carries."""
    per_microbatch = 1e6 / case.microbatches
    cpu = median_difference(samples, "hand again", "hand", "cpu_s", per_microbatch)
    return Row(
        "loop", case.name, f"noise: the same hand loop twice, samples/s ratio (CPU {cpu:+,.0f} µs per microbatch)", "samples/s",
        case.samples * case.repeats / median_of(samples, "hand again", "wall_s"),
        case.samples * case.repeats / median_of(samples, "hand", "wall_s"), "hand loop",
        "ratio", median_ratio(samples, "hand", "hand again", "wall_s"), rounds=rounds,
        details={"cpu_us_difference": cpu},
    )


def _reading_order_row(case: LoopCase, samples: dict[str, list[dict[str, float]]], rounds: int) -> Row:
    """What reading a whole window before its first forward pass saves a hand loop (an order the engine
    cannot take: it would move a dataset's random draws)."""
    per_microbatch = 1e6 / case.microbatches
    return Row(
        "loop", case.name, "hand loop reading each window ahead: CPU µs per microbatch over the hand loop", "µs",
        median_of(samples, "hand ahead", "cpu_s") * per_microbatch, median_of(samples, "hand", "cpu_s") * per_microbatch,
        "hand loop", "difference", median_difference(samples, "hand ahead", "hand", "cpu_s", per_microbatch), rounds=rounds,
    )


def _keyed_randomness_row(case: LoopCase, samples: dict[str, list[dict[str, float]]], rounds: int) -> Row:
    """What ``TrainConfig(model_randomness="per_batch")`` adds: torch's generator seeded before each microbatch."""
    per_microbatch = 1e6 / case.microbatches
    return Row(
        "loop", case.name, "ELFES with model_randomness='per_batch': CPU µs per microbatch over ELFES", "µs",
        median_of(samples, "elfes per batch", "cpu_s") * per_microbatch, median_of(samples, "elfes", "cpu_s") * per_microbatch,
        "ELFES (per_rank)", "difference", median_difference(samples, "elfes per batch", "elfes", "cpu_s", per_microbatch),
        rounds=rounds,
    )


class _Variant:
    """One variant of a case: a fresh model each call, kept in ``finals`` to compare final weights."""

    def __init__(self, epoch: Any, name: str, case: LoopCase, finals: dict[str, nn.Module]) -> None:
        self.epoch, self.name, self.case, self.finals = epoch, name, case, finals
        self.train, self.validation = make_data(case.samples, seed=1, augment=case.augment), make_data(case.validation_samples, seed=2)

    def __call__(self) -> dict[str, float]:
        self.finals[self.name] = make_model(self.case)
        return self.epoch(self.case, self.finals[self.name], self.train, self.validation)


def _rows(case: LoopCase, samples: dict[str, list[dict[str, float]]], name: str, rounds: int, difference: float | None) -> list[Row]:
    label = "ELFES" if name == "elfes" else "Lightning"
    per_microbatch = 1e6 / case.microbatches
    details: dict[str, Any] = {
        "model": case.describe(), "microbatches_per_round": case.microbatches, "epochs_per_round": case.repeats,
        "accumulation": ACCUMULATION,
        "over_us_wall": median_difference(samples, name, "hand", "wall_s", per_microbatch),
        "hand_samples_per_s": case.samples * case.repeats / median_of(samples, "hand", "wall_s"),
        f"{name}_samples_per_s": case.samples * case.repeats / median_of(samples, name, "wall_s"),
    }
    if difference is not None:
        details["max_parameter_difference_vs_hand"] = difference
    over = Row(
        "loop", case.name, f"{label}: CPU µs per microbatch over the hand loop", "µs",
        median_of(samples, name, "cpu_s") * per_microbatch, median_of(samples, "hand", "cpu_s") * per_microbatch, "hand loop",
        "difference", median_difference(samples, name, "hand", "cpu_s", per_microbatch),
        target=f"<= {case.target_over_us:g}" if case.target_over_us is not None and name == "elfes" else None,
        rounds=rounds, details=details,
    )
    speed = Row(
        "loop", case.name, f"{label}: samples/s, {label} / hand loop", "samples/s",
        details[f"{name}_samples_per_s"], details["hand_samples_per_s"], "hand loop",
        "ratio", median_ratio(samples, "hand", name, "wall_s"),
        target=f">= {case.target_speed:g}" if case.target_speed is not None and name == "elfes" else None, rounds=rounds,
    )
    return [over, speed]
