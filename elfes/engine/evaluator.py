"""Evaluation that counts every real sample exactly once, on any number of ranks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import send_to_device
from torch import nn
from torch.utils.data import DataLoader

from elfes.contract import Phase

from .collectives import sum_over_ranks
from .data import iterate_sparing_workers, prepare_data_loader
from .fsdp import is_sharded, reshard
from .heartbeat import Heartbeat
from .loss import loss_path
from .metrics import MetricAccumulator
from .objective import Objective, Step
from .rng import capture_rng, restore_rng


class Evaluator:
    """Runs ``step`` over named evaluation loaders and reduces the metrics over all ranks.

    Loaders are sharded without padding (ranks may hold uneven or no batches), so each sample is
    counted once. The model's mode and the training RNG are restored afterwards, and DDP is
    unwrapped so ranks run independent forwards; the step must not run collectives itself. A model
    sharded with FSDP2 gathers its parameters in each forward, so there every rank runs as many
    forwards as the rank with the most batches: a rank out of batches repeats one whose result is not
    counted. Every rank must call :meth:`evaluate`.

    >>> evaluator = Evaluator(accelerator, {"validation": validation_loader}, step)  # doctest: +SKIP
    >>> evaluator.evaluate(model)["validation"]["loss"]  # doctest: +SKIP
    """

    def __init__(
        self,
        accelerator: Accelerator,
        dataloaders: Mapping[str, DataLoader[Any]],
        step: Step,
        *,
        requires_grad: bool = False,
        objective: Objective | None = None,
    ) -> None:
        if not dataloaders:
            raise ValueError("Evaluator(dataloaders=...) is empty; pass at least one {name: DataLoader}.")
        for name, loader in dataloaders.items():
            if not isinstance(name, str) or not name or "/" in name:
                raise ValueError(f"Evaluation loader name {name!r} is invalid; use a non-empty name without '/'.")
            if _drops_last(loader):
                raise ValueError(
                    f"Evaluation loader {name!r} has drop_last=True, which would leave samples out of the "
                    "metrics; build it with drop_last=False."
                )
        self.accelerator = accelerator
        self.unsharded = dict(dataloaders)  # where a rank without batches finds one to run in lockstep
        self.step = step
        self.requires_grad = requires_grad
        self.objective = objective
        self.loss = loss_path(objective, accelerator.device)
        state = accelerator.state
        self.dataloaders = {
            name: prepare_data_loader(
                loader,
                device=accelerator.device,
                num_processes=state.num_processes,
                process_index=state.process_index,
                split_batches=False,
                put_on_device=True,
                even_batches=False,
            )
            for name, loader in dataloaders.items()
        }

    def evaluate(self, model: nn.Module, *, heartbeat: Heartbeat | None = None) -> dict[str, dict[str, float]]:
        """Evaluate ``model`` (prepared or plain) on every loader: ``{loader: {metric: value}}``.
        ``heartbeat`` gets a beat per batch (a watchdog then tells a long evaluation from a hang), the first
        of each loader a :meth:`~elfes.engine.Heartbeat.beat_first` (until its second batch is fetched)."""
        if heartbeat is not None and heartbeat.phase == Phase.ENDED:
            heartbeat = None  # after train() returned the job's own code runs unwatched, an evaluation too
        module = self.accelerator.unwrap_model(model, keep_fp32_wrapper=True, keep_torch_compile=True)
        modes = [(submodule, submodule.training) for submodule in module.modules()]
        training_rng = capture_rng()
        module.eval()
        reshard(module)
        try:
            return {name: self._evaluate_loader(module, name, heartbeat) for name in self.dataloaders}
        finally:
            for submodule, training in modes:  # a user's frozen submodule stays in eval mode
                submodule.train(training)
            restore_rng(training_rng)
            reshard(module)

    def _evaluate_loader(self, module: nn.Module, name: str, heartbeat: Heartbeat | None) -> dict[str, float]:
        loader = self.dataloaders[name]
        accumulator = MetricAccumulator()
        if heartbeat is not None:  # the loader's workers start, its first batch may initialise lazily
            heartbeat.beat_first(Phase.EVALUATING)
        batches = iterate_sparing_workers(loader)
        if is_sharded(module):
            batches = self._in_lockstep(module, batches, name)
        for index, batch in enumerate(batches):
            if heartbeat is not None and index > 0:  # the first batch's compute is still the first's
                heartbeat.beat(Phase.EVALUATING)
            counts = self.loss.batch_counts(batch)
            with torch.set_grad_enabled(self.requires_grad):
                output = self.step(module, batch)
            self.loss.record(accumulator, output, counts)
            accumulator.update(output.metrics)
        return self.loss.finish(accumulator.compute(self.accelerator))

    def _in_lockstep(self, module: nn.Module, batches: Any, name: str) -> Any:
        """This rank's batches, while any rank has one left: then the step runs on a batch already seen here (or
        the loader's first), its result dropped, so that every rank runs the sharded model's forward as often."""
        spare = None
        while True:
            batch = next(batches, None)
            flag = torch.tensor(0.0 if batch is None else 1.0, dtype=torch.float64, device=self.accelerator.device)
            if not sum_over_ranks(flag, self.accelerator) > 0:
                return
            if batch is not None:
                spare = batch
                yield batch
                continue
            if spare is None:
                spare = send_to_device(next(iter(self.unsharded[name])), self.accelerator.device)
            with torch.set_grad_enabled(self.requires_grad):
                self.step(module, spare)


def _drops_last(loader: DataLoader[Any]) -> bool:
    batch_sampler = getattr(loader, "batch_sampler", None)
    return bool(getattr(loader, "drop_last", False) or getattr(batch_sampler, "drop_last", False))
