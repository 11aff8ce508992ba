"""An evaluation without a ``Trainer`` on two gloo ranks exits cleanly, launch after launch: no gloo
worker is left to release the Python object of a tensor of the engine's collectives once interpreter
shutdown has begun (elfes/engine/collectives.py)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from launching import launch_torchrun

LAUNCHES = 10


@pytest.mark.distributed
def test_an_evaluation_without_a_trainer_exits_cleanly_at_every_launch():
    script = Path(__file__).with_name("evaluator_exit_case.py")
    outcomes, unclean = [], ""
    # Two launches at a time: half the wall time, and a busier machine, on which the abort was likelier.
    with ThreadPoolExecutor(max_workers=2) as pool:
        launches = list(pool.map(lambda _: launch_torchrun(script, timeout_s=300), range(LAUNCHES)))
    for launch in launches:
        output = launch.stdout + launch.stderr
        outcomes.append((launch.returncode, "terminate called" in output))
        if outcomes[-1] != (0, False):
            unclean = output
    assert outcomes == [(0, False)] * LAUNCHES, f"(exit status, aborted) per launch: {outcomes}\n{unclean[-6000:]}"
