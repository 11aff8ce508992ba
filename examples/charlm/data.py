"""The corpus: this Python's own standard library source, cut into documents of different lengths.

Every machine with Python has it offline. The ``.py`` files under the standard library folder are
read in sorted order (installed packages left out); every tenth file is held out for evaluation.
Whole files are taken until the training files hold ``train_chars`` characters and the held-out
files a tenth of that (each at least). Each file is cut at blank lines into documents of at most
``context + 1`` characters (consecutive paragraphs joined while they fit), so that a document is a
whole class, function or docstring where one fits, and documents differ in length. A character is
its ASCII code; the few characters outside ASCII become ``?``.

The standard library differs between Python versions, so runs on two versions see different text;
on one interpreter the corpus is the same on every rank and every attempt.
"""

from __future__ import annotations

import os
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.utils.data import Dataset, IterableDataset

VOCABULARY = 128  # ASCII
PAD = 0  # the input at a padding position (NUL, absent from source files; no real position attends to it)
IGNORED = -100  # the target of a padding position (cross_entropy's default ignore_index)
HELD_OUT_EVERY = 10  # every tenth file is a validation file
SKIPPED_FOLDERS = {"site-packages", "dist-packages", "__pycache__"}


def library_files() -> Iterator[Path]:
    """The standard library's ``.py`` files, in a fixed (sorted, depth-first) order."""
    for folder, subfolders, files in os.walk(sysconfig.get_paths()["stdlib"]):
        subfolders[:] = sorted(name for name in subfolders if name not in SKIPPED_FOLDERS)
        for name in sorted(files):
            if name.endswith(".py"):
                yield Path(folder, name)


def documents(text: str, longest: int) -> list[str]:
    """``text`` cut at blank lines into pieces of at most ``longest`` characters (longer paragraphs are cut hard)."""
    pieces: list[str] = []
    current = ""
    for paragraph in text.split("\n\n"):
        joined = f"{current}\n\n{paragraph}" if current else paragraph
        if len(joined) <= longest:
            current = joined
            continue
        if current:
            pieces.append(current)
        *whole, current = [paragraph[start:start + longest] for start in range(0, len(paragraph), longest)] or [""]
        pieces += whole
    if current:
        pieces.append(current)
    return [piece for piece in pieces if len(piece) >= 2]  # one target at least


def encode(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(text.encode("ascii", errors="replace")), dtype=torch.uint8).long()


class LibraryText(Dataset):
    """Documents as token tensors; ``split`` is ``"train"`` or ``"validation"`` (the held-out files)."""

    def __init__(self, split: str, *, train_chars: int, context: int) -> None:
        if split not in ("train", "validation"):
            raise ValueError(f"split is {split!r}; use 'train' or 'validation'")
        self.documents: list[torch.Tensor] = []
        budget = {"train": train_chars, "validation": train_chars // HELD_OUT_EVERY}
        taken = {"train": 0, "validation": 0}
        for index, path in enumerate(library_files()):
            if all(taken[part] >= budget[part] for part in budget):
                break
            part = "validation" if index % HELD_OUT_EVERY == HELD_OUT_EVERY - 1 else "train"
            if taken[part] >= budget[part]:
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
            taken[part] += len(text)
            if part == split:
                self.documents += [encode(piece) for piece in documents(text, context + 1)]

    def __len__(self) -> int:
        return len(self.documents)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.documents[index]


class DocumentStream(IterableDataset):
    """The training documents as a stream, each rank reading its own share, cropped at random as read.

    Rank ``rank`` of ``world_size`` reads every ``world_size``-th document (the shares cut to one length,
    so that every rank's epoch has as many batches), in an order shuffled for each epoch from
    ``(seed, epoch)``. Each document starts at a random offset in its first quarter, drawn from the global
    torch generator as it is read (a random crop of a token stream). The position in the epoch is its
    state (``state_dict``/``load_state_dict``), which the trainer saves for every rank in every checkpoint.
    """

    def __init__(self, documents: list[torch.Tensor], *, rank: int, world_size: int, seed: int) -> None:
        share = len(documents) // world_size
        self.documents = documents[rank::world_size][:share]
        self.seed = seed
        self.epoch = 0
        self.position = 0  # documents of this epoch read so far
        self._resume_at = 0

    def __len__(self) -> int:
        return len(self.documents)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[torch.Tensor]:
        order = torch.randperm(len(self.documents), generator=torch.Generator().manual_seed(self.seed * 1000 + self.epoch))
        start, self._resume_at = self._resume_at, 0
        for self.position, index in enumerate(order[start:].tolist(), start=start + 1):
            document = self.documents[index]
            offset = int(torch.randint(0, max(1, (len(document) - 2) // 4 + 1), (1,)).item())
            yield document[offset:]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._resume_at = state["position"]


def pad(batch: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs, targets)`` of one batch, padded to its longest document; padded targets are IGNORED.

    A document of n tokens gives n - 1 predictions: the inputs are its first n - 1 characters, the
    targets its last n - 1.
    """
    longest = max(len(document) for document in batch) - 1
    inputs = torch.full((len(batch), longest), PAD, dtype=torch.long)
    targets = torch.full((len(batch), longest), IGNORED, dtype=torch.long)
    for row, document in enumerate(batch):
        inputs[row, : len(document) - 1] = document[:-1]
        targets[row, : len(document) - 1] = document[1:]
    return inputs, targets
