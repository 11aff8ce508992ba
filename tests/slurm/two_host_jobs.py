"""Entrypoints of the two-host tests (``test_two_hosts.py``), imported inside the jobs from the repository root.

``ranked_quickstart`` records, before training, what this task was told about its place in the job (the
torch distributed variables the runtime exported, SLURM's own numbering, the ``Job`` fields and the host)
in ``RUN_DIR/ranks/rank-<RANK>.json``, then trains the quickstart model (slowed like the launcher tests'):
the run records' ``started`` event then tells the size of the process group that formed.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

from elfes.files import write_text_atomically
from tests.launcher.entrypoints import slow_quickstart

ENVIRONMENT = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
               "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_RESTART_COUNT")


def rank_record_file(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / "ranks" / f"rank-{rank}.json"


def ranked_quickstart(job: Any) -> Any:
    """Record this task's ranks (every attempt overwrites its own file), then train the quickstart model."""
    record = {
        "environment": {name: os.environ.get(name) for name in ENVIRONMENT},
        "job": {"rank": job.rank, "local_rank": job.local_rank, "world_size": job.world_size, "attempt": job.attempt},
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }
    file = rank_record_file(job.run_dir, job.rank)
    file.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(file, json.dumps(record) + "\n")
    return slow_quickstart(job)
