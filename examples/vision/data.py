"""Synthetic images for the vision example, and the random augmentation torchvision's transforms make.

Each image is a noisy field with a bright bar across it: horizontal (class 0) or vertical (class 1),
at a place of its own. The bars survive crops and horizontal flips, so augmentation helps as it does
on real images. The images come from a seeded generator: every rank and every attempt sees the same.

The augmentation is torchvision's ``RandomResizedCrop`` and ``RandomHorizontalFlip`` where torchvision
is installed, plus Gaussian noise; elsewhere (torchvision's wheels need the CUDA build of torch) a
stand-in that draws from the global torch generator the same way they do. Either way the draws happen
in ``__getitem__``, in DataLoader workers, and the trainer keeps them exact across preemptions.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch.nn import functional
from torch.utils.data import Dataset

CLASSES = 2
CHANNELS = 3


def bars(count: int, side: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` images of ``CHANNELS x side x side`` with one bar each, and their labels."""
    generator = torch.Generator().manual_seed(seed)
    images = 0.3 * torch.rand(count, CHANNELS, side, side, generator=generator)
    labels = torch.randint(0, CLASSES, (count,), generator=generator)
    places = torch.randint(side // 4, side - side // 4, (count,), generator=generator)
    for index, (label, place) in enumerate(zip(labels.tolist(), places.tolist(), strict=True)):
        if label == 0:
            images[index, :, place - 1 : place + 1, :] += 0.7
        else:
            images[index, :, :, place - 1 : place + 1] += 0.7
    return images, labels


class RandomCropAndFlip:
    """What ``RandomResizedCrop(side, scale)`` and ``RandomHorizontalFlip()`` draw, from the global
    torch generator: a crop area and aspect ratio (``uniform_``), its place (``randint``), a flip (``rand``)."""

    def __init__(self, side: int, scale: tuple[float, float] = (0.6, 1.0), ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> None:
        self.side, self.scale, self.log_ratio = side, scale, (math.log(ratio[0]), math.log(ratio[1]))

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        height, width = image.shape[-2:]
        area = height * width
        for _ in range(10):  # as torchvision: ten tries, then the whole image
            target = area * torch.empty(1).uniform_(*self.scale).item()
            aspect = math.exp(torch.empty(1).uniform_(*self.log_ratio).item())
            crop_width, crop_height = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
            if 0 < crop_width <= width and 0 < crop_height <= height:
                top = int(torch.randint(0, height - crop_height + 1, size=(1,)).item())
                left = int(torch.randint(0, width - crop_width + 1, size=(1,)).item())
                break
        else:
            top, left, crop_height, crop_width = 0, 0, height, width
        crop = image[:, top : top + crop_height, left : left + crop_width]
        resized = functional.interpolate(crop.unsqueeze(0), size=(self.side, self.side), mode="bilinear",
                                         align_corners=False, antialias=True).squeeze(0)
        return resized.flip(-1) if torch.rand(1).item() < 0.5 else resized


def augmentation(side: int) -> tuple[Callable[[torch.Tensor], torch.Tensor], str]:
    """torchvision's crop and flip where it imports, else :class:`RandomCropAndFlip`; and which it is."""
    try:
        from torchvision.transforms import v2
    except Exception:  # not installed, or built for another torch ("operator torchvision::nms does not exist")
        return RandomCropAndFlip(side), "stand-in"
    return v2.Compose([v2.RandomResizedCrop(side, scale=(0.6, 1.0), antialias=True), v2.RandomHorizontalFlip()]), "torchvision"


class AugmentedBars(Dataset):
    """The bar images, each read as a random crop, maybe flipped, with fresh noise."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, transform: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.images, self.labels, self.transform = images, labels, transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = self.transform(self.images[index])
        return image + 0.05 * torch.randn_like(image), self.labels[index]
