"""What an ``entrypoint:`` job's function gets and how it is found: :class:`Job` (``main(job)``'s argument),
:func:`load_entrypoint`, and :func:`release_process_group`, which frees the process group ``main`` formed.
launcher/job/attempt_runner.py runs ``main``. Torch-free at import time.
"""

from __future__ import annotations

import gc
import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast


@dataclass
class Job:
    """What ``main(job)`` gets, on every rank. ``main`` returns the ``TrainState`` of ``trainer.train``.

    >>> def main(job):
    ...     accelerator = Accelerator()                # the process group forms from the exported env
    ...     trainer = Trainer(accelerator, ...)
    ...     with RunLogger(job.run_dir, is_main_process=accelerator.is_main_process) as logger:
    ...         return trainer.train(TrainConfig(**job.config), checkpoint_dir=job.checkpoint_dir,
    ...                              resume_from=job.resume_from, stop=job.stop)
    """

    config: dict[str, Any]  # the spec's `config`, a plain dict
    run_dir: Path
    checkpoint_dir: Path  # RUN_DIR/checkpoints
    # RUN_DIR/checkpoints/last, or the run's newest complete checkpoint when `last` is missing or dangling;
    # None before the run published one (launcher/job/resume_point.py)
    resume_from: Path | None
    stop: Any  # an elfes.engine.StopRequest, already catching SIGINT, SIGTERM and the requeue signal
    attempt: int  # starts of this run, from 1, counting on across requeues and `elfes resume`
    rank: int
    local_rank: int
    world_size: int
    name: str = ""
    job_id: str = ""
    executor: str = ""


def load_entrypoint(entrypoint: str) -> Callable[[Job], Any]:
    """Import ``"package.module:function"`` and return the function."""
    module_name, _, function_name = entrypoint.partition(":")
    module = importlib.import_module(module_name)
    try:
        function = getattr(module, function_name)
    except AttributeError:
        raise AttributeError(
            f"entrypoint {entrypoint!r}: module {module_name} has no attribute {function_name!r}; "
            f"define `def {function_name}(job):` there or fix the spec's entrypoint"
        ) from None
    if not callable(function):
        raise TypeError(f"entrypoint {entrypoint!r} is a {type(function).__name__}, not a function")
    return cast("Callable[[Job], Any]", function)


def release_process_group() -> None:
    """Tear down the torch process group that ``main`` formed, and free it now, before the task exits.

    Freed only at interpreter shutdown, a gloo worker thread that releases a collective's tensors then
    aborts the process (SIGABRT), which would turn a finished or requeued attempt into a failed one.
    ``accelerator.end_training()`` destroys the group, but the DDP wrappers the accelerator keeps may
    still reference it (collected here), and the engine holds it past its wrapper, so that the
    wrapper's Reducer, which would free it with the GIL held while a gloo worker waits for the GIL, is
    never the last to let go (elfes/engine/process_group.py). Dropped here, it is freed with the GIL
    released, and gloo's threads are joined.
    """
    distributed = sys.modules.get("torch.distributed")
    if distributed is None or not distributed.is_available():
        return
    if distributed.is_initialized():
        distributed.destroy_process_group()
    gc.collect()
    if "elfes.engine.process_group" in sys.modules:  # the engine trained in this process
        from elfes.engine.process_group import release_process_groups

        release_process_groups()
