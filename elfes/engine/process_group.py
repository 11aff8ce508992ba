"""Who frees the process group under the engine's DDP wrapper: Python, never the wrapper's Reducer.

Freeing a gloo group joins its worker threads. A worker may still be releasing a finished collective
(a barrier keeps the collectives before it), and freeing its tensors takes the GIL. torch drops the
GIL while a group's Python object frees it, but the DDP wrapper's C++ Reducer also references the
group and is freed with the GIL held. Once ``accelerator.end_training()`` has taken the group out of
torch's registry, the Reducer holds the last reference; when the wrapper goes (``main`` returns and
its locals are freed), the join waits for the worker and the worker for the GIL: the rank hangs, and
a local job whose other rank exited is never relaunched.

So the engine keeps a Python reference to the group of each wrapper it makes, and drops it once the
wrapper is gone, from the main thread: at :func:`release_process_groups` (the launcher's runtime calls
it after ``main``; the next ``Trainer`` does too) and at interpreter exit, before shutdown begins.
"""

from __future__ import annotations

import atexit
import gc
import weakref
from typing import Any

from torch import nn

# (the DDP wrapper, weakly; its process group's Python object)
_held: list[tuple[weakref.ref[nn.Module], Any]] = []


def hold_process_group(wrapper: nn.Module) -> None:
    """Keep the process group of DDP wrapper ``wrapper`` (or of the one a compiled model wraps) until the
    wrapper is gone; nothing for a model that is no DDP wrapper."""
    wrapper = getattr(wrapper, "_orig_mod", wrapper)
    group = getattr(wrapper, "process_group", None)
    if group is not None and hasattr(wrapper, "reducer"):
        _held.append((weakref.ref(wrapper), group))


def release_process_groups() -> None:
    """Drop the groups held for wrappers that are gone (after collecting those in reference cycles).

    A group whose last reference goes here is freed with the GIL released, so gloo's workers finish and
    are joined. Call from the main thread once the trainer's wrapper is no longer used.
    """
    if not _held:
        return
    gc.collect()
    _held[:] = [(wrapper, group) for wrapper, group in _held if wrapper() is not None]


atexit.register(release_process_groups)
