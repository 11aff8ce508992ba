"""The markers a job spec field carries to say whether it may change when a run continues from its checkpoints
(``json_schema_extra=MAY_CHANGE`` or ``FIXED``); read by launcher/spec/continuing.py. Torch-free."""

from __future__ import annotations

from typing import Any

ON_RESUME = "x-elfes-on-resume"
CHANGEABLE_KEYS = "x-elfes-changeable-keys"
MAY_CHANGE: dict[str, Any] = {ON_RESUME: "may change"}
FIXED: dict[str, Any] = {ON_RESUME: "fixed"}


def fixed_but(*keys: str) -> dict[str, Any]:
    """A free-form mapping that is fixed but for ``keys`` (``config``: its budget keys)."""
    return {**FIXED, CHANGEABLE_KEYS: list(keys)}
