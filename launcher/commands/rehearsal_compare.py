"""What ``elfes rehearse`` compares between two runs of one job: every tensor of the final checkpoint
and of the exported models (``torch.equal``; the max abs difference where they differ), the training
state, and the logged ``train`` and ``evaluation`` metrics step by step.

torch is imported inside the functions that load checkpoints; the metric comparison is torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from elfes.records import read_events

from ..rundir.paths import RunPaths

# Train metrics that measure the machine, not the model: they differ between identical runs.
TIMING_METRICS = frozenset({"samples_per_second"})
# Checkpoint entries that name the run rather than describe its training.
RUN_IDENTITY_KEYS = frozenset({"run_id"})
# Numbers in a checkpoint that measure the clock (a log interval's seconds): identical runs differ there.
TIMING_KEYS = frozenset({"seconds", "samples_per_second"})


@dataclass(frozen=True)
class TensorDifference:
    """One tensor (or training-state value) that is not identical in two runs."""

    file: str  # "checkpoints/final", or an exported model relative to the run directory
    name: str  # its path inside the file, e.g. "/model/0.weight"
    max_abs_diff: float | None  # None where it is missing on one side or its shape or dtype differ
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class MetricDivergence:
    """The first logged step at which two runs' metrics differ."""

    step: int
    event: str  # "train" or "evaluation"
    metric: str
    ours: Any
    theirs: Any

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Comparison:
    tensors: tuple[TensorDifference, ...]
    divergence: MetricDivergence | None
    compared_files: tuple[str, ...]

    @property
    def identical(self) -> bool:
        return not self.tensors and self.divergence is None

    def to_json(self) -> dict[str, Any]:
        return {"identical": self.identical, "tensors": [t.to_json() for t in self.tensors],
                "first_diverging_step": self.divergence.step if self.divergence else None,
                "divergence": self.divergence.to_json() if self.divergence else None,
                "compared_files": list(self.compared_files)}


def compare_runs(ours: Path, theirs: Path) -> Comparison:
    """Compare run directory ``ours`` with ``theirs`` (both finished runs of the same job)."""
    files = compared_files(ours)
    differences: list[TensorDifference] = []
    for relative in files:
        differences += _compare_file(ours / relative, theirs / relative, relative)
    return Comparison(tuple(differences), first_divergence(read_events(ours), read_events(theirs)), tuple(files))


def compared_files(run_dir: Path) -> list[str]:
    """The final checkpoint and every model the run exported inside its run directory, relative to it."""
    paths = RunPaths(run_dir)
    files = [str(paths.final.relative_to(run_dir))]
    for event in read_events(run_dir):
        if event.get("event") != "export":
            continue
        exported = Path(str(event.get("path", "")))
        try:
            relative = str(exported.resolve().relative_to(Path(run_dir).resolve()))
        except ValueError:
            continue  # exported outside the run directory: the two runs would share it
        if relative not in files:
            files.append(relative)
    return files


def _compare_file(ours: Path, theirs: Path, relative: str) -> list[TensorDifference]:
    import torch

    missing = [path for path in (ours, theirs) if not path.exists()]
    if missing:
        return [TensorDifference(relative, "", None, f"{missing[0]} does not exist")]
    a = dict(named_leaves(torch.load(ours, map_location="cpu", weights_only=True)))
    b = dict(named_leaves(torch.load(theirs, map_location="cpu", weights_only=True)))
    differences = [TensorDifference(relative, name, None, "only in one run") for name in sorted(a.keys() ^ b.keys())]
    for name in a.keys() & b.keys():
        difference = _leaf_difference(a[name], b[name])
        if difference is not None:
            differences.append(TensorDifference(relative, name, *difference))
    return sorted(differences, key=lambda d: (d.file, d.name))


def named_leaves(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every tensor and number inside nested dicts, lists and tuples, named by its path; run ids and
    clock measurements (:data:`TIMING_KEYS`, names ending in ``_s``) skipped."""
    import torch

    if isinstance(value, torch.Tensor):
        yield prefix, value
    elif isinstance(value, dict):
        for key, item in value.items():
            timing = not isinstance(item, torch.Tensor) and (key in TIMING_KEYS or str(key).endswith("_s"))
            if key not in RUN_IDENTITY_KEYS and not timing:
                yield from named_leaves(item, f"{prefix}/{key}")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from named_leaves(item, f"{prefix}[{index}]")
    elif isinstance(value, (bool, int, float, str)) or value is None:
        yield prefix, value


def _leaf_difference(a: Any, b: Any) -> tuple[float | None, str] | None:
    """None when ``a`` and ``b`` are identical; else (max abs difference or None, a note)."""
    import torch

    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape or a.dtype != b.dtype:
            return None, f"{a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
        if torch.equal(a, b):
            return None
        if a.numel() == 0:
            return None
        return float((a.double() - b.double()).abs().max()), ""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return None, f"a tensor in one run, {type(b if isinstance(a, torch.Tensor) else a).__name__} in the other"
    if a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)):
        return None
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return abs(float(a) - float(b)), f"{a!r} vs {b!r}"
    return None, f"{a!r} vs {b!r}"


# -- logged metrics -------------------------------------------------------------------------------------------
def logged_metrics(events: list[dict[str, Any]]) -> dict[tuple[int, str], dict[str, Any]]:
    """``{(step, "train" | "evaluation/<weights>"): metrics}``; a step logged twice (replayed after a
    kill) keeps its latest record, the one the run continued from."""
    logged: dict[tuple[int, str], dict[str, Any]] = {}
    for event in events:
        kind = event.get("event")
        if kind == "train":
            metrics = {k: v for k, v in (event.get("metrics") or {}).items() if k not in TIMING_METRICS}
            logged[(int(event["step"]), "train")] = metrics
        elif kind == "evaluation":
            flat = {f"{loader}/{name}": value for loader, values in (event.get("metrics") or {}).items()
                    for name, value in (values or {}).items()}
            logged[(int(event["step"]), f"evaluation/{event.get('weights')}")] = flat
    return logged


def first_divergence(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> MetricDivergence | None:
    """The first step (then event, then metric, in order) whose logged metrics differ, or None."""
    a, b = logged_metrics(ours), logged_metrics(theirs)
    for key in sorted(a.keys() | b.keys()):
        step, event = key
        left, right = a.get(key), b.get(key)
        if left is None or right is None:
            return MetricDivergence(step, event.partition("/")[0], "(logged in one run only)",
                                    None if left is None else "logged", None if right is None else "logged")
        for metric in sorted(left.keys() | right.keys()):
            if left.get(metric) != right.get(metric):
                return MetricDivergence(step, event.partition("/")[0], metric, left.get(metric), right.get(metric))
    return None
