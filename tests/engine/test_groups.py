import math

import pytest
import torch
from torch import nn

from elfes.engine.groups import exempt_scalars_and_vectors, weight_decay_groups


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 3)
        self.norm = nn.LayerNorm(3)
        self.scale = nn.Parameter(torch.tensor(2.0))

    def forward(self, inputs):
        return self.norm(self.linear(inputs)) * self.scale


class TiedLanguageModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(10, 4)
        self.output = nn.Linear(4, 10, bias=False)
        self.output.weight = self.embedding.weight

    def forward(self, tokens):
        return self.output(self.embedding(tokens))


def _names(groups):
    return {group["name"]: group["param_names"] for group in groups}


def _all_same(parameters, expected):
    return len(parameters) == len(expected) and all(
        parameter is other for parameter, other in zip(parameters, expected)
    )


def _step(model, optimizer):
    before = [parameter.detach().clone() for parameter in model.parameters()]
    model(torch.randn(2, 4)).square().sum().backward()
    optimizer.step()
    return any(
        not torch.equal(old, new.detach()) for old, new in zip(before, model.parameters())
    )


def test_splits_matrices_from_biases_norms_and_scalars():
    model = Small()

    groups = weight_decay_groups(model, 0.1)

    assert [group["name"] for group in groups] == ["decay", "no_decay"]
    decay, no_decay = groups
    assert decay["param_names"] == ["linear.weight"]
    assert decay["params"][0] is model.linear.weight
    assert decay["weight_decay"] == 0.1
    assert no_decay["param_names"] == ["scale", "linear.bias", "norm.weight", "norm.bias"]
    expected = [model.scale, model.linear.bias, model.norm.weight, model.norm.bias]
    assert _all_same(no_decay["params"], expected)
    assert no_decay["weight_decay"] == 0.0


def test_frozen_parameters_are_left_out():
    model = Small()
    model.linear.weight.requires_grad_(False)
    model.norm.bias.requires_grad_(False)

    groups = weight_decay_groups(model, 0.1)

    assert _names(groups) == {"no_decay": ["scale", "linear.bias", "norm.weight"]}


def test_tied_weight_is_listed_once_under_its_first_name():
    model = TiedLanguageModel()

    groups = weight_decay_groups(model, 0.1)

    assert _names(groups) == {"decay": ["embedding.weight"]}
    assert _all_same(groups[0]["params"], [model.embedding.weight])


def test_custom_exclude_moves_parameters_to_no_decay():
    model = Small()
    seen = []

    def exclude_linear(name, parameter):
        seen.append(name)
        return name.startswith("linear.")

    groups = weight_decay_groups(model, 0.1, exclude=exclude_linear)

    assert seen == ["scale", "linear.weight", "linear.bias", "norm.weight", "norm.bias"]
    assert _names(groups) == {
        "decay": ["scale", "norm.weight", "norm.bias"],
        "no_decay": ["linear.weight", "linear.bias"],
    }


def test_omits_an_empty_group():
    groups = weight_decay_groups(Small(), 0.1, exclude=lambda name, parameter: False)

    assert [group["name"] for group in groups] == ["decay"]


def test_default_exclude_is_by_dimension():
    assert exempt_scalars_and_vectors("scale", nn.Parameter(torch.tensor(1.0)))
    assert exempt_scalars_and_vectors("bias", nn.Parameter(torch.zeros(3)))
    assert not exempt_scalars_and_vectors("weight", nn.Parameter(torch.zeros(3, 3)))
    assert not exempt_scalars_and_vectors("kernel", nn.Parameter(torch.zeros(2, 3, 3)))


@pytest.mark.parametrize(
    "make_optimizer",
    [
        lambda groups: torch.optim.AdamW(groups, lr=1e-2),
        lambda groups: torch.optim.Adam(groups, lr=1e-2, fused=True),
    ],
    ids=["AdamW", "Adam-fused"],
)
def test_optimizers_accept_groups_and_keep_names(make_optimizer):
    model = Small()
    optimizer = make_optimizer(weight_decay_groups(model, 0.1))

    assert _step(model, optimizer)
    saved_groups = optimizer.state_dict()["param_groups"]
    assert [group["name"] for group in saved_groups] == ["decay", "no_decay"]
    assert [group["param_names"] for group in saved_groups] == [
        ["linear.weight"],
        ["scale", "linear.bias", "norm.weight", "norm.bias"],
    ]
    assert [group["weight_decay"] for group in saved_groups] == [0.1, 0.0]


def test_per_group_learning_rate_can_be_edited():
    model = Small()
    groups = weight_decay_groups(model, 0.1)
    groups[1]["lr"] = 0.0
    optimizer = torch.optim.AdamW(groups, lr=1e-2)
    no_decay_before = [parameter.detach().clone() for parameter in groups[1]["params"]]

    assert _step(model, optimizer)
    assert [group["lr"] for group in optimizer.param_groups] == [1e-2, 0.0]
    for old, parameter in zip(no_decay_before, groups[1]["params"]):
        assert torch.equal(old, parameter.detach())


def test_rejects_model_without_trainable_parameters():
    model = Small().requires_grad_(False)

    with pytest.raises(ValueError, match="no trainable parameters"):
        weight_decay_groups(model, 0.1)
    with pytest.raises(ValueError, match="no trainable parameters"):
        weight_decay_groups(nn.ReLU(), 0.1)


@pytest.mark.parametrize(
    ("weight_decay", "error"),
    [
        (-0.1, ValueError),
        (math.inf, ValueError),
        (math.nan, ValueError),
        ("0.1", TypeError),
        (None, TypeError),
        (True, TypeError),
    ],
)
def test_rejects_bad_weight_decay(weight_decay, error):
    with pytest.raises(error, match="weight_decay"):
        weight_decay_groups(Small(), weight_decay)


def test_rejects_non_module_and_non_callable_exclude():
    with pytest.raises(TypeError, match="model"):
        weight_decay_groups([nn.Parameter(torch.zeros(2, 2))], 0.1)
    with pytest.raises(TypeError, match="exclude"):
        weight_decay_groups(Small(), 0.1, exclude="bias")
