"""Fixtures of the launcher's end-to-end tests on the local executor (helpers in ``local_runs.py``).

- ``runs``: submits runs through the CLI (:class:`local_runs.Runs`); at teardown, ends what is left of them.
- ``references`` (module): ``references(tasks)``, an uninterrupted run on ``tasks`` ranks, started on first
  use and shared by the tests of one module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from local_runs import CONFIG, Runs


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[Runs]:
    runs = Runs(tmp_path)
    yield runs
    runs.kill_leftovers()


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[int], Path]]:
    """``references(tasks)``: the run directory of an uninterrupted run on ``tasks`` ranks (started on
    first use, shared by the tests of this module; call early so that it trains alongside the test's run)."""
    runs = Runs(tmp_path_factory.mktemp("references"))
    started: dict[int, Path] = {}

    def reference(tasks: int) -> Path:
        if tasks not in started:
            started[tasks] = runs.submit(f"reference-{tasks}", tasks=tasks,
                                         config={**CONFIG, "step_delay_s": 0.0})
        return started[tasks]

    yield reference
    runs.kill_leftovers()
