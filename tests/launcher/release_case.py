"""One rank of a two-rank run that ends like a careless job's attempt: it trains through the engine,
never calls ``accelerator.end_training()`` and leaves its objects in a reference cycle, so the group
outlives ``main``. Then the runtime releases the process group. Writes the gloo threads running in this
process before and after the release to ``OUT/rank-<R>.json``."""

from __future__ import annotations

import gc
import json
import os
import sys
from pathlib import Path

from workloads import gloo_threads, gloo_threads_left  # tests/engine, on PYTHONPATH

import elfes.engine  # noqa: F401  as in a job: imported before any process group forms
from elfes.launcher.job.runtime import release_process_group


def attempt() -> None:
    from workloads import RunSpec, build

    run = build(RunSpec(epochs=1))
    run.trainer.train(run.config)
    run.extras["run"] = run  # a cycle: only the garbage collector frees the DDP wrapper and its group


if __name__ == "__main__":
    out = Path(sys.argv[1])
    gc.disable()  # so that the cycle is certainly still there when the threads are listed
    attempt()
    during = gloo_threads()
    release_process_group()
    rank = os.environ["RANK"]
    (out / f"rank-{rank}.json").write_text(json.dumps({"before_release": during, "after_release": gloo_threads_left()}))
