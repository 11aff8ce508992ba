"""How the xdist workers share the suite (pyproject.toml: ``-n 4 --dist loadfile --no-loadscope-reorder``; hooks
in conftest.py).

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
# idle one; the import graph after its parse was cached), except the estimate marked. A unit not listed counts as
# DEFAULT_S: a test of a spread file, a SLURM file, or a second per test of any other file.
EXPECTED_S = {
    "tests/engine/test_sharded.py": 1346,
    "tests/launcher/test_rehearse.py::test_a_sharded_job_rehearses_exact_through_sigterm_and_sigkill": 763,
    "tests/launcher/test_rehearse.py::test_a_pause_continued_on_another_world_size_is_within_rounding_with_the_same_samples": 557,
    "tests/docs/test_docs.py::test_the_first_job_of_the_guide_validates_runs_and_rehearses_exact": 496,
    "tests/launcher/test_rehearse.py::test_generators_never_seeded_nor_drawn_from_are_a_note_and_the_verdict_exact": 353,
    "tests/engine/test_rough_edges.py": 335,
    "tests/launcher/test_rehearse.py::test_a_job_with_nan_in_a_buffer_and_a_logged_metric_is_exact": 295,
    "tests/engine/test_data_pipelines.py::test_a_stateful_iterable_dataset_resumes_mid_epoch_bitwise": 270,
    "tests/launcher/test_rehearse.py::test_a_command_job_rehearses_exact": 269,
    "tests/launcher/test_rehearse.py::test_a_job_without_a_run_logger_rehearses_exact_and_says_the_metrics_were_not_compared": 236,
    "tests/launcher/test_rehearse.py::test_the_quickstart_with_one_interruption_of_each_kind_is_exact": 227,
    "tests/launcher/test_rehearse.py::test_an_export_the_interrupted_run_lost_is_not_resumable_naming_the_file": 201,
    "tests/launcher/test_rehearse.py::test_a_sampler_with_a_hidden_count_is_not_resumable": 147,
    "tests/launcher/test_command_jobs.py::test_an_engine_command_as_the_docs_write_it_is_preempted_bitwise": 147,
    "tests/test_import_graph.py": 137,
    "tests/engine/test_checkpoint.py": 125,
    "tests/slurm/test_two_hosts.py": 1200,  # estimate: 5.7 min in the last idle run
    # Estimates from their files' own runs on a loaded machine (added after the measured run):
    "tests/plot/test_interrupted_run_trackers.py": 470,
    "tests/launcher/test_tracker_sync_jobs.py": 400,
    "tests/launcher/test_rehearse.py::test_a_resize_of_a_job_with_dropout_drawn_per_rank_names_the_dropout": 360,
    "tests/launcher/test_rehearse.py::test_the_scratch_runs_mirror_to_the_specs_trackers_only_with_trackers_asked_for": 230,
    "tests/launcher/test_tracker_lifecycle_jobs.py": 210,
    # Estimates: the measured 1558 s of the README's make run, tour and rehearsal, once one test, by their shares.
    "tests/docs/test_docs.py::test_the_tours_rehearsal_prints_what_the_rehearsal_guide_shows": 750,
    "tests/docs/test_docs.py::test_the_tour_preempts_resumes_extends_and_plots_as_written": 400,
    "tests/docs/test_docs.py::test_make_run_finishes_the_example_job": 150,
}
AUGMENTATION = ("tests/engine/test_data_pipelines.py::test_random_augmentation_resumes_bitwise_after_a_pause_a_"
                "sigterm_and_a_sigkill")
EXPECTED_S |= {f"{AUGMENTATION}[{case}]": seconds for case, seconds in (
    ("python-persistent-workers", 530),
    ("numpy-two-workers", 368),
    ("python-main-process", 325),
    ("numpy-persistent-workers", 286),
    ("python-two-workers", 285),
    ("numpy-main-process", 253),
    ("torch-two-workers", 207),
    ("torch-main-process", 204),
    ("torch-persistent-workers", 174),
)}
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
