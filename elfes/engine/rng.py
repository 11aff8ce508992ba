"""Every random number generator a training process owns, listed once: how each is captured, restored and seeded.

:data:`GENERATORS` is the one list. A checkpoint holds each rank's states by generator name (the ``rng``
component, :class:`RandomState`), a DataLoader worker's batch fetch seeds those a fetch draws from
(:func:`seed_fetch_generators`), a rank of a resized run seeds them all (:func:`seed_every_generator`), and
``elfes rehearse`` names a generator the job never seeds by its :attr:`Generator.description`. A new generator is
one more entry here.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

if TYPE_CHECKING:
    pass


@dataclass(frozen=True)
class Generator:
    """One generator of this process: its name in a checkpoint, how a user knows it, and its state's round trip
    (a state loadable with ``torch.load(weights_only=True)``)."""

    name: str
    description: str
    capture: Callable[[], Any]
    restore: Callable[[Any], None]
    seed: Callable[[int], None]  # from one 64-bit seed
    in_fetches: bool = True  # seeded for each batch a DataLoader worker fetches (a worker draws no CUDA numbers)


def _restore_python(state: Any) -> None:
    version, internal, gauss = state
    random.setstate((version, tuple(internal), gauss))


def _capture_numpy() -> dict[str, Any]:
    state = np.random.get_state(legacy=True)  # the tuple form: legacy is its default
    algorithm, keys, position, has_gauss, cached_gaussian = cast("tuple[str, np.ndarray, int, int, float]", state)
    return {"algorithm": algorithm, "keys": torch.from_numpy(keys.astype(np.int64)), "position": int(position),
            "has_gauss": int(has_gauss), "cached_gaussian": float(cached_gaussian)}


def _restore_numpy(state: Mapping[str, Any]) -> None:
    np.random.set_state((state["algorithm"], state["keys"].numpy().astype(np.uint32), state["position"],
                         state["has_gauss"], state["cached_gaussian"]))


def _seed_numpy(seed: int) -> None:
    np.random.seed(seed >> 32)  # NumPy's legacy seed takes 32 bits


def _seed_torch(seed: int) -> None:
    torch.default_generator.manual_seed(seed)


def _capture_cuda() -> list[torch.Tensor]:
    return torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []


def _restore_cuda(states: list[torch.Tensor]) -> None:
    if not states:
        return
    if not torch.cuda.is_available() or torch.cuda.device_count() != len(states):
        raise RuntimeError(
            f"The checkpoint holds CUDA generator states for {len(states)} devices but this "
            f"process sees {torch.cuda.device_count() if torch.cuda.is_available() else 0}; resume on the "
            "same number of visible GPUs per process."
        )
    torch.cuda.set_rng_state_all(states)


def _seed_cuda(seed: int) -> None:
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


GENERATORS: tuple[Generator, ...] = (
    Generator("python", "Python's `random` generator", random.getstate, _restore_python, random.seed),
    Generator("numpy", "NumPy's global generator", _capture_numpy, _restore_numpy, _seed_numpy),
    Generator("torch", "torch's CPU generator", torch.get_rng_state, torch.set_rng_state, _seed_torch),
    Generator("cuda", "the CUDA generators", _capture_cuda, _restore_cuda, _seed_cuda, in_fetches=False),
)


def capture_rng() -> dict[str, Any]:
    """Every generator's state by name (:data:`GENERATORS`), loadable with weights_only."""
    return {generator.name: generator.capture() for generator in GENERATORS}


def restore_rng(state: Mapping[str, Any]) -> None:
    """Put back the generator states of :func:`capture_rng`; a generator the state lacks (a checkpoint older than
    the generator) stays as it is."""
    for generator in GENERATORS:
        if generator.name in state:
            generator.restore(state[generator.name])


def seed_fetch_generators(seed: int) -> None:
    """Seed the generators a batch's fetch draws from (torch's CPU one, NumPy's, Python's) from one 64-bit
    ``seed``; CUDA's is left alone: a worker draws no CUDA numbers, and seeding it would initialise CUDA there."""
    for generator in GENERATORS:
        if generator.in_fetches:
            generator.seed(seed)


def seed_every_generator(seed: int) -> None:
    """Seed every generator of this process (CUDA's too, where there is one) from one 64-bit ``seed``."""
    for generator in GENERATORS:
        generator.seed(seed)


def describe_generator(name: str) -> str:
    """How a user knows generator ``name`` (the name itself for one this ELFES does not list)."""
    return next((generator.description for generator in GENERATORS if generator.name == name), name)


class RandomState:
    """This process's generators as a checkpoint component (``state_dict``/``load_state_dict``)."""

    def state_dict(self) -> dict[str, Any]:
        return capture_rng()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        restore_rng(state)
