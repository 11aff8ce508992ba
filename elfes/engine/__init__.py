"""The ELFES training engine: exact accumulation, evaluation, EMA, checkpoints and bitwise resume.

>>> from elfes.engine import Trainer, TrainConfig, StepOutput, MeanMetric
"""

from elfes.records import RunLogger

from .checkpoint import CheckpointError, Weights
from .config import Interval, Monitor, TrainConfig, TrainState
from .evaluator import Evaluator
from .groups import weight_decay_groups
from .metrics import MaxMetric, MeanMetric, Metric, RootMeanSquareMetric, SumMetric
from .objective import Objective, Step, StepOutput
from .schedule import WarmupDecay
from .stop import StopRequest
from .trainer import Trainer
from .weights import export_weights, load_weights

__all__ = [
    "CheckpointError",
    "Evaluator",
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
    "export_weights",
    "load_weights",
    "weight_decay_groups",
]
