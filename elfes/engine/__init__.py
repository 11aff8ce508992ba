"""The ELFES training engine: exact accumulation, evaluation, EMA, checkpoints and bitwise resume.

>>> from elfes.engine import Trainer, TrainConfig, StepOutput, MeanMetric
"""

import torch.distributed

from elfes.records import RunLogger

from .checkpoint import CheckpointError, Weights
from .config import Interval, Monitor, TrainConfig, TrainState
from .evaluator import Evaluator
from .groups import weight_decay_groups
from .heartbeat import Heartbeat
from .metrics import MaxMetric, MeanMetric, Metric, RootMeanSquareMetric, SumMetric
from .objective import Objective, Step, StepOutput
from .schedule import WarmupDecay
from .stop import StopRequest
from .trainer import Trainer
from .weights import export_checkpoint, export_weights, load_weights

if torch.distributed.is_available():
    # Imported now, before any process group exists. Imported later (DDP does, through torch._dynamo),
    # it binds the live group.WORLD as a default argument of its functions, so destroy_process_group()
    # cannot free the group: gloo's threads then run until interpreter shutdown, where one that frees
    # a collective's tensors aborts the process ("terminate called without an active exception").
    import torch.distributed.nn  # noqa: F401

__all__ = [
    "CheckpointError",
    "Evaluator",
    "Heartbeat",
    "Interval",
    "MaxMetric",
    "MeanMetric",
    "Metric",
    "Monitor",
    "Objective",
    "RootMeanSquareMetric",
    "RunLogger",
    "Step",
    "StepOutput",
    "StopRequest",
    "SumMetric",
    "TrainConfig",
    "TrainState",
    "Trainer",
    "WarmupDecay",
    "Weights",
    "export_checkpoint",
    "export_weights",
    "load_weights",
    "weight_decay_groups",
]
