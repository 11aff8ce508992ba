"""accelerate's ``prepare_data_loader``, without importing HF ``datasets`` for a loader that cannot hold one.

Wherever ``datasets`` is installed, accelerate imports it (with pandas and pyarrow: 1.3 s of every rank's
start-up on a two-core machine) each time it shards a loader over ranks, to ask whether the dataset is one of its
``IterableDataset``\\ s. A dataset can only be one if ``datasets`` is already imported, so that is what it is asked
instead; a loader of an HF dataset is prepared exactly as accelerate prepares it.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import accelerate.data_loader
from torch.utils.data import DataLoader

_SWAP = threading.Lock()


def _datasets_imported() -> bool:
    return "datasets" in sys.modules


@contextmanager
def _asking_only_if_imported() -> Iterator[None]:
    with _SWAP:
        installed = accelerate.data_loader.is_datasets_available
        accelerate.data_loader.is_datasets_available = _datasets_imported
        try:
            yield
        finally:
            accelerate.data_loader.is_datasets_available = installed


def prepare_data_loader(dataloader: DataLoader[Any], **options: Any) -> Any:
    """:func:`accelerate.data_loader.prepare_data_loader` of ``dataloader`` with ``options``."""
    with _asking_only_if_imported():
        return accelerate.data_loader.prepare_data_loader(dataloader, **options)
