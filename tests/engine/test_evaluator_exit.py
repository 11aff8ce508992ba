"""An evaluation without a ``Trainer`` on two gloo ranks exits cleanly, launch after launch: no gloo
worker is left to release the Python object of a tensor of the engine's collectives once interpreter
shutdown has begun (elfes/engine/collectives.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from forked_ranks import ForkedRanks
from launching import launch_environment

LAUNCHES = 10


@pytest.mark.distributed
def test_an_evaluation_without_a_trainer_exits_cleanly_at_every_launch():
    # The ranks fork from one process that imported torch once; each still ends through its own interpreter
    # shutdown, where the abort would happen. Two launches at a time: a busier machine made the abort likelier.
    ranks = ForkedRanks(Path(__file__).with_name("evaluator_exit_case.py"), launch_environment())
    try:
        launches = [outcome for _ in range(LAUNCHES // 2) for outcome in ranks.launch([], [])]
    finally:
        ranks.close()
    outcomes, unclean = [], ""
    for statuses, output in launches:
        outcomes.append((next((status for status in statuses if status != 0), 0), "terminate called" in output))
        if outcomes[-1] != (0, False):
            unclean = output
    assert outcomes == [(0, False)] * LAUNCHES, f"(exit status, aborted) per launch: {outcomes}\n{unclean[-6000:]}"
