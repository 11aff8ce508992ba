"""Entrypoints of the end-to-end launcher tests: the quickstart job, slowed so that signals land mid-run,
and one that fails. Imported inside the jobs (the tests' specs put this folder on the job's path)."""

from __future__ import annotations

import time
from typing import Any

from examples.quickstart import job as quickstart


def slow_quickstart(job: Any) -> Any:
    """The quickstart job with ``step_delay_s`` (popped from the config) of sleep in every step."""
    config = dict(job.config)
    delay = float(config.pop("step_delay_s", 0.0))
    job.config = config

    def slow_step(model, batch):
        time.sleep(delay)
        return quickstart.step(model, batch)

    return quickstart.run(job, slow_step)


def failing(job: Any) -> Any:
    """Fails on every rank, before any training, with a recognisable message."""
    raise RuntimeError(f"the data folder /nonexistent/{job.rank} is missing")
