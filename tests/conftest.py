"""Shared fixtures: process-state guards and real multi-process launches."""

from __future__ import annotations

import os
import signal
from collections import Counter

import pytest
from launching import GUARDED_ENVIRONMENT_NAMES, GUARDED_ENVIRONMENT_PREFIXES, torchrun
from xdist.scheduler import LoadScopeScheduling

GUARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2)

# -- how the xdist workers share the suite (pyproject.toml: -n 4 --dist loadfile) -----------------------------------
# Long files whose tests share nothing that costs (no module- or session-scoped fixture of their own that trains or
# starts a cluster): each of their tests is a unit of work of its own, so that one file does not hold one worker for
# many minutes while the others have finished (benchmarks/results/2026-12-07-test-durations.md).
SPREAD_FILES = frozenset({
    "tests/launcher/test_rehearse.py", "tests/docs/test_docs.py", "tests/engine/test_data_pipelines.py",
    "tests/launcher/test_command_jobs.py",
})


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


class FilesAndSpreadTests(LoadScopeScheduling):
    """``--dist loadfile``, where a worker takes a whole file (its tests share their module's fixtures, and a
    SLURM file the worker's cluster), except that each test of :data:`SPREAD_FILES` goes to whichever worker is
    free. Units are handed out in the order of the collection (``pytest_collection_modifyitems``)."""

    def _split_scope(self, nodeid: str) -> str:
        return nodeid if _file_of(nodeid) in SPREAD_FILES else _file_of(nodeid)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log) -> LoadScopeScheduling | None:
    if config.getvalue("dist") != "loadfile":
        return None
    config.option.loadscopereorder = False  # the order is the collection's, below
    return FilesAndSpreadTests(config, log)


@pytest.hookimpl(trylast=True)  # after tests/slurm/conftest.py has marked its tests
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest units first, so that the last ones to finish are short: the tests of :data:`SPREAD_FILES`,
    then the SLURM files (minutes each, mostly waiting on the scheduler), then the other files, those with the
    most tests first (xdist's own order). Within a file the order is the file's."""
    counts = Counter(_file_of(item.nodeid) for item in items)

    def rank(item: pytest.Item) -> tuple[int, int]:
        file = _file_of(item.nodeid)
        if file in SPREAD_FILES:
            return (0, 0)
        return (1, 0) if item.get_closest_marker("slurm") else (2, -counts[file])

    items.sort(key=rank)


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
