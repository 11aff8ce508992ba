"""One rank of a two-rank run whose trainer goes after ``accelerator.end_training()`` while a gloo worker
still holds a collective's tensors, as a job's ``main`` returns right after a stop's last barrier.

Rank 0 starts an all-reduce of a fresh tensor and drops its own references to both, so that the worker
frees the tensor (which takes the GIL) once the collective ends; rank 1 joins the collective only after
that (a marker file). Rank 0 then keeps the GIL while it drops the trainer: if the DDP wrapper's Reducer
freed the group, the join of gloo's threads would wait for the worker and the worker for the GIL. Then
the engine releases the groups it held; the gloo threads left are written to ``OUT/rank-<R>.json``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
from workloads import RunSpec, build, gloo_threads_left

from elfes.engine.process_group import release_process_groups

if __name__ == "__main__":
    out, rank = Path(sys.argv[1]), int(os.environ["RANK"])
    run = build(RunSpec(epochs=1))
    run.trainer.train(run.config)
    group = run.trainer.model.process_group
    run.accelerator.end_training()  # the group leaves torch's registry; the wrapper still references it
    dropped = out / "rank-0-dropped"
    if rank == 0:
        tensor = torch.ones(1)
        work = group.allreduce([tensor])  # waits for rank 1 in a gloo worker
        del tensor, work, group
        sys.setswitchinterval(1000.0)  # the main thread keeps the GIL from here to the trainer's end
        dropped.write_text("")
        del run
        sys.setswitchinterval(0.005)
    else:
        while not dropped.exists():
            time.sleep(0.01)  # polling interval of the marker
        group.allreduce([torch.ones(1)]).wait()
        del group, run
    release_process_groups()
    (out / f"rank-{rank}.json").write_text(json.dumps(gloo_threads_left()))
