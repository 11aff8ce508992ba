"""How the xdist workers share the suite (pyproject.toml: ``-n 4 --dist loadfile --no-loadscope-reorder``; hooks
in conftest.py).

A worker takes a whole file: its tests share their module's fixtures, and a SLURM file the worker's cluster.
Long files whose tests share nothing that costs (no module- or session-scoped fixture of their own that trains or
starts a cluster) are the exception: each of their tests is a unit of work of its own, so that one file does not
hold one worker for many minutes after the others have finished (benchmarks/results/2026-12-07-test-durations*.md).
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


# Seconds of worker time of the longest units (90 s or more), to queue them first (only their order matters): measured
# in the suite's run of benchmarks/results/2026-12-07-test-durations-startup-cut.md (four workers on two cores, so
# several times an idle machine's). A unit not listed counts as DEFAULT_S: a test of a spread file, a SLURM file,
# or a second per test of any other file.
EXPECTED_S = {
    "tests/slurm/test_two_hosts.py": 555,
    "tests/slurm/test_slurm_preemption.py": 362,
    "tests/examples/test_charlm.py": 323,
    "tests/launcher/test_rehearse.py::test_a_sharded_job_rehearses_exact_through_sigterm_and_sigkill": 302,
    "tests/docs/test_docs.py::test_the_tours_rehearsal_prints_what_the_rehearsal_guide_shows": 288,
    "tests/launcher/test_local_jobs.py": 271,
    "tests/launcher/test_failure_retries.py": 270,
    "tests/launcher/test_faults.py": 264,
    "tests/docs/test_docs.py::test_the_first_job_of_the_guide_validates_runs_and_rehearses_exact": 241,
    "tests/slurm/test_slurm_sweep.py": 218,
    "tests/launcher/test_continuing_runs.py": 211,
    "tests/engine/test_kill.py": 208,
    "tests/docs/test_docs.py::test_the_benchmark_command_shows_progress_then_prints_its_table_and_writes_json": 192,
    "tests/plot/test_interrupted_run_trackers.py": 168,
    "tests/launcher/test_sweep_local.py": 158,
    "tests/docs/test_docs.py::test_the_tour_preempts_resumes_extends_and_plots_as_written": 157,
    "tests/engine/test_distributed.py": 145,
    "tests/launcher/test_rehearse.py::test_a_pause_continued_on_another_world_size_is_within_rounding_with_the_same_samples": 140,
    "tests/engine/test_resize.py": 131,
    "tests/launcher/test_failure_causes.py": 126,
    "tests/launcher/test_tracker_sync_jobs.py": 122,
    "tests/slurm/test_slurm_failures.py": 120,
    "tests/slurm/test_slurm_cancel_races.py": 120,
    "tests/engine/test_resume.py": 117,
    "tests/launcher/test_rehearse.py::test_an_interruption_that_lands_after_the_last_update_is_retried_at_an_earlier_moment": 110,
    "tests/launcher/test_rehearse.py::test_a_job_without_a_run_logger_rehearses_exact_and_says_the_metrics_were_not_compared": 109,
    "tests/launcher/test_submission_transaction.py": 107,
    "tests/launcher/test_rehearse.py::test_the_quickstart_with_one_interruption_of_each_kind_is_exact": 98,
    "tests/plot/test_interrupted_run_plot.py": 98,
    "tests/launcher/test_rehearse.py::test_a_command_job_rehearses_exact": 96,
    "tests/slurm/test_rehearse_on_slurm.py": 95,
}
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
