"""Entrypoints of the fault tests (tests/launcher/test_faults.py): real faults of the run directory's
file system at chosen moments. Imported inside the jobs (the specs put the repository on the job's path)."""

from __future__ import annotations

import time
from typing import Any

from examples.quickstart import job as quickstart
from tests.launcher.entrypoints import slow_quickstart


def fill_the_disk(job: Any) -> None:
    """Write into the run directory until its file system has no byte left."""
    with open(job.run_dir / f"filler-{job.rank}", "ab") as filler:
        try:
            while True:
                filler.write(b"\0" * 4096)
                filler.flush()
        except OSError:
            pass


def fills_the_disk_after_training(job: Any) -> Any:
    """Trains to the end, then fills the run directory's file system before returning."""
    state = slow_quickstart(job)
    fill_the_disk(job)
    return state


def slow_to_stop(job: Any) -> Any:
    """The slowed quickstart job whose window in progress, once a stop is requested, takes 30 s more:
    a window longer than ``slurm.signal_delay_s``, so a time limit kills it before it saves."""
    config = dict(job.config)
    delay = float(config.pop("step_delay_s", 0.0))
    job.config = config

    def step(model, batch):
        time.sleep(delay)
        if job.stop.reason is not None:  # asked during this step's delay too: the window takes 30 s more
            time.sleep(30.0)
        return quickstart.step(model, batch)

    return quickstart.run(job, step)
