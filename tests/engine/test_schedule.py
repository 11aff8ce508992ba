import io
import math

import pytest
import torch
from torch.optim.lr_scheduler import LambdaLR

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
