"""Entrypoints of the SLURM preemption tests (``test_slurm_preemption.py``), imported inside the jobs from the
repository root.

``first_attempts_slow`` is the quickstart job slowed like the launcher tests' (``step_delay_s`` of sleep per
batch), but only in its first ``slow_attempts`` attempts: the interrupted attempt is slow enough for a signal
to land mid-run (or for its training to outlast the time limit), and the relaunch trains at full speed so
that the SLURM suite stays short. A sleep changes no number: the weights stay those of the unslowed run.
"""

from __future__ import annotations

from typing import Any

from tests.launcher.entrypoints import slow_quickstart


def first_attempts_slow(job: Any) -> Any:
    """The quickstart job with ``step_delay_s`` per batch in attempts up to ``slow_attempts`` (both popped
    from the config; every attempt is slowed without ``slow_attempts``)."""
    config = dict(job.config)
    slow_attempts = config.pop("slow_attempts", None)
    if slow_attempts is not None and job.attempt > int(slow_attempts):
        config["step_delay_s"] = 0.0
    job.config = config
    return slow_quickstart(job)

