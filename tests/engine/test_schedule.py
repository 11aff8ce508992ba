import io
import math
import warnings
from dataclasses import replace

import pytest
import torch
from torch.optim.lr_scheduler import (
    ChainedScheduler,
    CosineAnnealingLR,
    LambdaLR,
    LinearLR,
    OneCycleLR,
    PolynomialLR,
    SequentialLR,
)
from workloads import RunSpec, build, fresh_accelerate

from elfes.engine.events import Budget
from elfes.engine.resumption import check_schedule_horizons
from elfes.engine.schedule import WarmupDecay


@pytest.mark.parametrize(
    ("decay", "midpoint", "end"),
    [
        ("cosine", 0.1 + 0.9 * 0.5, 0.1),
        ("linear", 1.0 - 0.9 * 0.5, 0.1),
        ("constant", 1.0, 1.0),
    ],
)
def test_checkpoints_of_each_decay(decay, midpoint, end):
    schedule = WarmupDecay(
        total_steps=14, warmup_steps=4, start_factor=0.2, minimum_factor=0.1, decay=decay
    )

    assert schedule(0) == 0.2
    assert schedule(4) == 1.0
    assert schedule(9) == pytest.approx(midpoint)
    assert schedule(14) == end
    assert schedule(15) == end
    assert schedule(1_000) == end


@pytest.mark.parametrize("decay", ["cosine", "linear", "constant"])
def test_warmup_rises_linearly(decay):
    schedule = WarmupDecay(total_steps=20, warmup_steps=4, start_factor=0.2, decay=decay)

    assert [schedule(step) for step in range(5)] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])


@pytest.mark.parametrize("decay", ["cosine", "linear", "constant"])
def test_without_warmup_starts_at_one(decay):
    schedule = WarmupDecay(total_steps=10, start_factor=0.3, decay=decay)

    assert schedule(0) == 1.0


def test_cosine_follows_formula_between_checkpoints():
    schedule = WarmupDecay(total_steps=12, warmup_steps=2, minimum_factor=0.25)

    for step in range(2, 13):
        progress = (step - 2) / 10
        expected = 0.25 + 0.75 * (1 + math.cos(math.pi * progress)) / 2
        assert schedule(step) == pytest.approx(expected)


@pytest.mark.parametrize("decay", ["cosine", "linear"])
@pytest.mark.parametrize("minimum", [0.0, 0.1, 0.3, 0.7])
def test_decay_never_rises_and_never_drops_below_minimum(decay, minimum):
    schedule = WarmupDecay(total_steps=1_000, warmup_steps=10, minimum_factor=minimum, decay=decay)
    factors = [schedule(step) for step in range(10, 1_010)]

    assert all(later <= earlier for earlier, later in zip(factors, factors[1:]))
    assert min(factors) == minimum


def test_constant_allows_warmup_over_the_whole_run():
    schedule = WarmupDecay(total_steps=5, warmup_steps=5, decay="constant")

    assert schedule(5) == 1.0


def test_repr_and_equality():
    schedule = WarmupDecay(total_steps=10, warmup_steps=2, decay="linear")

    assert repr(schedule) == (
        "WarmupDecay(total_steps=10, warmup_steps=2, start_factor=0.0, "
        "minimum_factor=0.0, decay='linear')"
    )
    assert schedule == WarmupDecay(10, 2, 0.0, 0.0, "linear")
    assert schedule != WarmupDecay(10, 2, 0.0, 0.0, "cosine")


def test_instance_dict_holds_only_plain_fields():
    schedule = WarmupDecay(total_steps=10, warmup_steps=2, start_factor=0, minimum_factor=1)

    assert schedule.__dict__ == {
        "total_steps": 10,
        "warmup_steps": 2,
        "start_factor": 0.0,
        "minimum_factor": 1.0,
        "decay": "cosine",
    }
    assert type(schedule.start_factor) is float
    assert type(schedule.minimum_factor) is float


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"total_steps": 0}, ValueError, "total_steps"),
        ({"total_steps": 10.0}, TypeError, "total_steps"),
        ({"total_steps": True}, TypeError, "total_steps"),
        ({"total_steps": 10, "warmup_steps": -1}, ValueError, "warmup_steps"),
        ({"total_steps": 10, "warmup_steps": 1.5}, TypeError, "warmup_steps"),
        ({"total_steps": 10, "warmup_steps": 10}, ValueError, "warmup_steps"),
        ({"total_steps": 10, "warmup_steps": 10, "decay": "linear"}, ValueError, "warmup_steps"),
        ({"total_steps": 10, "warmup_steps": 11, "decay": "constant"}, ValueError, "warmup_steps"),
        ({"total_steps": 10, "start_factor": -0.1}, ValueError, "start_factor"),
        ({"total_steps": 10, "start_factor": 1.5}, ValueError, "start_factor"),
        ({"total_steps": 10, "start_factor": "0.1"}, TypeError, "start_factor"),
        ({"total_steps": 10, "minimum_factor": -0.1}, ValueError, "minimum_factor"),
        ({"total_steps": 10, "minimum_factor": float("nan")}, ValueError, "minimum_factor"),
        ({"total_steps": 10, "decay": "step"}, ValueError, "decay"),
    ],
)
def test_rejects_invalid_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        WarmupDecay(**kwargs)


def test_rejects_negative_step():
    with pytest.raises(ValueError, match="step"):
        WarmupDecay(total_steps=10)(-1)


def _optimizer(lr=0.5):
    parameter = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0]))
    return torch.optim.SGD([parameter], lr=lr)


def test_first_optimizer_update_uses_factor_of_step_zero():
    schedule = WarmupDecay(total_steps=10, warmup_steps=4, start_factor=0.25)
    optimizer = _optimizer(lr=0.5)
    scheduler = LambdaLR(optimizer, schedule)
    (parameter,) = optimizer.param_groups[0]["params"]
    parameter.grad = torch.tensor([1.0, 2.0, -4.0])
    expected = parameter.detach().clone().add(parameter.grad, alpha=-0.5 * schedule(0))

    assert optimizer.param_groups[0]["lr"] == 0.5 * schedule(0)
    optimizer.step()
    scheduler.step()

    assert torch.equal(parameter.detach(), expected)
    assert optimizer.param_groups[0]["lr"] == 0.5 * schedule(1)


def _train(optimizer, scheduler, steps):
    learning_rates = []
    for _ in range(steps):
        optimizer.step()
        scheduler.step()
        learning_rates.append(optimizer.param_groups[0]["lr"])
    return learning_rates


def test_state_dict_round_trips_through_weights_only_checkpoint():
    saved_schedule = WarmupDecay(
        total_steps=12, warmup_steps=3, start_factor=0.1, minimum_factor=0.05, decay="cosine"
    )
    optimizer = _optimizer()
    scheduler = LambdaLR(optimizer, saved_schedule)
    _train(optimizer, scheduler, steps=4)
    buffer = io.BytesIO()
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, buffer)
    buffer.seek(0)
    checkpoint = torch.load(buffer, weights_only=True)

    resumed_schedule = WarmupDecay(total_steps=100, decay="linear")
    resumed_optimizer = _optimizer()
    resumed_scheduler = LambdaLR(resumed_optimizer, resumed_schedule)
    resumed_optimizer.load_state_dict(checkpoint["optimizer"])
    resumed_scheduler.load_state_dict(checkpoint["scheduler"])

    assert resumed_schedule == saved_schedule
    assert resumed_schedule.__dict__ == saved_schedule.__dict__
    assert resumed_optimizer.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]
    expected = _train(optimizer, scheduler, steps=12)
    assert _train(resumed_optimizer, resumed_scheduler, steps=12) == expected


# Schedules built over the planned steps, as a user writes them after `planned = trainer.planned_steps(config)`.
BUILT_OVER_THE_PLAN = {
    "WarmupDecay": lambda optimizer, planned: LambdaLR(optimizer, WarmupDecay(total_steps=planned, warmup_steps=1)),
    "CosineAnnealingLR": lambda optimizer, planned: CosineAnnealingLR(optimizer, T_max=planned),
    "PolynomialLR": lambda optimizer, planned: PolynomialLR(optimizer, total_iters=planned),
    "SequentialLR": lambda optimizer, planned: SequentialLR(
        optimizer, [LinearLR(optimizer, start_factor=0.5, total_iters=2),
                    CosineAnnealingLR(optimizer, T_max=planned - 2)], milestones=[2]),
    "ChainedScheduler": lambda optimizer, planned: ChainedScheduler(
        [LinearLR(optimizer, start_factor=0.5, total_iters=2), CosineAnnealingLR(optimizer, T_max=planned)]),
}
SPEC = RunSpec(epochs=2, warmup=False, evaluate=False)  # 4 updates per epoch


def _finished_then_resumed(tmp_path, build_schedule, epochs: int):
    """A run trained to its end with ``build_schedule``'s scheduler, then rebuilt for ``epochs`` and resumed."""
    for budget, resume_from in ((SPEC.epochs, None), (epochs, tmp_path / "last")):
        fresh_accelerate()
        run = build(SPEC.with_(epochs=budget))
        run.trainer.scheduler = build_schedule(run.trainer.optimizer, run.trainer.planned_steps(run.config))
        if resume_from is None:
            run.trainer.train(run.config, checkpoint_dir=tmp_path)
    return run, resume_from


@pytest.mark.parametrize("kind", sorted(BUILT_OVER_THE_PLAN))
def test_a_schedule_built_over_the_planned_steps_warns_when_the_run_is_extended(tmp_path, kind):
    run, last = _finished_then_resumed(tmp_path, BUILT_OVER_THE_PLAN[kind], epochs=3)
    ends = 8 if kind != "SequentialLR" else 2 + 6
    with pytest.warns(UserWarning, match=rf"restored from .* ends at step {ends} .*, but this run now plans 12 steps\. "
                                         "The checkpoint's schedule is kept"):
        state = run.trainer.train(run.config, checkpoint_dir=tmp_path, resume_from=last)
    assert state.step == 12


@pytest.mark.parametrize("kind", sorted(BUILT_OVER_THE_PLAN))
def test_a_schedule_resumed_with_its_own_budget_does_not_warn(tmp_path, kind):
    run, last = _finished_then_resumed(tmp_path, BUILT_OVER_THE_PLAN[kind], epochs=SPEC.epochs)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*schedule|.*restored from")
        state = run.trainer.train(run.config, checkpoint_dir=tmp_path, resume_from=last)
    assert state.step == 8


def test_a_schedule_stepped_per_epoch_is_judged_in_epochs(tmp_path):
    for budget, resume_from in ((SPEC.epochs, None), (3, tmp_path / "last")):
        fresh_accelerate()
        run = build(SPEC.with_(epochs=budget))
        config = replace(run.config, scheduler_interval="epoch")
        run.trainer.scheduler = CosineAnnealingLR(run.trainer.optimizer, T_max=config.epochs)
        if resume_from is None:
            run.trainer.train(config, checkpoint_dir=tmp_path)
    with pytest.warns(UserWarning, match=r"CosineAnnealingLR restored from .* ends at epoch 2 \(T_max\), but this run "
                                         r"now plans 3 epochs"):
        state = run.trainer.train(config, checkpoint_dir=tmp_path, resume_from=resume_from)
    assert state.epoch == 3


def test_a_one_cycle_schedule_extended_past_its_total_steps_is_refused_before_training(tmp_path):
    one_cycle = lambda optimizer, planned: OneCycleLR(optimizer, max_lr=0.05, total_steps=planned)  # noqa: E731
    run, last = _finished_then_resumed(tmp_path, one_cycle, epochs=3)
    with pytest.raises(ValueError, match=r"OneCycleLR restored from .* ends at step 8 \(total_steps\), but this run "
                                         r"now plans 12 steps, .* Keep the budget at 8 steps or fewer"):
        run.trainer.train(run.config, checkpoint_dir=tmp_path, resume_from=last)
    assert run.trainer.state.step == 8


def test_a_schedule_stepped_per_epoch_over_a_stream_without_length_is_restored_without_a_horizon_check(tmp_path):
    # A stream without __len__ plans no number of epochs: there is no horizon to compare, and no division by None.
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    scheduler = OneCycleLR(optimizer, max_lr=0.1, total_steps=3)
    budget = Budget(epochs=1000, max_steps=50, planned_steps=50, updates_per_epoch=None, batches_per_epoch=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_schedule_horizons(scheduler, budget, "epoch", tmp_path / "step-10.pt")
