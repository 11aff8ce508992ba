"""An exponential moving average of a model's parameters."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


class ExponentialMovingAverage:
    """Averaged copies of the trainable parameters, updated after every successful optimizer step.

    ``average = decay * average + (1 - decay) * parameter``. Buffers (batch-norm statistics, ...) are
    not averaged: EMA weights use the raw model's buffers at the moment they are read.
    """

    def __init__(self, model: nn.Module, decay: float) -> None:
        message = f"ema_decay is {decay!r}; use a number strictly between 0 and 1, e.g. 0.999."
        if not isinstance(decay, (int, float)) or isinstance(decay, bool):
            raise TypeError(message)
        if not 0.0 < decay < 1.0:
            raise ValueError(message)
        self.decay = float(decay)
        self._parameters = {
            name: parameter for name, parameter in model.named_parameters() if parameter.requires_grad
        }
        self.average = {name: parameter.detach().clone() for name, parameter in self._parameters.items()}
        # Tied parameters appear once above; every other name of the same tensor reads the same average.
        canonical = {id(parameter): name for name, parameter in self._parameters.items()}
        self._aliases = {
            name: canonical[id(parameter)]
            for name, parameter in model.named_parameters(remove_duplicate=False)
            if id(parameter) in canonical
        }

    @torch.no_grad()
    def update(self) -> None:
        averages = list(self.average.values())
        torch._foreach_lerp_(averages, [p.detach() for p in self._parameters.values()], 1.0 - self.decay)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The averaged parameters under every name the model gives them (tied names included)."""
        return {name: self.average[canonical] for name, canonical in self._aliases.items()}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if set(state) != set(self._aliases):
            missing = sorted(set(self._aliases) - set(state))
            unexpected = sorted(set(state) - set(self._aliases))
            raise ValueError(
                f"EMA state does not match the model: missing {missing}, unexpected {unexpected}. "
                "Resume with the same model definition."
            )
        for name, average in self.average.items():
            average.copy_(state[name])

    @contextmanager
    def swapped_in(self) -> Iterator[None]:
        """Run the block with the averaged parameters in the model, then restore the raw ones exactly."""
        raw = {name: parameter.detach().clone() for name, parameter in self._parameters.items()}
        with torch.no_grad():
            for name, parameter in self._parameters.items():
                parameter.copy_(self.average[name])
        try:
            yield
        finally:
            with torch.no_grad():
                for name, parameter in self._parameters.items():
                    parameter.copy_(raw[name])
