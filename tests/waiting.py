"""Waiting for a condition in a test: poll it until it holds or a generous limit passes (never a bare sleep).

A plain module (not a conftest.py), imported by name like tests/launching.py."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], what: str, timeout_s: float = 120.0, interval_s: float = 0.05) -> T:
    """The first true value of ``condition()``, polled every ``interval_s``; fails the test naming ``what`` after
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f} s waiting for {what}"
        time.sleep(interval_s)
    return value
