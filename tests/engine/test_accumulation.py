"""Exact gradient accumulation: an update optimises the declared mean over the samples it consumed.

The window's loss is sum_b(weight_b * mean_b) / sum_b(weight_b) over the batches of the window, with
weight_b the batch's sample count (or its explicit ``loss_weight``); incomplete tail windows use their
own actual total. A mean of the per-batch means (what many trainers do) is a different objective.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset
from workloads import events_named, fresh_accelerate, quiet_logger

from elfes.engine import StepOutput, TrainConfig, Trainer

QUIET = dict(evaluate_every=None, checkpoint_every=None)








class ScalarWeight(nn.Module):
    """One scalar parameter w; the per-sample (or per-token) loss is v + w * g."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros((), dtype=torch.float64))


def linear_step(model: nn.Module, batch) -> StepOutput:
    v, g = batch
    return StepOutput(loss=(v + model.w * g).mean(), num_samples=len(v))


# ------------------------------------------------------------------------------------------------
# The hand example of the training-loop notes (003, section 3)


def test_hand_example_003_window_of_3_and_1_samples_with_mean_losses_2_and_6_has_loss_3_not_4(tmp_path):
    """003 section 3: a window of two batches with 3 and 1 samples and mean losses 2 and 6.

    The window loss is (3*2 + 1*6) / 4 = 3; the mean of the two means would be 4. The gradients must
    be weighted 3/4 and 1/4 as well: with per-sample loss v_i + w*g_i, g = [1,1,1] and [5], the
    window gradient is (3*1 + 1*5)/4 = 2, so SGD(lr=1) from w=0 lands on exactly -2.0 (the
    mean-of-means gradient (1 + 5)/2 = 3 would give -3).
    """
    v = torch.tensor([2.0, 2.0, 2.0, 6.0], dtype=torch.float64)
    g = torch.tensor([1.0, 1.0, 1.0, 5.0], dtype=torch.float64)
    loader = DataLoader(TensorDataset(v, g), batch_sampler=[[0, 1, 2], [3]])
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = ScalarWeight()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0, momentum=0.0)
    with quiet_logger(tmp_path) as logger:
        trainer = Trainer(accelerator, model, optimizer, loader, linear_step, logger=logger)
        state = trainer.train(TrainConfig(epochs=1, log_every=1, **QUIET))

    assert model.w.item() == -2.0
    assert state.step == 1 and state.batches == 2 and state.samples == 4
    (train,) = events_named(tmp_path, "train")
    assert train["metrics"]["loss"] == 3.0
    assert train["metrics"]["last_update_samples"] == 4
    assert train["metrics"]["grad_norm"] == 2.0  # the window-mean gradient, not the sum (8) or mean of means (3)


class TokenData(Dataset):
    """Samples of variable token counts; a batch concatenates its samples' tokens."""

    def __init__(self, tokens: list[tuple[list[float], list[float]]]) -> None:
        self.tokens = tokens

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int):
        v, g = self.tokens[index]
        return torch.tensor(v, dtype=torch.float64), torch.tensor(g, dtype=torch.float64)


def concatenate_tokens(samples):
    return (
        torch.cat([v for v, _ in samples]),
        torch.cat([g for _, g in samples]),
        len(samples),
    )


def token_step(model: nn.Module, batch) -> StepOutput:
    v, g, num_samples = batch
    per_token = v + model.w * g
    return StepOutput(loss=per_token.mean(), num_samples=num_samples, loss_weight=v.numel())


def test_token_weighted_window_uses_loss_weight_not_sample_count(tmp_path):
    """Batch A: 2 samples with 1 and 2 tokens, per-token loss 2; batch B: 1 sample, 1 token, loss 6.

    Token-weighted window loss (3*2 + 1*6)/4 = 3; sample-weighted would be (2*2 + 1*6)/3 = 10/3 and
    the mean of means 4. Gradient: per-token g = 1 in A and 5 in B → (3*1 + 5)/4 = 2 (sample-weighted
    (2*1 + 5)/3 = 7/3, mean of means 3).
    """
    data = TokenData([([2.0], [1.0]), ([2.0, 2.0], [1.0, 1.0]), ([6.0], [5.0])])
    loader = DataLoader(data, batch_sampler=[[0, 1], [2]], collate_fn=concatenate_tokens)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = ScalarWeight()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    with quiet_logger(tmp_path) as logger:
        trainer = Trainer(accelerator, model, optimizer, loader, token_step, logger=logger)
        state = trainer.train(TrainConfig(epochs=1, log_every=1, **QUIET))

    assert model.w.item() == -2.0
    (train,) = events_named(tmp_path, "train")
    assert train["metrics"]["loss"] == 3.0
    assert train["metrics"]["loss"] != pytest.approx(10.0 / 3.0)
    # samples still count samples, not tokens
    assert train["metrics"]["last_update_samples"] == 3
    assert state.samples == 3


def test_a_batch_without_tokens_contributes_nothing_and_an_all_empty_window_is_skipped(tmp_path):
    """A batch with loss_weight 0 has a NaN mean over nothing; it must not poison the window, and a
    window whose total weight is zero is skipped like an unlabelled one."""
    data = TokenData([([2.0], [1.0]), ([], []), ([6.0], [5.0]), ([], []), ([], [])])
    loader = DataLoader(data, batch_sampler=[[0], [1], [2], [3], [4]], collate_fn=concatenate_tokens)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=3)
    model = ScalarWeight()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    with quiet_logger(tmp_path) as logger:
        trainer = Trainer(accelerator, model, optimizer, loader, token_step, logger=logger)
        state = trainer.train(TrainConfig(epochs=1, log_every=1, **QUIET))
    assert model.w.item() == -3.0  # (1*1 + 1*5) / 2 tokens; the empty batch adds neither loss nor weight
    (train,) = events_named(tmp_path, "train")
    assert train["metrics"]["loss"] == 4.0
    (skipped,) = events_named(tmp_path, "skipped")
    assert skipped["reason"] == "unlabelled_window"
    assert state.step == 1 and state.samples == 5


# ------------------------------------------------------------------------------------------------
# Accumulation over k microbatches equals one batch of their union


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(7)
        self.hidden = nn.Linear(3, 5).double()
        self.output = nn.Linear(5, 1).double()
        with torch.no_grad():
            for parameter in self.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator, dtype=torch.float64) * 0.5)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.output(torch.tanh(self.hidden(inputs)))


def mse_step(model: nn.Module, batch) -> StepOutput:
    inputs, targets = batch
    return StepOutput(loss=(model(inputs) - targets).square().mean(), num_samples=len(inputs))


def _regression_data(samples: int = 18) -> TensorDataset:
    generator = torch.Generator().manual_seed(3)
    inputs = torch.randn(samples, 3, generator=generator, dtype=torch.float64)
    # Targets far from the initial predictions and different per sample: the batch means differ.
    targets = (inputs.sum(1, keepdim=True) * 2.0 + torch.arange(samples, dtype=torch.float64).unsqueeze(1) * 0.3)
    return TensorDataset(inputs, targets)


def _adamw(model: nn.Module) -> torch.optim.AdamW:
    return torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.01)


def _train(loader: DataLoader, accumulation: int, run_dir: Path, epochs: int = 2):
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=accumulation)
    model = MLP()
    optimizer = _adamw(model)
    with quiet_logger(run_dir) as logger:
        trainer = Trainer(accelerator, model, optimizer, loader, mse_step, logger=logger)
        state = trainer.train(TrainConfig(epochs=epochs, log_every=1, **QUIET))
    return trainer, model, optimizer, state


def _tensors(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    tensors = {f"param/{name}": p.detach().clone() for name, p in model.named_parameters()}
    for index, state in optimizer.state_dict()["state"].items():
        for key, value in state.items():
            tensors[f"optimizer/{index}/{key}"] = torch.as_tensor(value, dtype=torch.float64).clone()
    return tensors


def _max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[name] - b[name]).abs().max()) for name in a)


def _manual_adamw(windows: list[list[list[int]]], data: TensorDataset, epochs: int, *, blind: bool):
    """A plain PyTorch loop: each window's loss is the exact sample mean or the mean of batch means."""
    model = MLP()
    optimizer = _adamw(model)
    for _ in range(epochs):
        for window in windows:
            optimizer.zero_grad(set_to_none=True)
            total = sum(len(batch) for batch in window)
            for batch in window:
                inputs, targets = data[batch]
                mean = (model(inputs) - targets).square().mean()
                (mean / len(window) if blind else mean * len(batch) / total).backward()
            optimizer.step()
    return _tensors(model, optimizer)


def test_accumulation_with_incomplete_tail_equals_one_batch_of_the_union_over_two_epochs(tmp_path):
    """18 samples in sequential batches of 4, 4, 4, 4, 2 with k=3: windows of 3 and 2 batches (12 and 6
    samples, the tail holding the short batch). Over 2 epochs this must equal training with k=1 on
    batches that are the windows' unions, parameters and AdamW state to 1e-12 (float64)."""
    data = _regression_data(18)
    accumulated_loader = DataLoader(data, batch_size=4, shuffle=False)
    assert [len(b[0]) for b in accumulated_loader] == [4, 4, 4, 4, 2]
    accumulated, model, optimizer, state = _train(accumulated_loader, 3, tmp_path / "accumulated")
    assert accumulated.updates_per_epoch == 2
    assert state.step == 4 and state.batches == 10 and state.samples == 36
    result = _tensors(model, optimizer)
    accumulated_losses = [e["metrics"]["loss"] for e in events_named(tmp_path / "accumulated", "train")]
    accumulated_samples = [e["metrics"]["last_update_samples"] for e in events_named(tmp_path / "accumulated", "train")]

    fresh_accelerate()
    union_loader = DataLoader(data, batch_sampler=[list(range(0, 12)), list(range(12, 18))])
    _, union_model, union_optimizer, union_state = _train(union_loader, 1, tmp_path / "union")
    assert union_state.step == 4 and union_state.samples == 36
    reference = _tensors(union_model, union_optimizer)
    union_losses = [e["metrics"]["loss"] for e in events_named(tmp_path / "union", "train")]

    assert _max_difference(result, reference) <= 1e-12
    assert any(name.endswith("exp_avg_sq") for name in result)
    assert accumulated_samples == [12, 6, 12, 6]
    assert len(accumulated_losses) == len(union_losses) == 4
    assert max(abs(a - b) for a, b in zip(accumulated_losses, union_losses)) <= 1e-12

    # The test has teeth: a sample-count-blind average of the batch means (here it matters only in the
    # tail window of 4 + 2 samples) gives a measurably different run.
    windows = [[list(range(0, 4)), list(range(4, 8)), list(range(8, 12))], [list(range(12, 16)), list(range(16, 18))]]
    exact = _manual_adamw(windows, data, 2, blind=False)
    blind = _manual_adamw(windows, data, 2, blind=True)
    assert _max_difference(exact, result) <= 1e-12  # the hand loop reproduces the engine...
    assert _max_difference(blind, result) > 1e-6  # ...and the blind average does not


def test_tail_window_alone_uses_its_own_sample_total(tmp_path):
    """One epoch of batches 2, 2, 2 with k=2: the tail window holds one batch and must not be divided by
    the full window's sample count (4) or by k: SGD(lr=1) on loss v + w*g gives exact updates."""
    v = torch.zeros(6, dtype=torch.float64)
    g = torch.tensor([1.0, 3.0, 2.0, 2.0, 8.0, 8.0], dtype=torch.float64)
    loader = DataLoader(TensorDataset(v, g), batch_size=2, shuffle=False)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = ScalarWeight()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    with quiet_logger(tmp_path) as logger:
        trainer = Trainer(accelerator, model, optimizer, loader, linear_step, logger=logger)
        state = trainer.train(TrainConfig(epochs=1, log_every=1, **QUIET))
    # window 1: mean g over 4 samples = 2; window 2 (tail): mean g over 2 samples = 8 (not 4)
    assert model.w.item() == -10.0
    assert state.step == 2 == trainer.updates_per_epoch
    assert [e["metrics"]["grad_norm"] for e in events_named(tmp_path, "train")] == [2.0, 8.0]
    assert [e["metrics"]["last_update_samples"] for e in events_named(tmp_path, "train")] == [4, 2]


# ------------------------------------------------------------------------------------------------
# updates_per_epoch and planned_steps


@pytest.mark.parametrize(
    ("batches", "accumulation", "expected"),
    [(5, 3, 2), (6, 3, 2), (7, 3, 3), (1, 4, 1), (4, 1, 4), (9, 2, 5)],
)
def test_updates_per_epoch_includes_incomplete_tail(tmp_path, batches, accumulation, expected):
    v = torch.zeros(batches, dtype=torch.float64)
    g = torch.ones(batches, dtype=torch.float64)
    loader = DataLoader(TensorDataset(v, g), batch_size=1)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=accumulation)
    model = ScalarWeight()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with quiet_logger(tmp_path) as logger:
        trainer = Trainer(accelerator, model, optimizer, loader, linear_step, logger=logger)
        assert trainer.updates_per_epoch == expected
        config = TrainConfig(epochs=2, log_every=1, **QUIET)
        assert trainer.planned_steps(config) == 2 * expected
        state = trainer.train(config)
    # the plan is what training does when nothing is skipped
    assert state.step == 2 * expected
    (started,) = events_named(tmp_path, "started")
    assert started["budget"]["updates_per_epoch"] == expected
    assert started["budget"]["planned_steps"] == 2 * expected


def test_planned_steps_with_and_without_max_steps(tmp_path):
    v = torch.zeros(5, dtype=torch.float64)
    loader = DataLoader(TensorDataset(v, v), batch_size=1)  # 5 batches
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)  # windows 2, 2, 1
    model = ScalarWeight()
    trainer = Trainer(accelerator, model, torch.optim.SGD(model.parameters(), lr=0.1), loader, linear_step)
    assert trainer.updates_per_epoch == 3
    assert trainer.planned_steps(TrainConfig(epochs=4, **QUIET)) == 12
    assert trainer.planned_steps(TrainConfig(epochs=4, max_steps=7, **QUIET)) == 7
    assert trainer.planned_steps(TrainConfig(epochs=4, max_steps=100, **QUIET)) == 12
    assert trainer.planned_steps(TrainConfig(epochs=4, max_steps=0, **QUIET)) == 0
    with pytest.raises(ValueError, match=r"TrainConfig.epochs is 0; use an integer >= 1"):
        TrainConfig(epochs=0, **QUIET)

    state = trainer.train(TrainConfig(epochs=4, max_steps=7, **QUIET))
    assert state.step == 7
    # 7 updates: two full epochs (6) and the first window of the third
    assert (state.epoch, state.next_batch, state.batches) == (2, 2, 12)


def test_a_logging_interval_reports_its_own_exact_metrics_and_mean_grad_norm(tmp_path):
    """Two one-batch windows per train event (log_every=2): batches of 3 samples (loss 2, g 1) and 1
    sample (loss 6, g 3). The event's loss covers the interval's 4 samples: 3 (the last window alone
    would say 6, the mean of windows 4); grad_norm is the mean over its updates: 2 (the last alone 3);
    lr/0 is the last attempted update's; last_update_samples is the last window's 1."""
    v = torch.tensor([2.0, 2.0, 2.0, 6.0], dtype=torch.float64)
    g = torch.tensor([1.0, 1.0, 1.0, 3.0], dtype=torch.float64)
    loader = DataLoader(TensorDataset(v, g), batch_sampler=[[0, 1, 2], [3]])
    model = ScalarWeight()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    with quiet_logger(tmp_path) as logger:
        trainer = Trainer(Accelerator(cpu=True), model, optimizer, loader, linear_step, logger=logger)
        trainer.train(TrainConfig(epochs=1, log_every=2, **QUIET))
    (event,) = events_named(tmp_path, "train")
    assert event["step"] == 2 and event["samples"] == 4
    assert event["metrics"]["loss"] == 3.0
    assert event["metrics"]["grad_norm"] == 2.0
    assert event["metrics"]["last_update_samples"] == 1
    assert event["metrics"]["lr/0"] == 0.0
