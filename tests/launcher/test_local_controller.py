"""A local job's controller as liveness finds it in /proc: ELFES's (launcher/submit/local_controller.py) and
submitit's, which runs the jobs started before ELFES had its own. What the controller records, end to end:
test_failure_causes.py."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from elfes.launcher.rundir.liveness import CONTROLLER_MODULES, LOCAL_CONTROLLER_MODULE, local_processes
from elfes.launcher.rundir.paths import RunPaths
from elfes.launcher.rundir.status_reading import ProcessTable


def test_the_controller_module_that_liveness_looks_for_is_the_one_submissions_start() -> None:
    assert importlib.util.find_spec(LOCAL_CONTROLLER_MODULE) is not None
    assert LOCAL_CONTROLLER_MODULE == "elfes.launcher.submit.local_controller"


@pytest.mark.parametrize("module", CONTROLLER_MODULES)
def test_a_controller_of_either_module_is_the_runs_controller(tmp_path: Path, module: str) -> None:
    """A process whose command line is ``python ... -m MODULE RUN_DIR/submitit`` counts as the run's controller
    for `elfes status` (one /proc scan) and for the verbs that signal a run; another run's does not."""
    paths, other = RunPaths(tmp_path / "run"), RunPaths(tmp_path / "other")
    paths.submitit.mkdir(parents=True)
    # Python ignores what follows -c's program: the command line names the module and the folder, as a controller's.
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "-m", module, str(paths.submitit)])
    try:
        assert local_processes(paths)["controller"] == [sleeper.pid]
        assert local_processes(other)["controller"] == []
        table = ProcessTable.snapshot()
        assert table.of(paths)["controller"] == [sleeper.pid] and table.alive(paths) and not table.alive(other)
    finally:
        os.kill(sleeper.pid, signal.SIGKILL)
        sleeper.wait()
    assert local_processes(paths)["controller"] == []
