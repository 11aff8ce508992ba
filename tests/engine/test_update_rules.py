"""What one optimizer update may and may not do: nonfinite values, clipping, AMP overflow, schedulers,
plateau scheduling and configuration validation."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from torch import nn
from torch.optim.lr_scheduler import LambdaLR, ReduceLROnPlateau
from torch.utils.data import DataLoader, TensorDataset
from workloads import events_named, quiet_logger

from elfes.engine import (
    Evaluator,
    Interval,
    Monitor,
    StepOutput,
    TrainConfig,
    Trainer,
)

QUIET = dict(evaluate_every=None, checkpoint_every=None)






class Linear(nn.Module):
    """Per-sample loss v + w . g (+ sqrt(r) when asked): the gradient is the batch's mean g."""

    def __init__(self, size: int = 1, dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(size, dtype=dtype))
        self.r = nn.Parameter(torch.zeros((), dtype=dtype))


def linear_step(model: nn.Module, batch) -> StepOutput:
    v, g = batch[0], batch[1]
    per_sample = v + g @ model.w
    return StepOutput(loss=per_sample.mean(), num_samples=len(v))


def _data(v, g, *extra, dtype=torch.float64) -> TensorDataset:
    g = torch.tensor(g, dtype=dtype)
    if g.ndim == 1:
        g = g.unsqueeze(1)
    return TensorDataset(torch.tensor(v, dtype=dtype), g, *extra)


def _state_tensors(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    tensors = {f"param/{name}": p.detach().clone() for name, p in model.named_parameters()}
    for index, state in optimizer.state_dict()["state"].items():
        for key, value in state.items():
            tensors[f"optimizer/{index}/{key}"] = torch.as_tensor(value).clone()
    return tensors


def _assert_equal(expected: dict[str, torch.Tensor], actual: dict[str, torch.Tensor]) -> None:
    assert expected.keys() == actual.keys()
    different = [name for name in expected if not torch.equal(expected[name], actual[name])]
    assert not different, different


# ------------------------------------------------------------------------------------------------
# Nonfinite losses and gradients


def test_nonfinite_loss_raises_naming_epoch_batch_step_and_leaves_parameters_unchanged():
    """4 batches of one sample, k=2, 2 epochs. In epoch 1 batch 2 (after 3 successful updates) the loss
    is NaN: the error names epoch 1, batch 2 and step 3, and parameters and the momentum buffer are
    bitwise those from before the window."""
    data = _data([0.0, 0.0, 0.0, 0.0], [1.0, 3.0, 2.0, 2.0])
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = Linear()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0, momentum=0.5)
    calls = []
    before_window: dict[str, torch.Tensor] = {}

    def step(model, batch):
        calls.append(len(calls))
        output = linear_step(model, batch)
        if len(calls) == 7:  # epoch 1, batch 2: the first batch of the epoch's second window
            before_window.update(_state_tensors(model, optimizer))
            output.loss = output.loss * math.nan
        return output

    trainer = Trainer(accelerator, model, optimizer, DataLoader(data, batch_size=1), step)
    with pytest.raises(FloatingPointError, match=r"epoch 1, batch 2 \(step 3\b") as raised:
        trainer.train(TrainConfig(epochs=2, **QUIET))
    assert "nan" in str(raised.value).lower()
    assert len(calls) == 8  # the window was completed, then refused
    _assert_equal(before_window, _state_tensors(model, optimizer))
    assert trainer.state.step == 3
    assert not torch.equal(model.w.detach(), torch.zeros(1, dtype=torch.float64))


def sqrt_step(model: nn.Module, batch) -> StepOutput:
    """Finite loss (sqrt(0) = 0) whose gradient with respect to r is infinite when the flag is set."""
    v, g, flag = batch
    per_sample = v + g @ model.w
    if bool(flag.any()):  # (multiplying by a zero flag would still give a 0 * inf = NaN gradient)
        per_sample = per_sample + torch.sqrt(model.r)
    return StepOutput(loss=per_sample.mean(), num_samples=len(v))


@pytest.mark.parametrize("max_grad_norm", [None, 1.0])
def test_finite_loss_with_nonfinite_gradient_raises_before_any_parameter_changes(max_grad_norm):
    data = _data([0.0, 0.0, 0.0], [1.0, 1.0, 1.0], torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64))
    accelerator = Accelerator(cpu=True)
    model = Linear()
    with torch.no_grad():
        model.r.fill_(0.0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.1)
    snapshots = []

    def step(model, batch):
        if batch[2].any():
            snapshots.append(_state_tensors(model, optimizer))
        return sqrt_step(model, batch)

    trainer = Trainer(accelerator, model, optimizer, DataLoader(data, batch_size=1), step)
    assert trainer.accelerator.scaler is None
    with pytest.raises(FloatingPointError, match="Nonfinite gradient"):
        trainer.train(TrainConfig(epochs=1, max_grad_norm=max_grad_norm, **QUIET))
    (before,) = snapshots
    _assert_equal(before, _state_tensors(model, optimizer))
    assert trainer.state.step == 1  # the first window trained, the second was refused


def test_nonfinite_gradient_error_names_the_last_batch_of_an_incomplete_tail_window():
    """3 batches, k=2: the tail window holds only batch 2; the error must not name a batch 3 that does
    not exist (it reported next_batch + k - 1 instead of the window's actual last batch)."""
    data = _data([0.0, 0.0, 0.0], [1.0, 1.0, 1.0], torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64))
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = Linear()
    trainer = Trainer(accelerator, model, torch.optim.SGD(model.parameters(), lr=0.1),
                      DataLoader(data, batch_size=1), sqrt_step)
    with pytest.raises(FloatingPointError, match="Nonfinite gradient") as raised:
        trainer.train(TrainConfig(epochs=1, **QUIET))
    assert "epoch 0, batch 2 (step 1)" in str(raised.value)


# ------------------------------------------------------------------------------------------------
# Gradient clipping


def _clipping_run(tmp_path: Path, max_grad_norm: float):
    """Window of 3 samples with g = (2, 4) and 1 sample with g = (6, 4): the window-mean gradient is
    (3, 4), norm 5 (the sum would have norm 20, the mean of batch means (4, 4) norm 5.66)."""
    data = _data([0.0] * 4, [[2.0, 4.0]] * 3 + [[6.0, 4.0]])
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = Linear(2)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    with quiet_logger(tmp_path) as logger:
        trainer = Trainer(accelerator, model, optimizer, DataLoader(data, batch_sampler=[[0, 1, 2], [3]]),
                          linear_step, logger=logger)
        trainer.train(TrainConfig(epochs=1, log_every=1, max_grad_norm=max_grad_norm, **QUIET))
    (train,) = events_named(tmp_path, "train")
    return model.w.detach().clone(), train["metrics"]["grad_norm"]


def test_clipping_reports_the_pre_clipping_norm_and_applies_the_clipped_gradient(tmp_path):
    w, grad_norm = _clipping_run(tmp_path, max_grad_norm=1.0)
    assert grad_norm == pytest.approx(5.0, abs=1e-12)
    gradient = torch.tensor([3.0, 4.0], dtype=torch.float64)
    assert float((w - (-gradient / 5.0)).abs().max()) <= 1e-6  # the unit-norm clipped gradient
    assert float(w.norm()) == pytest.approx(1.0, abs=1e-6)
    # exactly torch's clip coefficient max_norm / (norm + 1e-6)
    assert float((w - (-gradient * (1.0 / (5.0 + 1e-6)))).abs().max()) <= 1e-12


def test_clipping_above_the_norm_leaves_the_gradient_unchanged(tmp_path):
    w, grad_norm = _clipping_run(tmp_path, max_grad_norm=10.0)
    assert grad_norm == pytest.approx(5.0, abs=1e-12)
    assert torch.equal(w, torch.tensor([-3.0, -4.0], dtype=torch.float64))


# ------------------------------------------------------------------------------------------------
# AMP overflow skip


def overflow_step(model: nn.Module, batch) -> StepOutput:
    v, g, flag = batch
    loss = (v + g @ model.w).mean()
    if bool(flag.any()):
        loss = loss * 1e38  # finite in float32, but not once the grad scaler multiplies it by 2**16
    return StepOutput(loss=loss, num_samples=len(v))


def test_amp_overflow_skips_update_ema_and_scheduler_but_advances_the_data_position(tmp_path):
    """A real CPU GradScaler is assigned as accelerator.scaler: accelerate only creates one for fp16 on
    CUDA, and the engine reads accelerator.scaler. Batch 1 overflows: that window is skipped (no
    parameter change, EMA unchanged, step scheduler not stepped, a skipped event), while state.batches,
    samples and next_batch advance and the next window trains normally with the halved scale.

    SGD(lr=1), g=1, LambdaLR 0.5**step, EMA decay 0.5: updates at batches 0 and 2 give w = -1 then
    -1.5 (had the scheduler stepped on the skip, -1.25), EMA -0.5 then -1.0 (-1.125 had it updated).
    """
    flags = torch.tensor([False, True, False, False])
    data = _data([1.0] * 4, [1.0] * 4, flags, dtype=torch.float32)
    accelerator = Accelerator(cpu=True)
    assert accelerator.scaler is None
    accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    model = Linear(dtype=torch.float32)
    optimizer = torch.optim.SGD([model.w], lr=1.0)
    scheduler = LambdaLR(optimizer, lambda step: 0.5**step)
    ema_after_skip = []

    def step(model, batch):
        if batch[2].any():
            ema_before_skip.append(trainer.ema.state_dict()["w"].clone())
        elif ema_before_skip and not ema_after_skip:
            ema_after_skip.append(trainer.ema.state_dict()["w"].clone())
        return overflow_step(model, batch)

    ema_before_skip: list[torch.Tensor] = []
    with quiet_logger(tmp_path) as logger:
        trainer = Trainer(accelerator, model, optimizer, DataLoader(data, batch_size=1), step,
                          scheduler=scheduler, ema_decay=0.5, logger=logger)
        state = trainer.train(TrainConfig(epochs=1, max_steps=2, log_every=1, **QUIET))

    assert model.w.item() == -1.5
    assert torch.equal(ema_before_skip[0], ema_after_skip[0])
    assert trainer.ema.state_dict()["w"].item() == -1.0
    assert scheduler.last_epoch == 2
    assert accelerator.scaler.get_scale() == 2.0**15
    assert (state.step, state.batches, state.samples, state.next_batch, state.epoch) == (2, 3, 3, 3, 0)

    (skipped,) = events_named(tmp_path, "skipped")
    assert skipped["reason"] == "amp_overflow"
    assert skipped["step"] == 1
    train = events_named(tmp_path, "train")
    assert [event["step"] for event in train] == [1, 2]
    assert [event["metrics"]["lr/0"] for event in train] == [1.0, 0.5]
    assert [event["metrics"]["grad_norm"] for event in train] == [1.0, 1.0]  # unscaled, successful updates only
    assert [event["samples"] for event in train] == [1, 3]


# ------------------------------------------------------------------------------------------------
# Scheduler intervals and ReduceLROnPlateau


def _scheduled_run(tmp_path: Path, interval: str):
    data = _data([0.0] * 3, [1.0] * 3)  # 3 batches, k=2: 2 updates per epoch
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = Linear()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = LambdaLR(optimizer, lambda count: 0.5**count)
    with quiet_logger(tmp_path) as logger:
        trainer = Trainer(accelerator, model, optimizer, DataLoader(data, batch_size=1), linear_step,
                          scheduler=scheduler, logger=logger)
        trainer.train(TrainConfig(epochs=3, log_every=1, scheduler_interval=interval, **QUIET))
    return scheduler, [event["metrics"]["lr/0"] for event in events_named(tmp_path, "train")], model


def test_epoch_scheduler_steps_once_per_epoch(tmp_path):
    scheduler, rates, model = _scheduled_run(tmp_path, "epoch")
    assert scheduler.last_epoch == 3
    assert rates == [1.0, 1.0, 0.5, 0.5, 0.25, 0.25]
    assert model.w.item() == -(1.0 + 1.0 + 0.5 + 0.5 + 0.25 + 0.25)


def test_step_scheduler_steps_once_per_successful_update(tmp_path):
    scheduler, rates, model = _scheduled_run(tmp_path, "step")
    assert scheduler.last_epoch == 6
    assert rates == [0.5**k for k in range(6)]
    assert model.w.item() == -sum(0.5**k for k in range(6))


def test_reduce_lr_on_plateau_steps_on_the_monitored_metric(tmp_path):
    """Training moves w away from the validation target, so every evaluation after the first is worse.
    With patience=1 the plateau scheduler halves lr at the 3rd and 5th evaluations (one per update)."""
    train_data = _data([0.0] * 5, [1.0] * 5)
    validation = _data([0.0], [1.0])
    accelerator = Accelerator(cpu=True)
    model = Linear()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = ReduceLROnPlateau(optimizer, mode="min", factor=0.5, patience=1)

    def validation_step(model, batch):
        v, g = batch
        return StepOutput(loss=((g @ model.w) - 5.0).square().mean(), num_samples=len(v))

    evaluator = Evaluator(accelerator, {"val": DataLoader(validation, batch_size=1)}, validation_step)
    with quiet_logger(tmp_path) as logger:
        trainer = Trainer(accelerator, model, optimizer, DataLoader(train_data, batch_size=1), linear_step,
                          evaluator=evaluator, scheduler=scheduler, logger=logger)
        state = trainer.train(TrainConfig(epochs=1, log_every=1, evaluate_every=Interval(1, "step"),
                                          checkpoint_every=None, monitor=Monitor("val/loss")))

    rates = [event["metrics"]["lr/0"] for event in events_named(tmp_path, "train")]
    assert rates == [1.0, 1.0, 1.0, 0.5, 0.5]
    assert optimizer.param_groups[0]["lr"] == 0.25
    assert len(events_named(tmp_path, "evaluation")) == 5
    assert state.best_step == 1 and state.evaluations_without_improvement == 4
    assert model.w.item() == -(1.0 + 1.0 + 1.0 + 0.5 + 0.5)


def test_reduce_lr_on_plateau_without_monitor_is_refused():
    data = _data([0.0], [1.0])
    accelerator = Accelerator(cpu=True)
    model = Linear()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    trainer = Trainer(accelerator, model, optimizer, DataLoader(data, batch_size=1), linear_step,
                      scheduler=ReduceLROnPlateau(optimizer))
    with pytest.raises(ValueError, match=r"ReduceLROnPlateau steps on the monitored metric.*set monitor=Monitor\('<loader>/<metric>'\)"):
        trainer.train(TrainConfig(epochs=1, **QUIET))
    assert model.w.item() == 0.0


def test_monitor_without_evaluator_is_refused_at_train():
    data = _data([0.0], [1.0])
    accelerator = Accelerator(cpu=True)
    model = Linear()
    trainer = Trainer(accelerator, model, torch.optim.SGD(model.parameters(), lr=1.0),
                      DataLoader(data, batch_size=1), linear_step)
    with pytest.raises(ValueError, match=r"watches 'val/loss' but the trainer has no evaluator; pass Trainer\(\.\.\., evaluator=Evaluator"):
        trainer.train(TrainConfig(epochs=1, checkpoint_every=None, monitor=Monitor("val/loss")))
    assert model.w.item() == 0.0 and trainer.state.step == 0


# ------------------------------------------------------------------------------------------------
# Configuration validation: every error names its field


@pytest.mark.parametrize(
    ("build", "field", "error"),
    [
        (lambda: TrainConfig(epochs=-1), "TrainConfig.epochs", ValueError),
        (lambda: TrainConfig(epochs=0), "TrainConfig.epochs", ValueError),
        (lambda: TrainConfig(epochs=1.5), "TrainConfig.epochs", TypeError),
        (lambda: TrainConfig(epochs=True), "TrainConfig.epochs", TypeError),
        (lambda: TrainConfig(epochs=1, max_steps=-1), "TrainConfig.max_steps", ValueError),
        (lambda: TrainConfig(epochs=1, log_every=0), "TrainConfig.log_every", ValueError),
        (lambda: TrainConfig(epochs=1, evaluate_every=5), "TrainConfig.evaluate_every", TypeError),
        (lambda: TrainConfig(epochs=1, checkpoint_every="epoch"), "TrainConfig.checkpoint_every", TypeError),
        (lambda: TrainConfig(epochs=1, keep_checkpoints=0), "TrainConfig.keep_checkpoints", ValueError),
        (lambda: TrainConfig(epochs=1, max_grad_norm=0.0), "TrainConfig.max_grad_norm", ValueError),
        (lambda: TrainConfig(epochs=1, max_grad_norm=math.inf), "TrainConfig.max_grad_norm", ValueError),
        (lambda: TrainConfig(epochs=1, max_grad_norm=-1.0), "TrainConfig.max_grad_norm", ValueError),
        (lambda: TrainConfig(epochs=1, max_grad_norm="1"), "TrainConfig.max_grad_norm", TypeError),
        (lambda: TrainConfig(epochs=1, monitor="val/loss"), "TrainConfig.monitor", TypeError),
        (lambda: TrainConfig(epochs=1, scheduler_interval="batch"), "TrainConfig.scheduler_interval", ValueError),
        (lambda: Interval(0, "step"), "Interval.every", ValueError),
        (lambda: Interval(1.0, "step"), "Interval.every", TypeError),
        (lambda: Interval(1, "batch"), "Interval.unit", ValueError),
        (lambda: Monitor("loss"), "Monitor.metric", ValueError),
        (lambda: Monitor("/loss"), "Monitor.metric", ValueError),
        (lambda: Monitor(3), "Monitor.metric", TypeError),
        (lambda: Monitor("val/loss", mode="lowest"), "Monitor.mode", ValueError),
        (lambda: Monitor("val/loss", patience=0), "Monitor.patience", ValueError),
        (lambda: Monitor("val/loss", patience=1.0), "Monitor.patience", TypeError),
        (lambda: Monitor("val/loss", min_delta=-0.1), "Monitor.min_delta", ValueError),
        (lambda: Monitor("val/loss", min_delta=math.nan), "Monitor.min_delta", ValueError),
    ],
)
def test_config_validation_errors_name_the_field(build, field, error):
    """A value of the wrong type raises TypeError, a bad value of the right type ValueError; either is a
    configuration refusal (elfes.refusals), which the launcher fails at once instead of retrying."""
    from elfes.refusals import ConfigurationError, ConfigurationTypeError

    with pytest.raises(error, match=field.replace(".", r"\.")) as caught:
        build()
    assert type(caught.value) is (ConfigurationTypeError if error is TypeError else ConfigurationError)


def test_valid_configs_are_accepted():
    TrainConfig(epochs=1, max_steps=0, log_every=1, evaluate_every=Interval(3, "step"),
                checkpoint_every=Interval(2, "epoch"), keep_checkpoints=1, max_grad_norm=0.5,
                monitor=Monitor("val/loss", mode="max", patience=1, min_delta=0.0), scheduler_interval="epoch")
    Monitor("val/sub/metric")


def test_large_loss_denominators_do_not_overflow_the_grad_scaler_window_after_window(tmp_path):
    """Each backward divides by the previous window's global denominator, so a token-weighted loss
    keeps mean-sized scaled gradients: only the first window (no previous denominator) overflows.
    Without it, gradient * weight * scale = 2**110 * 2**20 * 2**16 exceeds float32 in every window
    until the scaler has shrunk. Powers of two keep every number exact."""

    class Scale(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.zeros(1))

        def forward(self, values: torch.Tensor) -> torch.Tensor:
            return values * self.w

    def step(model, batch):
        (values,) = batch
        return StepOutput(loss=model(values).mean(), num_samples=len(values), loss_weight=2.0**19 * len(values))

    data = TensorDataset(torch.full((16, 1), 2.0**110))
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    model = Scale()
    with quiet_logger(tmp_path) as logger:
        trainer = Trainer(accelerator, model, torch.optim.SGD(model.parameters(), lr=2.0**-110),
                          DataLoader(data, batch_size=2), step, logger=logger)
        state = trainer.train(TrainConfig(epochs=1, log_every=1, **QUIET))
    assert [event["step"] for event in events_named(tmp_path, "skipped")] == [0]
    assert state.step == 3  # every window after the first updated
    assert model.w.item() == -3.0  # each update moved w by exactly lr * mean(values) = 1
