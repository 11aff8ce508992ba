"""The process group under a trainer's DDP wrapper is freed by the engine, from Python, never by the
wrapper's Reducer with the GIL held (elfes/engine/process_group.py): a rank whose trainer goes while a
gloo worker still frees a collective's tensors neither hangs nor keeps gloo's threads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="threads are listed in /proc (Linux)"),
]


def test_a_trainer_dropped_while_gloo_frees_a_collective_neither_hangs_nor_keeps_threads(run_distributed, tmp_path):
    run_distributed(Path(__file__).with_name("process_group_case.py"), str(tmp_path), timeout_s=120)
    assert [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in (0, 1)] == [[], []]
