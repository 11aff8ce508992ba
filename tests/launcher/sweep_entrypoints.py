"""The entrypoint of the local sweep tests: the quickstart job, held mid-run while a file exists, so
that a test decides when members finish (the hold ends early on a stop request, so signals still land)."""

from __future__ import annotations

import os
import time
from typing import Any

from examples.quickstart import job as quickstart


def held_quickstart(job: Any) -> Any:
    """The quickstart job; after ``hold_after_batches`` batches of an attempt, each batch waits while the file
    ``hold_file`` exists (both popped from the config; "" holds nothing). Waiting changes no number."""
    config = dict(job.config)
    hold = config.pop("hold_file", "")
    free_batches = int(config.pop("hold_after_batches", 0))
    job.config = config
    batches = 0

    def held_step(model, batch):
        nonlocal batches
        batches += 1
        while (hold and batches > free_batches and os.path.exists(hold)
               and job.stop.reason is None and job.stop.signal is None):
            time.sleep(0.02)
        return quickstart.step(model, batch)

    return quickstart.run(job, held_step)
