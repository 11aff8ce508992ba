"""The entrypoint of the plot tests' job: the quickstart job, each step slowed by a delay that the spec
sets per attempt, so that the test's signals and its kill land mid-run. Imported inside the job."""

from __future__ import annotations

import time
from typing import Any

from examples.quickstart import job as quickstart


def paced_quickstart(job: Any) -> Any:
    """The quickstart job; ``step_delay_s`` (popped from the config) maps an attempt number (as a
    string; ``"default"`` for the others) to the seconds of sleep in every step of that attempt."""
    config = dict(job.config)
    delays = config.pop("step_delay_s")
    job.config = config
    delay = float(delays.get(str(job.attempt), delays["default"]))

    def paced_step(model, batch):
        time.sleep(delay)
        return quickstart.step(model, batch)

    return quickstart.run(job, paced_step)
