"""A character-level language model on the standard library's source, as an ELFES job.

    elfes submit examples/charlm/job.yaml --follow          # two CPU ranks, a few minutes
    elfes submit examples/charlm/slurm-gpu.yaml --follow    # four GPUs on a SLURM cluster

Every task calls :func:`main` with a ``job`` (``elfes.launcher.job.runtime.Job``): ``job.config`` is the
spec's ``config`` (keys of :data:`DEFAULTS`), ``job.resume_from`` is the run's ``last`` after a
preemption, and ``job.stop`` already catches the stop signals. The documents differ in length, so
the loss of a batch is its mean over real (unpadded) characters, and ``loss_weight`` is their count:
the engine then weighs every character of an update alike, whichever rank and microbatch it is in.
On CUDA the model trains in bf16 with fused AdamW. With ``shard: true`` the model is sharded over the
ranks with FSDP2 (:func:`examples.charlm.model.shard`): each rank holds a share of every block's weights and
optimizer state, and every checkpoint is a folder of each rank's shards.
"""

from __future__ import annotations

import math
import platform
from typing import Any

import torch
import torch.nn.functional as F
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import parse_flag_from_env, set_seed
from torch import nn
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader

from elfes.engine import (
    Evaluator,
    Interval,
    MeanMetric,
    Monitor,
    RunLogger,
    Step,
    StepOutput,
    TrainConfig,
    Trainer,
    TrainState,
    WarmupDecay,
    weight_decay_groups,
)
from examples.charlm.data import IGNORED, VOCABULARY, DocumentStream, LibraryText, pad
from examples.charlm.model import CharTransformer, shard

# What `config:` in a spec may set; anything else is refused by name.
DEFAULTS: dict[str, Any] = {
    # data: characters of training text, the longest document (the model's context), and how it is read:
    # "documents" (a shuffled map-style dataset) or "stream" (each rank's own stream of randomly cropped
    # documents, resumed from its state_dict)
    "train_chars": 1_000_000, "context": 128, "reader": "documents",
    # model, and whether it is sharded over the ranks (FSDP2) rather than replicated (DDP)
    "width": 128, "depth": 4, "heads": 4, "dropout": 0.1, "shard": False,
    # optimization: documents per rank and microbatch, microbatches per update
    "epochs": 3, "batch_size": 16, "accumulation": 2, "lr": 3e-3, "weight_decay": 0.1, "warmup_steps": 20,
    "ema_decay": 0.95,
    # bookkeeping, in optimizer steps
    "evaluate_every": 50, "checkpoint_every": 50, "log_every": 5, "seed": 0,
}


def step(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> StepOutput:
    """The mean next-character loss over the batch's real characters, weighted by their count."""
    inputs, targets = batch
    logits = model(inputs)
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORED)
    characters = (targets != IGNORED).sum()
    bits = MeanMetric(loss.detach() * characters / math.log(2), characters)
    return StepOutput(loss=loss, num_samples=len(inputs), loss_weight=characters, metrics={"bits_per_character": bits})


def no_decay(name: str, parameter: nn.Parameter) -> bool:
    """Biases, norms and the (tied) embeddings are not decayed."""
    return parameter.ndim < 2 or name.endswith("embedding.weight")


def main(job: Any) -> TrainState:
    """Train the model of ``job.config``; every rank calls it. Returns the trainer's state."""
    return run(job, step)


def run(job: Any, step_function: Step) -> TrainState:
    """:func:`main` with another step function (tests slow it down to land signals mid-run)."""
    unknown = sorted(set(job.config) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"config has unknown keys {unknown}; the charlm job reads {sorted(DEFAULTS)}.")
    config = {**DEFAULTS, **job.config}
    # The launcher sets ACCELERATE_USE_CPU=1 for a job with gpus_per_node: 0, even on a GPU machine.
    cuda = torch.cuda.is_available() and not parse_flag_from_env("ACCELERATE_USE_CPU")
    accelerator = Accelerator(
        gradient_accumulation_steps=config["accumulation"],
        # A sharded model computes in bf16 by its FSDP2 policy (model.shard); Accelerate's autocast is for DDP.
        mixed_precision="bf16" if cuda and not config["shard"] else "no",
        dataloader_config=DataLoaderConfiguration(even_batches=False),
    )
    set_seed(config["seed"])
    model = CharTransformer(VOCABULARY, config["context"], config["width"], config["depth"], config["heads"],
                            config["dropout"])
    if config["shard"]:  # before the optimizer, which is then built over the shards
        shard(model, "cuda" if cuda else "cpu", accelerator.num_processes, bf16=cuda)
    optimizer = torch.optim.AdamW(weight_decay_groups(model, config["weight_decay"], exclude=no_decay),
                                  lr=config["lr"], betas=(0.9, 0.95), fused=cuda)
    data = {split: LibraryText(split, train_chars=config["train_chars"], context=config["context"])
            for split in ("train", "validation")}
    if config["reader"] == "stream":
        stream = DocumentStream(data["train"].documents, rank=accelerator.process_index,
                                world_size=accelerator.num_processes, seed=config["seed"])
        train_loader = DataLoader(stream, batch_size=config["batch_size"], collate_fn=pad)
    elif config["reader"] == "documents":
        train_loader = DataLoader(data["train"], batch_size=config["batch_size"], shuffle=True, collate_fn=pad)
    else:
        raise ValueError(f"config reader is {config['reader']!r}; use 'documents' or 'stream'.")
    validation_loader = DataLoader(data["validation"], batch_size=2 * config["batch_size"], collate_fn=pad)
    evaluator = Evaluator(accelerator, {"validation": validation_loader}, step_function)
    with RunLogger(job.run_dir, is_main_process=accelerator.is_main_process) as logger:
        trainer = Trainer(accelerator, model, optimizer, train_loader, step_function, evaluator=evaluator,
                          ema_decay=config["ema_decay"], logger=logger)
        train_config = TrainConfig(
            epochs=config["epochs"], log_every=config["log_every"], max_grad_norm=1.0,
            evaluate_every=Interval(config["evaluate_every"], "step"),
            checkpoint_every=Interval(config["checkpoint_every"], "step"), monitor=Monitor("validation/loss"),
        )
        trainer.scheduler = LambdaLR(optimizer, WarmupDecay(
            total_steps=trainer.planned_steps(train_config), warmup_steps=config["warmup_steps"],
            start_factor=0.1, minimum_factor=0.1, decay="cosine"))
        metadata = {"dataset": f"Python {platform.python_version()} standard library source",
                    "train_documents": len(data["train"]),
                    "validation_documents": len(data["validation"]), "seed": config["seed"]}
        state = trainer.train(train_config, checkpoint_dir=job.checkpoint_dir, resume_from=job.resume_from,
                              stop=job.stop, metadata=metadata)
        if state.stop_reason is None:
            trainer.save_model(job.run_dir / "model.pt", weights="ema")
    accelerator.end_training()  # tears the process group down on every rank
    return state
