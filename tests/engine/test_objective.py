"""The Objective path: independently normalised loss terms over the global accumulation window.

Each term's differentiable sum is divided by its own count summed over the whole window (from
``Objective.counts(batch)``), multiplied by its coefficient, and the terms are added. A term nobody
observed contributes nothing; a window nobody labelled is skipped entirely.
"""

from __future__ import annotations

import math

import pytest
import torch
from accelerate import Accelerator
from torch import nn
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader, Dataset
from workloads import events_named, fresh_accelerate, quiet_logger

from elfes.engine import (
    Evaluator,
    MeanMetric,
    Objective,
    StepOutput,
    SumMetric,
    TrainConfig,
    Trainer,
)

QUIET = dict(evaluate_every=None, checkpoint_every=None)
WEIGHTS = {"primary": 1.0, "aux": 0.25}








class MaskedData(Dataset):
    """Samples with a primary target (present where ``primary_mask``) and a rare auxiliary target."""

    def __init__(self, primary_mask: list[bool], aux_mask: list[bool], seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        n = len(primary_mask)
        self.x = torch.randn(n, 2, generator=generator, dtype=torch.float64)
        self.y = torch.randn(n, generator=generator, dtype=torch.float64)
        self.t = torch.randn(n, generator=generator, dtype=torch.float64)
        self.primary_mask = torch.tensor(primary_mask)
        self.aux_mask = torch.tensor(aux_mask)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {
            "x": self.x[index],
            "y": self.y[index],
            "t": self.t[index],
            "primary_mask": self.primary_mask[index],
            "aux_mask": self.aux_mask[index],
        }


class TwoHeads(nn.Module):
    """A shared weight vector w and an auxiliary scale v: primary = x@w, aux = v * (x@w) + c."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor([0.3, -0.7], dtype=torch.float64))
        self.v = nn.Parameter(torch.tensor(1.5, dtype=torch.float64))
        self.c = nn.Parameter(torch.tensor(-0.2, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shared = x @ self.w
        return shared, self.v * shared + self.c


def term_sums(model: nn.Module, batch) -> dict[str, torch.Tensor]:
    """Masked sums by indexing: an empty selection gives a differentiable zero."""
    primary, aux = model(batch["x"])
    pm, am = batch["primary_mask"], batch["aux_mask"]
    return {
        "primary": (primary[pm] - batch["y"][pm]).square().sum(),
        "aux": (aux[am] - batch["t"][am]).abs().sum(),
    }


def multiplied_term_sums(model: nn.Module, batch) -> dict[str, torch.Tensor]:
    """Masked sums by multiplying with the mask: the aux parameters get a (zero) gradient path even
    when no label is present, so an infinite coefficient 1/0 would turn into NaN gradients."""
    primary, aux = model(batch["x"])
    pm, am = batch["primary_mask"].double(), batch["aux_mask"].double()
    return {
        "primary": (pm * (primary - batch["y"]).square()).sum(),
        "aux": (am * (aux - batch["t"]).abs()).sum(),
    }


def objective_step(model: nn.Module, batch) -> StepOutput:
    return StepOutput(loss=term_sums(model, batch), num_samples=len(batch["y"]))


def counts(batch) -> dict[str, torch.Tensor]:
    return {"primary": batch["primary_mask"].sum(), "aux": batch["aux_mask"].sum()}


def _snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _train(data, batch_sampler, accumulation, run_dir, *, optimizer_factory=None, scheduler_factory=None,
           ema_decay=None, step=objective_step, objective=None, epochs=1):
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=accumulation)
    model = TwoHeads()
    optimizer = (optimizer_factory or (lambda m: torch.optim.SGD(m.parameters(), lr=1.0)))(model)
    scheduler = scheduler_factory(optimizer) if scheduler_factory else None
    loader = DataLoader(data, batch_sampler=batch_sampler)
    objective = objective or Objective(WEIGHTS, counts)
    with quiet_logger(run_dir) as logger:
        trainer = Trainer(accelerator, model, optimizer, loader, step, objective=objective,
                          scheduler=scheduler, ema_decay=ema_decay, logger=logger)
        state = trainer.train(TrainConfig(epochs=epochs, log_every=1, **QUIET))
    return trainer, model, optimizer, scheduler, state


def _reference_gradient(data, window: list[list[int]], weights=WEIGHTS):
    """Autograd of sum_t w_t * sum(term_t over the window) / count_t at the initial parameters."""
    model = TwoHeads()
    sums = {name: torch.zeros((), dtype=torch.float64) for name in weights}
    totals = {name: 0.0 for name in weights}
    for indices in window:
        batch = {key: torch.stack([data[i][key] for i in indices]) for key in data[0]}
        for name, value in term_sums(model, batch).items():
            sums[name] = sums[name] + value
        for name, value in counts(batch).items():
            totals[name] += float(value)
    loss = sum(weights[name] * sums[name] / totals[name] for name in weights if totals[name] > 0)
    loss.backward()
    means = {name: float(sums[name].detach()) / totals[name] for name in weights if totals[name] > 0}
    gradient = {
        name: p.grad.clone() if p.grad is not None else torch.zeros_like(p.detach())
        for name, p in model.named_parameters()
    }
    return gradient, _snapshot(model), means, totals


def test_masked_auxiliary_term_is_normalised_by_its_own_global_window_count(tmp_path):
    """Window of three batches (3, 2, 2 samples) whose aux labels are present 1, 0 and 2 times.

    The aux term is divided by 3 (its window count), not by 7 samples or per batch; SGD(lr=1) must
    apply exactly minus the autograd gradient of sum_t w_t * sum(term_t)/count_t.
    """
    primary_mask = [True] * 7
    aux_mask = [False, True, False, False, False, True, True]
    data = MaskedData(primary_mask, aux_mask, seed=1)
    window = [[0, 1, 2], [3, 4], [5, 6]]
    trainer, model, _, _, state = _train(data, window, 3, tmp_path)

    gradient, initial, means, totals = _reference_gradient(data, window)
    assert totals == {"primary": 7.0, "aux": 3.0}
    for name, parameter in model.named_parameters():
        expected = initial[name] - gradient[name]
        assert float((parameter.detach() - expected).abs().max()) <= 1e-12, name

    # A wrong denominator for the aux term (samples instead of labels) gives a different update.
    wrong, _, _, _ = _reference_gradient(data, window, weights={"primary": 1.0, "aux": 0.25 * 3 / 7})
    assert float((wrong["v"] - gradient["v"]).abs()) > 1e-6

    assert state.step == 1 and state.samples == 7
    (train,) = events_named(tmp_path, "train")
    metrics = train["metrics"]
    assert metrics["loss_count/primary"] == 7
    assert metrics["loss_count/aux"] == 3
    assert metrics["loss/primary"] == pytest.approx(means["primary"], abs=1e-12)
    assert metrics["loss/aux"] == pytest.approx(means["aux"], abs=1e-12)
    assert metrics["loss"] == pytest.approx(1.0 * means["primary"] + 0.25 * means["aux"], abs=1e-12)
    assert not any(key.startswith("loss_sum/") for key in metrics)
    assert metrics["last_update_samples"] == 7


@pytest.mark.parametrize("sums", [term_sums, multiplied_term_sums], ids=["indexed", "multiplied"])
def test_globally_absent_term_contributes_no_gradient_and_no_nan(tmp_path, sums):
    """No sample of the window carries an aux label: the aux coefficient is zero, v and c (used only
    by the aux head) stay exactly unchanged, w moves by the primary gradient alone, nothing is NaN."""
    data = MaskedData([True] * 5, [False] * 5, seed=2)
    window = [[0, 1], [2, 3, 4]]

    def step(model, batch):
        return StepOutput(loss=sums(model, batch), num_samples=len(batch["y"]))

    trainer, model, _, _, state = _train(data, window, 2, tmp_path, step=step)

    gradient, initial, means, totals = _reference_gradient(data, window)
    assert totals["aux"] == 0.0
    assert state.step == 1
    for name, parameter in model.named_parameters():
        assert bool(torch.isfinite(parameter).all()), name
    assert torch.equal(model.v.detach(), initial["v"])
    assert torch.equal(model.c.detach(), initial["c"])
    assert float((model.w.detach() - (initial["w"] - gradient["w"])).abs().max()) <= 1e-12
    assert not torch.equal(model.w.detach(), initial["w"])

    (train,) = events_named(tmp_path, "train")
    metrics = train["metrics"]
    assert metrics["loss_count/aux"] == 0
    assert "loss/aux" not in metrics  # unobserved, not a perfect zero
    assert metrics["loss"] == pytest.approx(means["primary"], abs=1e-12)
    assert all(value is not None and math.isfinite(value) for value in metrics.values())


def _all_tensors(model, optimizer, scheduler, trainer) -> dict[str, torch.Tensor]:
    tensors = {f"param/{name}": p.detach().clone() for name, p in model.named_parameters()}
    for index, state in optimizer.state_dict()["state"].items():
        for key, value in state.items():
            tensors[f"optimizer/{index}/{key}"] = torch.as_tensor(value).clone()
    for index, group in enumerate(optimizer.param_groups):
        tensors[f"lr/{index}"] = torch.tensor(float(group["lr"]), dtype=torch.float64)
    tensors["scheduler/last_epoch"] = torch.tensor(scheduler.last_epoch)
    for name, tensor in trainer.ema.state_dict().items():
        tensors[f"ema/{name}"] = tensor.detach().clone()
    return tensors


def test_wholly_unlabelled_window_touches_no_parameter_optimizer_scheduler_or_ema(tmp_path):
    """Run A trains on one labelled window; run B on the same window then a window with no label of
    any term. B's parameters, AdamW state, learning rate, scheduler and EMA equal A's only if the
    second window stepped neither the scheduler nor the EMA (torch optimizers themselves skip
    parameters whose gradient is None, which is what an unlabelled window leaves)."""
    primary_mask = [True, False, True, False, False, False]
    aux_mask = [True, False, False, False, False, False]
    data = MaskedData(primary_mask, aux_mask, seed=3)

    def adamw(model):
        return torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.5, betas=(0.8, 0.9))

    def scheduler(optimizer):
        return LambdaLR(optimizer, lambda step: 0.5 ** step)

    a = _train(data, [[0, 1], [2]], 2, tmp_path / "a", optimizer_factory=adamw, scheduler_factory=scheduler, ema_decay=0.5)
    trainer_a, model_a, optimizer_a, scheduler_a, state_a = a
    tensors_a = _all_tensors(model_a, optimizer_a, scheduler_a, trainer_a)

    fresh_accelerate()
    b = _train(data, [[0, 1], [2], [3, 4], [5]], 2, tmp_path / "b", optimizer_factory=adamw, scheduler_factory=scheduler, ema_decay=0.5)
    trainer_b, model_b, optimizer_b, scheduler_b, state_b = b
    tensors_b = _all_tensors(model_b, optimizer_b, scheduler_b, trainer_b)

    assert tensors_a.keys() == tensors_b.keys()
    assert any("exp_avg" in name for name in tensors_a)
    different = [name for name in tensors_a if not torch.equal(tensors_a[name], tensors_b[name])]
    assert not different, different
    assert state_a.step == state_b.step == 1
    assert state_b.samples == state_a.samples + 3
    assert state_b.batches == state_a.batches + 2
    (skipped,) = events_named(tmp_path / "b", "skipped")
    assert skipped["reason"] == "unlabelled_window"
    assert skipped["step"] == 1
    # and the labelled window did train (the comparison above is not vacuous)
    assert not torch.equal(model_a.w.detach(), TwoHeads().w.detach())


# ------------------------------------------------------------------------------------------------
# Reserved names and malformed outputs


def _one_batch_trainer(step, objective=None):
    data = MaskedData([True, True], [True, False], seed=4)
    accelerator = Accelerator(cpu=True)
    model = TwoHeads()
    loader = DataLoader(data, batch_size=2)
    return Trainer(accelerator, model, torch.optim.SGD(model.parameters(), lr=0.1), loader, step, objective=objective)


def _scalar_step_with_metric(name):
    def step(model, batch):
        primary, _ = model(batch["x"])
        error = primary - batch["y"]
        return StepOutput(loss=error.square().mean(), num_samples=len(error),
                          metrics={name: MeanMetric(error.abs().sum(), error.numel())})
    return step


@pytest.mark.parametrize("name", ["loss", "loss/x", "loss_count/x", "loss_sum/x"])
def test_reserved_metric_names_are_refused_on_the_scalar_path(name):
    trainer = _one_batch_trainer(_scalar_step_with_metric(name))
    with pytest.raises(ValueError, match=f"Step metric '{name}' uses a reserved name"):
        trainer.train(TrainConfig(epochs=1, **QUIET))


@pytest.mark.parametrize("name", ["loss", "loss/primary", "loss_count/aux", "loss_sum/x", "aux", "primary"])
def test_reserved_metric_names_are_refused_on_the_objective_path(name):
    def step(model, batch):
        return StepOutput(loss=term_sums(model, batch), num_samples=len(batch["y"]),
                          metrics={name: SumMetric(1.0)})

    trainer = _one_batch_trainer(step, Objective(WEIGHTS, counts))
    with pytest.raises(ValueError, match=f"Step metric '{name}' uses a reserved name"):
        trainer.train(TrainConfig(epochs=1, **QUIET))


def test_ordinary_metric_names_are_accepted(tmp_path):
    """The reserved-name check must not refuse ordinary names that merely resemble loss names."""
    step = _scalar_step_with_metric("losses")
    data = MaskedData([True, True], [True, False], seed=4)
    accelerator = Accelerator(cpu=True)
    model = TwoHeads()
    with quiet_logger(tmp_path) as logger:
        trainer = Trainer(accelerator, model, torch.optim.SGD(model.parameters(), lr=0.1),
                          DataLoader(data, batch_size=2), step, logger=logger)
        trainer.train(TrainConfig(epochs=1, log_every=1, **QUIET))
    (train,) = events_named(tmp_path, "train")
    assert "losses" in train["metrics"] and "loss" in train["metrics"]


@pytest.mark.parametrize("name", ["a/b", "/aux", "", "loss/"])
def test_objective_term_names_with_a_slash_or_empty_are_refused(name):
    with pytest.raises(ValueError, match="Objective term name"):
        Objective({"primary": 1.0, name: 0.5}, counts)


def test_objective_weights_must_be_finite_and_nonempty():
    with pytest.raises(ValueError, match="empty"):
        Objective({}, counts)
    with pytest.raises(ValueError, match="weight of 'aux'"):
        Objective({"primary": 1.0, "aux": math.nan}, counts)
    with pytest.raises(TypeError, match="weight of 'aux'"):
        Objective({"primary": 1.0, "aux": "0.5"}, counts)


@pytest.mark.parametrize(
    ("bad_counts", "message"),
    [
        (lambda batch: {"primary": batch["primary_mask"].sum()}, "exactly the terms"),
        (lambda batch: {**counts(batch), "extra": 1}, "exactly the terms"),
        (lambda batch: {"primary": batch["primary_mask"].sum(), "aux": -1}, "nonnegative"),
        (lambda batch: {"primary": math.inf, "aux": 1}, "finite"),
        (lambda batch: {"primary": 2, "aux": torch.tensor(1.0, requires_grad=True)}, "requires grad"),
    ],
    ids=["missing", "extra", "negative", "infinite", "requires_grad"],
)
def test_invalid_counts_are_refused(bad_counts, message):
    trainer = _one_batch_trainer(objective_step, Objective(WEIGHTS, bad_counts))
    before = _snapshot(trainer.module)
    with pytest.raises(ValueError, match=message):
        trainer.train(TrainConfig(epochs=1, **QUIET))
    after = _snapshot(trainer.module)
    assert all(torch.equal(before[name], after[name]) for name in before)


def test_mapping_loss_without_objective_is_refused():
    # A type mismatch: the engine raises TypeError (the brief expected ValueError; either is "clear").
    trainer = _one_batch_trainer(objective_step)
    with pytest.raises(TypeError, match="no Objective"):
        trainer.train(TrainConfig(epochs=1, **QUIET))


def test_scalar_loss_with_objective_is_refused():
    trainer = _one_batch_trainer(_scalar_step_with_metric("mae"), Objective(WEIGHTS, counts))
    with pytest.raises(TypeError, match="single loss tensor"):
        trainer.train(TrainConfig(epochs=1, **QUIET))


def test_loss_terms_must_match_the_objective():
    def step(model, batch):
        return StepOutput(loss={"primary": term_sums(model, batch)["primary"]}, num_samples=2)

    trainer = _one_batch_trainer(step, Objective(WEIGHTS, counts))
    with pytest.raises(ValueError, match="declares"):
        trainer.train(TrainConfig(epochs=1, **QUIET))


# ------------------------------------------------------------------------------------------------
# Evaluation with an objective


def test_evaluator_reports_zero_counts_and_omits_unobserved_means():
    data = MaskedData([True, True, True], [False, False, False], seed=5)
    accelerator = Accelerator(cpu=True)
    objective = Objective(WEIGHTS, counts)
    evaluator = Evaluator(accelerator, {"val": DataLoader(data, batch_size=2)}, objective_step, objective=objective)
    model = TwoHeads()
    results = evaluator.evaluate(model)["val"]

    assert results["loss_count/aux"] == 0
    assert "loss/aux" not in results
    assert results["loss_count/primary"] == 3
    with torch.no_grad():
        primary, _ = model(data.x)
        expected = float((primary - data.y).square().mean())
    assert results["loss/primary"] == pytest.approx(expected, abs=1e-12)
    assert results["loss"] == pytest.approx(expected, abs=1e-12)
    assert not any(key.startswith("loss_sum/") for key in results)


def test_evaluator_normalises_each_term_by_its_own_count_over_all_batches():
    """Aux labels in 1 of the first batch's 2 samples and 2 of the second's 2: mean over 3 labels."""
    data = MaskedData([True] * 4, [True, False, True, True], seed=6)
    accelerator = Accelerator(cpu=True)
    objective = Objective(WEIGHTS, counts)
    evaluator = Evaluator(accelerator, {"val": DataLoader(data, batch_size=2)}, objective_step, objective=objective)
    model = TwoHeads()
    results = evaluator.evaluate(model)["val"]
    with torch.no_grad():
        primary, aux = model(data.x)
        primary_mean = float((primary - data.y).square().mean())
        aux_mean = float((aux - data.t)[data.aux_mask].abs().mean())
    assert results["loss_count/aux"] == 3
    assert results["loss/aux"] == pytest.approx(aux_mean, abs=1e-12)
    assert results["loss"] == pytest.approx(primary_mean + 0.25 * aux_mean, abs=1e-12)
