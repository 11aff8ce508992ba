"""One rank of a two-rank evaluation without a ``Trainer``: prepare a model, evaluate it, and exit.

Right after the evaluation the main thread keeps the GIL until interpreter shutdown, as a loaded
machine's scheduler may: a gloo worker that still had to release the Python object of a tensor of the
evaluation's collectives could then only take the GIL during shutdown, which aborts the rank.
"""

from __future__ import annotations

import sys

from accelerate import Accelerator, DataLoaderConfiguration
from torch import nn
from torch.utils.data import DataLoader
from workloads import RegressionData, mse_step

from elfes.engine import Evaluator

if __name__ == "__main__":
    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(even_batches=False))
    model = accelerator.prepare(nn.Linear(4, 1))
    loaders = {
        "validation": DataLoader(RegressionData(13, seed=2), batch_size=4),
        "holdout": DataLoader(RegressionData(5, seed=3), batch_size=2),
    }
    metrics = Evaluator(accelerator, loaders, mse_step).evaluate(model)
    print(f"rank {accelerator.process_index}: {metrics}", flush=True)
    sys.setswitchinterval(1000.0)
