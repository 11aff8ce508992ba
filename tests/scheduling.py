"""How the xdist workers share the suite (pyproject.toml: ``-n 4 --dist loadfile``; hooks in conftest.py).

A worker takes a whole file: its tests share their module's fixtures, and a SLURM file the worker's cluster.
Long files whose tests share nothing that costs (no module- or session-scoped fixture of their own that trains or
starts a cluster) are the exception: each of their tests is a unit of work of its own, so that one file does not
hold one worker for many minutes after the others have finished (benchmarks/results/2026-12-07-test-durations.md).
Units are handed out longest first (as far as known), so that the last ones to finish are short.
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


# Seconds of worker time of the longest units, to queue them first (only their order matters): measured in the
# suite's run of benchmarks/results/2026-12-07-test-durations.md on a loaded machine (several times slower than an
# idle one), except those marked as estimates (from the last idle run's per-file sums). A unit not listed counts
# as DEFAULT_S: a test of a spread file, a SLURM file, or a second per test of any other file.
EXPECTED_S = {
    "tests/launcher/test_rehearse.py::test_a_sharded_job_rehearses_exact_through_sigterm_and_sigkill": 763,
    "tests/launcher/test_rehearse.py::test_a_pause_continued_on_another_world_size_is_within_rounding_with_the_data_"
    "identical": 557,
    "tests/docs/test_docs.py::test_make_run_finishes_the_example_job_then_the_tour_runs_as_written": 900,  # estimate
    "tests/slurm/test_two_hosts.py": 1000,  # estimate
    "tests/engine/test_rough_edges.py": 335,
    "tests/engine/test_sharded.py": 321,
    "tests/launcher/test_rehearse.py::test_a_command_job_rehearses_exact": 269,
    "tests/launcher/test_rehearse.py::test_the_quickstart_with_one_interruption_of_each_kind_is_exact": 227,
    "tests/launcher/test_rehearse.py::test_a_sampler_with_a_hidden_count_is_not_resumable": 147,
    "tests/launcher/test_command_jobs.py::test_an_engine_command_as_the_docs_write_it_is_preempted_bitwise": 147,
    "tests/engine/test_checkpoint.py": 125,
    "tests/engine/test_schedule.py": 107,
}
AUGMENTATION = "tests/engine/test_data_pipelines.py::test_random_augmentation_resumes_bitwise_after_a_pause_a_sigterm_and_a_sigkill"
EXPECTED_S |= {f"{AUGMENTATION}[{case}]": seconds for case, seconds in (
    ("numpy-two-workers", 368), ("python-main-process", 325), ("numpy-persistent-workers", 286),
    ("numpy-main-process", 253), ("torch-two-workers", 207), ("torch-main-process", 204),
    ("torch-persistent-workers", 174),
    ("python-two-workers", 250), ("python-persistent-workers", 250))}  # the last two: estimates, like their siblings
DEFAULT_S = {"spread test": 60.0, "slurm file": 300.0, "test of another file": 1.0}


def queue_order(tests: list[tuple[str, bool]]) -> list[int]:
    """The indexes of ``tests`` (``(nodeid, is_slurm)``, in collection order) in the order to queue them: the
    units of work longest first (:data:`EXPECTED_S`, else :data:`DEFAULT_S`). Within a file the order is the
    file's."""
    counts = Counter(file_of(nodeid) for nodeid, _ in tests)

    def expected_s(index: int) -> float:
        nodeid, slurm = tests[index]
        unit = work_unit(nodeid)
        if unit in EXPECTED_S:
            return EXPECTED_S[unit]
        if unit == nodeid:
            return DEFAULT_S["spread test"]
        return DEFAULT_S["slurm file"] if slurm else DEFAULT_S["test of another file"] * counts[unit]

    return sorted(range(len(tests)), key=lambda index: -expected_s(index))
