"""Checkpoint files as the engine tests look at them: the published checkpoints of a folder, their step,
two loaded checkpoints compared bitwise (``comparable`` drops the run's random id), and a small real file
system to write them to."""

from __future__ import annotations

import re
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

PUBLISHED = re.compile(r"^step-(\d+)-batches-(\d+)\.pt$")


def published(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if PUBLISHED.match(p.name) and not p.is_symlink())


def step_of(path: Path) -> int:
    return int(PUBLISHED.match(Path(path).name)[1])


def assert_same_payload(expected, actual, where: str = "payload") -> None:
    """Deep equality of two loaded checkpoints, tensors compared bitwise."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict) and expected.keys() == actual.keys(), where
        for key in expected:
            assert_same_payload(expected[key], actual[key], f"{where}/{key}")
    elif isinstance(expected, (list, tuple)):
        assert type(actual) is type(expected) and len(actual) == len(expected), where
        for index, (left, right) in enumerate(zip(expected, actual)):
            assert_same_payload(left, right, f"{where}[{index}]")
    elif isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor) and torch.equal(expected, actual), where
    else:
        assert expected == actual, f"{where}: {expected!r} != {actual!r}"


def comparable(payload: dict) -> dict:
    """A loaded checkpoint without the run's random id (two runs never share it)."""
    payload = dict(payload, run_id=None)
    payload["progress"] = dict(payload["progress"], run_id=None)
    return payload


@contextmanager
def tmpfs(path: Path, *options: str):
    """A small real file system (root only), unmounted afterwards."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs", str(path)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"needs root to mount a tmpfs ({mounted.stderr.strip()}); CI runs as root")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)
