"""Shared fixtures: process-state guards and real multi-process launches."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from launching import GUARDED_ENVIRONMENT_NAMES, GUARDED_ENVIRONMENT_PREFIXES, torchrun
from scheduling import FilesAndSpreadTests, queue_order
from shared_runs import SharedRuns, session_folder, submit_straight

GUARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2)


# -- how the xdist workers share the suite (pyproject.toml: -n 4 --dist loadfile --no-loadscope-reorder, so that
# the units are handed out in the collection's order, set below; the rules in scheduling.py) ---------------------
@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log) -> FilesAndSpreadTests | None:
    if config.getvalue("dist") != "loadfile":
        return None
    return FilesAndSpreadTests(config, log)


@pytest.hookimpl(trylast=True)  # after tests/slurm/conftest.py has marked its tests
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest units of work first (:func:`scheduling.queue_order`)."""
    order = queue_order([(item.nodeid, item.get_closest_marker("slurm") is not None) for item in items])
    items[:] = [items[index] for index in order]


def _guarded_environment() -> dict[str, str]:
    return {
        name: value
        for name, value in os.environ.items()
        if name.startswith(GUARDED_ENVIRONMENT_PREFIXES) or name in GUARDED_ENVIRONMENT_NAMES
    }


@pytest.fixture(autouse=True)
def no_leaked_process_state():
    """Fail a test that leaves distributed/SLURM variables or signal handlers behind, then clean up."""
    environment = _guarded_environment()
    handlers = {signum: signal.getsignal(signum) for signum in GUARDED_SIGNALS}
    yield
    leaked_environment = {
        name: value for name, value in _guarded_environment().items() if environment.get(name) != value
    }
    leaked_handlers = [
        signal.Signals(signum).name for signum, handler in handlers.items() if signal.getsignal(signum) is not handler
    ]
    for name in leaked_environment:
        if name in environment:
            os.environ[name] = environment[name]
        else:
            del os.environ[name]
    for signum, handler in handlers.items():
        signal.signal(signum, handler)
    assert not leaked_environment, f"test leaked environment variables: {sorted(leaked_environment)}"
    assert not leaked_handlers, f"test leaked signal handlers for {leaked_handlers}"


@pytest.fixture(autouse=True)
def no_terminal_size(monkeypatch):
    """Output as to a pipe of unknown width: pytest-xdist exports its terminal's COLUMNS and LINES to its
    workers, which would wrap tables there and not under `-n 0`. A test that wants a width sets COLUMNS."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    """Accelerate keeps process-wide singletons; give every test its own."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


@pytest.fixture
def run_distributed():
    """``run_distributed(script, *args, processes=2)``: a real multi-process gloo run via torchrun."""
    return torchrun


@pytest.fixture(scope="session")
def straight_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Path]]:
    """``straight_runs(entrypoint=..., tasks=..., config=...)``: the run directory of that job run uninterrupted
    and unslowed on the local executor, submitted on first use and shared by the whole session, on every xdist
    worker (``shared_runs.py``); call it early, so that it trains while the test's own run does."""
    shared = SharedRuns(session_folder(tmp_path_factory, "straight-runs"), submit_straight)
    yield lambda **inputs: shared.get(inputs)
    shared.finish()
