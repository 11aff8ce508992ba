"""The training data path: what is drawn where, what is saved of loaders, and how an epoch resumes.

- :mod:`.stream`: :class:`TrainingData`, the prepared loader read without look-ahead, and resumed.
- :mod:`.fetch`: seeded batch fetches in DataLoader workers.
- :mod:`.state`: which parts of a loader keep state of their own.
- :mod:`.checks`: refusals of settings under which ranks would not train on exact, equal shards.
- :mod:`.workers`: worker processes that survive the job's stop signals.
- :mod:`.prepare`: accelerate's sharding of a loader over ranks, without importing HF ``datasets`` needlessly.
"""

from .checks import check_process_group
from .prepare import prepare_data_loader
from .stream import TrainingData
from .workers import iterate_sparing_workers, shut_down_persistent_workers

__all__ = ["TrainingData", "check_process_group", "iterate_sparing_workers", "prepare_data_loader", "shut_down_persistent_workers"]
