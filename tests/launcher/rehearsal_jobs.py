"""Jobs that `elfes rehearse` must judge: the quickstart slowed down (exact), one whose data order hangs
on a counter the checkpoint does not hold (not resumable), one seeded from the clock (not reproducible).
Imported inside the jobs (the tests' specs run them from the repository root)."""

from __future__ import annotations

import time
from typing import Any

import torch
from torch.utils.data import Sampler

from examples.quickstart import job as quickstart
from examples.quickstart.train import step
from tests.launcher.entrypoints import slow_quickstart

__all__ = ["clock_seeded", "hidden_sampler_counter", "slow_quickstart"]


def _slow(config: dict[str, Any]):
    delay = float(config.pop("step_delay_s", 0.0))

    def slow_step(model, batch):
        time.sleep(delay)
        return step(model, batch)

    return slow_step


class CountingSampler(Sampler[int]):
    """Shuffles each epoch from a count of its own epochs: a restart forgets the count, so the epoch a run
    resumes in is read in another order."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.epochs_begun = 0

    def __iter__(self):
        self.epochs_begun += 1
        order = torch.randperm(self.size, generator=torch.Generator().manual_seed(self.epochs_begun))
        return iter(order.tolist())

    def __len__(self) -> int:
        return self.size


def hidden_sampler_counter(job: Any) -> Any:
    """The quickstart with :class:`CountingSampler` instead of ``shuffle=True``."""
    config = dict(job.config)
    job.config = config
    slow_step = _slow(config)
    original = quickstart.DataLoader

    def loader_with_counting_sampler(dataset, batch_size, shuffle=False, **kwargs):
        sampler = CountingSampler(len(dataset)) if shuffle else None
        return original(dataset, batch_size=batch_size, sampler=sampler, **kwargs)

    quickstart.DataLoader = loader_with_counting_sampler
    try:
        return quickstart.run(job, slow_step)
    finally:
        quickstart.DataLoader = original


def clock_seeded(job: Any) -> Any:
    """The quickstart whose configured seed is replaced by the clock."""
    config = dict(job.config)
    config["seed"] = time.time_ns() % 2**31
    job.config = config
    return quickstart.run(job, _slow(config))
