"""Fixtures of the launcher's end-to-end tests on the local executor (helpers in ``local_runs.py``).

- ``runs``: submits runs through the CLI (:class:`local_runs.Runs`); at teardown, ends what is left of them.
- ``references`` (session): ``references(tasks)``, an uninterrupted run on ``tasks`` ranks, started on first
  use and shared by every test of the session, on every xdist worker (``straight_runs``, tests/conftest.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from local_runs import CONFIG, Runs
from shared_runs import QUICKSTART


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[Runs]:
    runs = Runs(tmp_path)
    yield runs
    runs.kill_leftovers()


@pytest.fixture(scope="session")
def references(straight_runs: Callable[..., Path]) -> Callable[[int], Path]:
    """``references(tasks)``: the run directory of an uninterrupted run on ``tasks`` ranks (tests/conftest.py's
    ``straight_runs``: started on first use, shared by the whole session and with the SLURM tests' reference;
    call early so that it trains alongside the test's run)."""
    return lambda tasks: straight_runs(entrypoint=QUICKSTART, tasks=tasks, config=CONFIG)
