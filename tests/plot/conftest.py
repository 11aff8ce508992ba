"""The plot tests' shared run: ``tracked_runs`` (session), the runs of interrupted_run.py's
:func:`~interrupted_run.run_tracked_jobs`, started by the first test of the session to ask, on any xdist worker,
and read by every later one (the plot's and the trackers' test files each hold a worker of their own)."""

from __future__ import annotations

import pytest
from interrupted_run import TrackedRuns, run_tracked_jobs
from shared_runs import session_folder

from elfes.files import exclusive_lock


@pytest.fixture(scope="session")
def tracked_runs(tmp_path_factory: pytest.TempPathFactory) -> TrackedRuns:
    folder = session_folder(tmp_path_factory, "plot-tracked-runs")
    record = folder / "runs.json"
    with exclusive_lock(folder / "lock"):  # a second worker waits for the first one's runs, then reads them
        if not record.exists():
            record.write_text(run_tracked_jobs(folder).to_json())
        return TrackedRuns.from_json(record.read_text())
