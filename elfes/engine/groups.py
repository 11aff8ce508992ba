"""Optimizer parameter groups that exempt some parameters from weight decay."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from torch import nn


def exempt_scalars_and_vectors(name: str, parameter: nn.Parameter) -> bool:
    """Return True for 0-d and 1-d parameters (biases, norm scales, scalars).

    Decaying these towards zero only restricts the model, so the common practice
    is to decay weight matrices and embeddings alone. This is the default
    ``exclude`` of :func:`weight_decay_groups`.

    Example:
        >>> from torch import nn
        >>> layer = nn.Linear(4, 2)
        >>> exempt_scalars_and_vectors("bias", layer.bias)
        True
        >>> exempt_scalars_and_vectors("weight", layer.weight)
        False
    """
    return parameter.ndim < 2


def weight_decay_groups(
    model: nn.Module,
    weight_decay: float,
    *,
    exclude: Callable[[str, nn.Parameter], bool] = exempt_scalars_and_vectors,
) -> list[dict[str, Any]]:
    """Split a model's trainable parameters into a decayed and an undecayed group.

    Returns up to two optimizer parameter groups, in this order, leaving out one
    that would be empty::

        {"name": "decay", "params": [...], "param_names": [...], "weight_decay": weight_decay}
        {"name": "no_decay", "params": [...], "param_names": [...], "weight_decay": 0.0}

    Frozen parameters (``requires_grad`` False) are left out. A parameter shared
    by several modules appears once, under the first name
    ``model.named_parameters()`` gives it. A parameter goes to ``"no_decay"``
    when ``exclude(name, parameter)`` is True. The groups are plain dicts, so
    callers may add keys such as a per-group ``"lr"`` before building the
    optimizer, and ``"name"`` and ``"param_names"`` survive in
    ``optimizer.state_dict()``.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``, ``exclude`` is not callable
            or ``weight_decay`` is not a number.
        ValueError: ``weight_decay`` is negative or not finite, or the model has
            no trainable parameters.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
        >>> groups = weight_decay_groups(model, 0.1)
        >>> [(group["name"], group["param_names"]) for group in groups]
        [('decay', ['0.weight']), ('no_decay', ['0.bias', '1.weight', '1.bias'])]
        >>> optimizer = torch.optim.AdamW(groups, lr=1e-3)
    """
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"model must be a torch.nn.Module, got {type(model).__name__}; "
            "pass the module whose parameters the optimizer will train."
        )
    weight_decay = _require_weight_decay(weight_decay)
    if not callable(exclude):
        raise TypeError(
            f"exclude must be callable as exclude(name, parameter) -> bool, got "
            f"{exclude!r}; pass a function or leave the default."
        )

    decay = _empty_group("decay", weight_decay)
    no_decay = _empty_group("no_decay", 0.0)
    # named_parameters() already yields a shared parameter only once, first name wins.
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        group = no_decay if exclude(name, parameter) else decay
        group["params"].append(parameter)
        group["param_names"].append(name)

    groups = [group for group in (decay, no_decay) if group["params"]]
    if not groups:
        raise ValueError(
            f"model {type(model).__name__} has no trainable parameters (none with "
            "requires_grad=True); unfreeze some parameters before building the optimizer."
        )
    return groups


def _empty_group(name: str, weight_decay: float) -> dict[str, Any]:
    return {"name": name, "params": [], "param_names": [], "weight_decay": weight_decay}


def _require_weight_decay(weight_decay: object) -> float:
    if isinstance(weight_decay, bool) or not isinstance(weight_decay, (int, float)):
        raise TypeError(
            f"weight_decay must be a float, got {weight_decay!r} of type "
            f"{type(weight_decay).__name__}; pass a number such as 0.01."
        )
    if not math.isfinite(weight_decay) or weight_decay < 0:
        raise ValueError(
            f"weight_decay must be finite and non-negative, got {weight_decay!r}; "
            "pass a number such as 0.01, or 0.0 to disable decay."
        )
    return float(weight_decay)
