"""How the xdist workers share the suite (pyproject.toml: ``-n 4 --dist loadfile``; hooks in conftest.py).

A worker takes a whole file: its tests share their module's fixtures, and a SLURM file the worker's cluster.
Long files whose tests share nothing that costs (no module- or session-scoped fixture of their own that trains or
starts a cluster) are the exception: each of their tests is a unit of work of its own, so that one file does not
hold one worker for many minutes after the others have finished (benchmarks/results/2026-12-07-test-durations.md).
Units are handed out longest first, so that the last ones to finish are short.
"""

from __future__ import annotations

from collections import Counter

from xdist.scheduler import LoadScopeScheduling

SPREAD_FILES = frozenset({
    "tests/launcher/test_rehearse.py", "tests/docs/test_docs.py", "tests/engine/test_data_pipelines.py",
    "tests/launcher/test_command_jobs.py",
})


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def work_unit(nodeid: str) -> str:
    """The unit of work a test belongs to: its own id for a test of :data:`SPREAD_FILES`, else its file."""
    return nodeid if file_of(nodeid) in SPREAD_FILES else file_of(nodeid)


class FilesAndSpreadTests(LoadScopeScheduling):
    """``--dist loadfile`` with the units of :func:`work_unit`, handed out in the order of the collection."""

    def _split_scope(self, nodeid: str) -> str:
        return work_unit(nodeid)


def queue_order(tests: list[tuple[str, bool]]) -> list[int]:
    """The indexes of ``tests`` (``(nodeid, is_slurm)``, in collection order) in the order to queue them: the
    tests of :data:`SPREAD_FILES`, then the SLURM files (minutes each, mostly waiting on the scheduler), then the
    other files, those with the most tests first (xdist's own order). Within a file the order is the file's."""
    counts = Counter(file_of(nodeid) for nodeid, _ in tests)

    def rank(index: int) -> tuple[int, int]:
        nodeid, slurm = tests[index]
        if file_of(nodeid) in SPREAD_FILES:
            return (0, 0)
        return (1, 0) if slurm else (2, -counts[file_of(nodeid)])

    return sorted(range(len(tests)), key=rank)
