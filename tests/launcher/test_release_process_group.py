"""The runtime frees the process group before a task exits: no gloo thread is left to abort the
process at interpreter shutdown (SIGABRT, "terminate called without an active exception")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launching import torchrun

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="threads are listed in /proc (Linux)")


def test_no_gloo_thread_outlives_the_release_of_a_group_main_left_behind(tmp_path):
    torchrun(Path(__file__).with_name("release_case.py"), str(tmp_path))
    for rank in (0, 1):
        threads = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        assert threads["before_release"], "the case no longer shows the problem the release exists for"
        assert threads["after_release"] == []
