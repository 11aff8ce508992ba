"""Training jobs whose data draws random numbers the way real pipelines do; used by test_data_pipelines.py.

A :class:`DataCase` names where the randomness comes from (the global torch, NumPy or Python
generator), how the data is read (a map-style dataset in this process or in workers, a stream, a
torchdata ``StatefulDataLoader``, a Hugging Face streaming dataset) and how far the job trains.
:func:`train` runs it once, from ``last`` when asked, and returns every tensor a resume must reproduce.

    python data_jobs.py CASE_JSON CHECKPOINT_DIR KILL_AT     # dies by SIGKILL in microbatch KILL_AT
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import signal
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import set_seed
from rich.console import Console
from torch import nn
from torch.utils.data import (
    DataLoader,
    Dataset,
    IterableDataset,
    SubsetRandomSampler,
    WeightedRandomSampler,
    get_worker_info,
)
from workloads import fresh_accelerate, snapshot

from elfes.engine import Interval, StepOutput, StopRequest, TrainConfig, Trainer
from elfes.records import RunLogger

IMAGES = 40
SIDE = 8


def draw(source: str, kind: str, size: tuple[int, ...] = ()) -> Any:
    """One random draw from the global generator of ``source``, as torchvision-style transforms make them."""
    if source == "torch":
        if kind == "uniform":
            return torch.rand(size or (1,))
        if kind == "offset":
            return int(torch.randint(0, 3, (1,)).item())
        return torch.randn(size)
    if source == "numpy":
        if kind == "uniform":
            return torch.from_numpy(np.random.rand(*(size or (1,))).astype(np.float32))
        if kind == "offset":
            return int(np.random.randint(0, 3))
        return torch.from_numpy(np.random.standard_normal(size).astype(np.float32))
    if kind == "uniform":
        return torch.tensor([random.random() for _ in range(int(np.prod(size or (1,))))]).reshape(size or (1,))
    if kind == "offset":
        return random.randint(0, 2)
    return torch.tensor([random.gauss(0.0, 1.0) for _ in range(int(np.prod(size)))]).reshape(size)


def base_images() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    images = torch.rand(IMAGES, 3, SIDE + 2, SIDE + 2, generator=generator)
    labels = (images.mean(dim=(1, 2, 3)) > 0.5).long()
    return images, labels


def augment(image: torch.Tensor, source: str) -> torch.Tensor:
    """A random crop, a random horizontal flip and noise: RandomCrop, RandomHorizontalFlip and GaussianNoise."""
    top, left = draw(source, "offset"), draw(source, "offset")
    crop = image[:, top : top + SIDE, left : left + SIDE]
    if float(draw(source, "uniform")[0]) < 0.5:
        crop = crop.flip(-1)
    return crop + 0.05 * draw(source, "normal", tuple(crop.shape))


class AugmentedImages(Dataset):
    """A map-style image dataset whose ``__getitem__`` augments with draws from one global generator."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.images, self.labels = base_images()

    def __len__(self) -> int:
        return IMAGES

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return augment(self.images[index], self.source), self.labels[index]


class MaskingCollate:
    """A collate function that masks random pixels (as masked-modelling pipelines do), from one generator."""

    def __init__(self, source: str) -> None:
        self.source = source

    def __call__(self, samples: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        images = torch.stack([image for image, _ in samples])
        labels = torch.stack([label for _, label in samples])
        keep = draw(self.source, "uniform", tuple(images.shape)) > 0.1
        return images * keep, labels


class ImageStream(IterableDataset):
    """The same images as a stream, augmented as they are read; each worker reads its own share.

    With ``stateful`` it offers ``state_dict``/``load_state_dict`` (the position in the stream).
    """

    def __init__(self, source: str, *, stateful: bool, length: bool = True) -> None:
        self.source = source
        self.images, self.labels = base_images()
        self.stateful = stateful
        self.has_length = length
        self.position = 0  # samples of this epoch read so far (by this process or worker)
        self.resume_position = 0
        self.epoch = 0

    def __len__(self) -> int:
        if not self.has_length:
            raise TypeError("this stream has no length")
        return IMAGES

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        worker = get_worker_info()
        share = range(IMAGES) if worker is None else range(worker.id, IMAGES, worker.num_workers)
        order = torch.randperm(IMAGES, generator=torch.Generator().manual_seed(100 + self.epoch))
        start, self.resume_position = self.resume_position, 0
        for offset, index in enumerate(list(share)[start:], start=start):
            self.position = offset + 1
            image_index = int(order[index])
            yield augment(self.images[image_index], self.source), self.labels[image_index]


class StatefulImageStream(ImageStream):
    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.resume_position = state["position"]  # the next iteration starts there


class ResettingStream(IterableDataset):
    """A stream that keeps its place (``state_dict``) and, written the natural way, rewinds after its last
    item: the rewind runs only when the loop asks for the item after the last (as ``for`` does)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.images, self.labels = base_images()
        self.position = 0
        self.epoch = 0

    def __len__(self) -> int:
        return IMAGES

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        order = torch.randperm(IMAGES, generator=torch.Generator().manual_seed(100 + self.epoch))
        while self.position < IMAGES:
            image_index = int(order[self.position])
            self.position += 1
            yield augment(self.images[image_index], self.source), self.labels[image_index]
        self.position = 0

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = state["position"]


class ResumableSampler(torch.utils.data.Sampler):
    """A sampler of the user's own that keeps its place in the epoch (``state_dict``/``load_state_dict``)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.epoch = 0
        self.yielded = 0
        self.resume_at = 0

    def __len__(self) -> int:
        return self.size

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        order = torch.randperm(self.size, generator=torch.Generator().manual_seed(1000 + self.epoch)).tolist()
        start, self.resume_at = self.resume_at, 0
        self.yielded = start
        for index in order[start:]:
            self.yielded += 1
            yield index

    def state_dict(self) -> dict[str, int]:
        return {"yielded": self.yielded}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.resume_at = state["yielded"]


@dataclass(frozen=True)
class DataCase:
    source: str = "torch"  # "torch" | "numpy" | "python"
    reader: str = "map"  # "map" | "stream" | "stateful-stream" | "resetting-stream" | "stateful-loader"
    # | "stateful-loader-stream" | "hf-stream" | "stateful-sampler" | "weighted-sampler" | "subset-sampler"
    num_workers: int = 0
    persistent: bool = False
    prefetch_factor: int | None = None
    collate_draws: bool = True
    epochs: int = 2
    max_steps: int | None = None
    stream_length: bool = True
    batch_size: int = 4
    accumulation: int = 2
    hf_files: str | None = None  # the JSON-lines files of the hf-stream reader
    hf_shuffle_buffer: int | None = None  # the hf-stream shuffled with shuffle(buffer_size=...)

    def with_(self, **changes: Any) -> DataCase:
        return DataCase(**{**asdict(self), **changes})


class SmallConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.dropout = nn.Dropout(0.3)
        self.head = nn.Linear(4 * SIDE * SIDE, 2)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.dropout(torch.relu(self.conv(images))).flatten(1))


def classification_step(model: nn.Module, batch: Any) -> StepOutput:
    images, labels = batch
    return StepOutput(loss=nn.functional.cross_entropy(model(images), labels), num_samples=len(labels))


def train_loader(case: DataCase) -> DataLoader:
    collate = MaskingCollate(case.source) if case.collate_draws else None
    options: dict[str, Any] = {"batch_size": case.batch_size, "num_workers": case.num_workers, "collate_fn": collate}
    if case.num_workers:
        options["persistent_workers"] = case.persistent
        if case.prefetch_factor is not None:
            options["prefetch_factor"] = case.prefetch_factor
    if case.reader == "map":
        return DataLoader(AugmentedImages(case.source), shuffle=True, **options)
    if case.reader == "stateful-sampler":
        return DataLoader(AugmentedImages(case.source), sampler=ResumableSampler(IMAGES), **options)
    if case.reader == "stream":
        return DataLoader(ImageStream(case.source, stateful=False, length=case.stream_length), **options)
    if case.reader == "stateful-stream":
        return DataLoader(StatefulImageStream(case.source, stateful=True, length=case.stream_length), **options)
    if case.reader == "resetting-stream":
        return DataLoader(ResettingStream(case.source), **options)
    if case.reader == "weighted-sampler":  # no generator of its own: it would draw from the global one
        weights = torch.linspace(1.0, 2.0, IMAGES)
        return DataLoader(AugmentedImages(case.source), sampler=WeightedRandomSampler(weights, IMAGES), **options)
    if case.reader == "subset-sampler":
        return DataLoader(AugmentedImages(case.source), sampler=SubsetRandomSampler(range(IMAGES)), **options)
    if case.reader == "stateful-loader":
        from torchdata.stateful_dataloader import StatefulDataLoader

        return StatefulDataLoader(AugmentedImages(case.source), shuffle=True, **options)
    if case.reader == "stateful-loader-stream":
        from torchdata.stateful_dataloader import StatefulDataLoader

        return StatefulDataLoader(StatefulImageStream(case.source, stateful=True, length=case.stream_length), **options)
    if case.reader == "hf-stream":
        return DataLoader(hf_stream(case), **options)
    raise ValueError(case.reader)


def hf_stream(case: DataCase) -> Any:
    """A Hugging Face streaming dataset over the case's JSON-lines files, augmented as it is read."""
    import datasets

    files = sorted(str(path) for path in Path(case.hf_files).glob("*.jsonl"))
    stream = datasets.load_dataset("json", data_files=files, split="train", streaming=True)
    source = case.source

    def as_tensors(record: dict[str, Any]) -> dict[str, Any]:
        image = torch.tensor(record["pixels"], dtype=torch.float32).reshape(3, SIDE + 2, SIDE + 2)
        return {"image": augment(image, source), "label": record["label"]}

    if case.hf_shuffle_buffer is not None:
        stream = stream.shuffle(seed=5, buffer_size=case.hf_shuffle_buffer)
    return stream.map(as_tensors).with_format("torch")


def hf_step(model: nn.Module, batch: Any) -> StepOutput:
    return classification_step(model, (batch["image"], batch["label"]))


def write_hf_files(directory: Path, shards: int = 4) -> str:
    """Write the base images as ``shards`` JSON-lines files for :func:`hf_stream`; returns the folder."""
    images, labels = base_images()
    directory.mkdir(parents=True, exist_ok=True)
    for shard in range(shards):
        with open(directory / f"images-{shard}.jsonl", "w") as handle:
            for index in range(shard, IMAGES, shards):
                handle.write(json.dumps({"pixels": images[index].flatten().tolist(), "label": int(labels[index])}) + "\n")
    return str(directory)


class Interruption:
    """A step that interrupts the run in microbatch ``at`` (counted from 1 in this launch): ``kind`` is
    "pause" (a StopRequest), "sigterm" (the signal, to this process) or "sigkill"."""

    def __init__(self, step: Any, kind: str, at: int, stop: StopRequest) -> None:
        self.step, self.kind, self.at, self.stop, self.calls = step, kind, at, stop, 0

    def __call__(self, model: nn.Module, batch: Any) -> StepOutput:
        self.calls += 1
        if self.calls == self.at:
            if self.kind == "pause":
                self.stop.request("test pause")
            elif self.kind == "sigterm":
                os.kill(os.getpid(), signal.SIGTERM)
            else:
                os.kill(os.getpid(), signal.SIGKILL)
        return self.step(model, batch)


def train(case: DataCase, directory: Path, *, interrupt: tuple[str, int] | None = None, resume: bool = False,
          log: bool = False) -> dict[str, torch.Tensor]:
    """One launch of ``case`` in ``directory``: from ``last`` when ``resume``; the end state's tensors. With
    ``log`` the run records go to ``directory``'s events.jsonl."""
    fresh_accelerate()
    accelerator = Accelerator(
        cpu=True, gradient_accumulation_steps=case.accumulation,
        dataloader_config=DataLoaderConfiguration(even_batches=False),
    )
    set_seed(1234)
    model = SmallConvNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    step = hf_step if case.reader == "hf-stream" else classification_step
    stop = StopRequest()
    if interrupt is not None:
        step = Interruption(step, interrupt[0], interrupt[1], stop)
    logger = RunLogger(directory, is_main_process=True, console=Console(file=io.StringIO())) if log else None
    trainer = Trainer(accelerator, model, optimizer, train_loader(case), step, ema_decay=0.9, logger=logger)
    config = TrainConfig(epochs=case.epochs, max_steps=case.max_steps, checkpoint_every=Interval(1, "step"))
    with stop.catch_signals(), logger or contextlib.nullcontext():
        state = trainer.train(config, checkpoint_dir=directory, stop=stop, resume_from=directory / "last" if resume else None)
    tensors = snapshot(trainer)
    tensors["position"] = torch.tensor([state.epoch, state.next_batch, state.step, state.batches, state.samples])
    tensors["stopped"] = torch.tensor(state.stop_reason is not None)
    return tensors


if __name__ == "__main__":
    case_json, checkpoint_dir, kill_at = sys.argv[1:4]
    train(DataCase(**json.loads(case_json)), Path(checkpoint_dir), interrupt=("sigkill", int(kill_at)))
    raise SystemExit("the job was to die by SIGKILL but finished")
