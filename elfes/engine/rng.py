"""Capture and restore every random number generator a training process draws from."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

if TYPE_CHECKING:
    import numpy.typing as npt


def capture_rng() -> dict[str, Any]:
    """This process's Python, NumPy, torch CPU and CUDA generator states, loadable with weights_only."""
    # The global generator is an MT19937, whose state is this tuple (NumPy's stub also allows another's dict).
    numpy_state = cast("tuple[str, npt.NDArray[np.uint32], int, int, float]", np.random.get_state())
    algorithm, keys, position, has_gauss, cached_gaussian = numpy_state
    return {
        "python": random.getstate(),
        "numpy": {
            "algorithm": algorithm,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "position": int(position),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore_rng(state: dict[str, Any]) -> None:
    """Put back the generator states returned by :func:`capture_rng`."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    numpy_state = state["numpy"]
    np.random.set_state(
        (
            numpy_state["algorithm"],
            numpy_state["keys"].numpy().astype(np.uint32),
            numpy_state["position"],
            numpy_state["has_gauss"],
            numpy_state["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])
    if state["cuda"]:
        if not torch.cuda.is_available() or torch.cuda.device_count() != len(state["cuda"]):
            raise RuntimeError(
                f"The checkpoint holds CUDA generator states for {len(state['cuda'])} devices but this "
                f"process sees {torch.cuda.device_count() if torch.cuda.is_available() else 0}; resume on the "
                "same number of visible GPUs per process."
            )
        torch.cuda.set_rng_state_all(state["cuda"])


class RandomState:
    """This process's generators as a checkpoint component (``state_dict``/``load_state_dict``)."""

    def state_dict(self) -> dict[str, Any]:
        return capture_rng()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        restore_rng(state)
