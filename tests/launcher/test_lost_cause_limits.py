"""Why a vanished attempt ended, from the time limits of its recorded spec: read from ``resources`` and
``slurm`` alone (``elfes status`` of a sweep asks it of every member whose job vanished)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import yaml
from run_fixtures import make_run

from elfes.launcher.rundir import state as run_state
from elfes.launcher.rundir.lookup import recorded_limits
from elfes.launcher.rundir.lost_cause import GENERIC, last_printed_error, lost_causes


def _vanished_long_ago(tmp_path: Path, resources: dict):
    paths = make_run(tmp_path, outcome=None)  # its attempt is open: the job vanished without recording its end
    spec = yaml.safe_load(paths.spec.read_text())
    spec["resources"].update(resources)
    paths.spec.write_text(yaml.safe_dump(spec, sort_keys=False))
    data = json.loads(paths.state.read_text())  # started 61 minutes ago; its files were written until now
    data["attempts"][-1]["started_at"] = (datetime.now(timezone.utc) - timedelta(minutes=61)).isoformat()
    paths.state.write_text(json.dumps(data))
    return paths, run_state.load_state(paths)


def test_an_attempt_that_lived_to_the_recorded_limit_is_said_killed_at_it(tmp_path: Path):
    paths, state = _vanished_long_ago(tmp_path, {"timeout_min": 60})
    limits = recorded_limits(paths)
    assert limits.resources.timeout_min == 60
    (cause,) = [cause for cause in lost_causes(paths, state) if "time limit" in cause]
    assert cause.startswith("time limit (resources.timeout_min = 60) reached before it saved `last`")
    assert f"slurm.signal_delay_s = {limits.slurm.signal_delay_s} s" in cause


def test_a_recorded_spec_whose_limits_cannot_be_read_names_no_limit_and_raises_nothing(tmp_path: Path):
    paths, state = _vanished_long_ago(tmp_path, {"timeout_min": "sixty"})
    assert lost_causes(paths, state) == [GENERIC]
    paths.spec.write_text("name: [unclosed\n")
    assert lost_causes(paths, state) == [GENERIC]
    paths.spec.unlink()
    assert recorded_limits(paths) is None and lost_causes(paths, state) == [GENERIC]


def test_the_runtime_failure_line_is_found_with_and_without_its_time_and_level(tmp_path: Path):
    """The rank log's "elfes: attempt N failed on rank R: ..." line names a vanished attempt's error, whether the
    runtime's logging put a time and a level first (launcher/job/job_log.py) or not (logs written before it)."""
    paths = make_run(tmp_path, outcome=None)
    attempt = run_state.load_state(paths).last_attempt
    log = paths.rank_log(attempt.number, 0, "err")
    log.write_text(f"2026-12-05 14:03:07,512 ERROR elfes: attempt {attempt.number} failed on rank 0: OSError: "
                   "[Errno 30] Read-only file system\n")
    assert last_printed_error(paths, attempt).message == "OSError: [Errno 30] Read-only file system"
    log.write_text(f"elfes: attempt {attempt.number} failed on rank 0: ValueError: bad batch\n")
    assert last_printed_error(paths, attempt).message == "ValueError: bad batch"
