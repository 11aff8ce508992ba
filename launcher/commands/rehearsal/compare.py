"""What ``elfes rehearse`` compares between two runs of one job: every tensor of the final checkpoint
and of the models either run exported (their bit patterns with ``torch.equal``, so NaN equals NaN in
the same position; the max abs difference where they differ), the training state, and the logged
``train`` and ``evaluation`` metrics step by step where both runs keep records.

A generator state that differs between the two straight runs while everything else agrees is a
generator the job never seeds and never draws from: it is set aside with a note (:func:`unused_generators`).

torch is imported inside the functions that load checkpoints; the metric comparison is torch-free.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from elfes.contract import EventKind
from elfes.records import read_events

from ...rundir.paths import RunPaths

# Train metrics that measure the machine, not the model: they differ between identical runs.
TIMING_METRICS = frozenset({"samples_per_second"})
# Checkpoint entries that name the run rather than describe its training.
RUN_IDENTITY_KEYS = frozenset({"run_id"})
# Numbers in a checkpoint that measure the clock (a log interval's seconds): identical runs differ there.
TIMING_KEYS = frozenset({"seconds", "samples_per_second"})
# Folders of a run directory that hold the launcher's and engine's own files, never an export.
OWN_FOLDERS = frozenset({"checkpoints", "logs", "submitit", "pids", "tensorboard"})
# Files found in a run directory that are compared as exported models.
EXPORT_SUFFIXES = (".pt", ".pth")
# Each rank's generators in a checkpoint, by name (elfes.engine.rng.GENERATORS lists them).
_GENERATOR = re.compile(r"^/ranks\[\d+\]/rng/(\w+)")


@dataclass(frozen=True)
class TensorDifference:
    """One tensor (or training-state value) that is not identical in two runs."""

    file: str  # "checkpoints/final", or an exported model relative to the run directory
    name: str  # its path inside the file, e.g. "/model/0.weight"
    max_abs_diff: float | None  # None where it is missing on one side or its shape or dtype differ
    note: str = ""
    max_relative_diff: float | None = None  # max_abs_diff over the largest magnitude of the reference's values

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
    metrics_compared: bool = True  # False where neither run keeps records (no RunLogger): tensors only
    set_aside: tuple[str, ...] = ()  # generators (by name) whose differences do not count
    entries_set_aside: tuple[str, ...] = ()  # checkpoint entries left out (PER_RANK_ENTRIES after a resize)

    @property
    def identical(self) -> bool:
        return not self.tensors and self.divergence is None

    def without_generators(self, generators: tuple[str, ...]) -> Comparison:
        """This comparison with the differences of ``generators`` set aside."""
        kept = tuple(t for t in self.tensors if generator_of(t.name) not in generators)
        return replace(self, tensors=kept, set_aside=tuple(sorted(set(self.set_aside) | set(generators))))

    def without_per_rank_entries(self) -> Comparison:
        """This comparison with the entries that describe the ranks (:data:`PER_RANK_ENTRIES`) left out: after a
        resize they differ by design."""
        kept = tuple(t for t in self.tensors if not t.name.startswith(PER_RANK_ENTRIES))
        left_out = tuple(dict.fromkeys((*self.entries_set_aside, *PER_RANK_ENTRIES)))
        return replace(self, tensors=kept, entries_set_aside=left_out)

    def to_json(self) -> dict[str, Any]:
        return {"identical": self.identical, "tensors": [t.to_json() for t in self.tensors],
                "first_diverging_step": self.divergence.step if self.divergence else None,
                "divergence": self.divergence.to_json() if self.divergence else None,
                "compared_files": list(self.compared_files), "metrics_compared": self.metrics_compared,
                "generators_set_aside": list(self.set_aside), "entries_set_aside": list(self.entries_set_aside)}


def compare_runs(ours: Path, theirs: Path, *, ours_name: str = "the interrupted run",
                 theirs_name: str = "straight-1") -> Comparison:
    """Compare run directory ``ours`` with ``theirs`` (both finished runs of the same job): the files either
    run wrote (a file only one of them has is a difference naming it), then the metrics."""
    files = list(dict.fromkeys(compared_files(ours) + compared_files(theirs)))
    differences: list[TensorDifference] = []
    compared = []
    for relative in files:
        present = [(ours / relative).exists(), (theirs / relative).exists()]
        if not any(present):
            continue  # e.g. no final checkpoint in either run: nothing to compare there
        compared.append(relative)
        if not all(present):
            lacking, having = (ours_name, theirs_name) if not present[0] else (theirs_name, ours_name)
            differences.append(TensorDifference(relative, "", None, f"{relative} is missing in {lacking}; {having} "
                                                f"wrote it"))
            continue
        differences += _compare_file(ours / relative, theirs / relative, relative)
    a, b = read_records(ours), read_records(theirs)
    metrics_compared = _has_metrics(a) or _has_metrics(b)
    return Comparison(tuple(differences), first_divergence(a, b) if metrics_compared else None, tuple(compared),
                      metrics_compared)


def read_records(run_dir: Path) -> list[dict[str, Any]]:
    """The run's records; none where the job keeps no ``events.jsonl``."""
    return read_events(run_dir) if RunPaths(run_dir).events.is_file() else []


def _has_metrics(events: list[dict[str, Any]]) -> bool:
    return any(event.get("event") in (EventKind.TRAIN, EventKind.EVALUATION) for event in events)


def compared_files(run_dir: Path) -> list[str]:
    """The final checkpoint, every model the run exported inside its run directory (its export records),
    and every torch file it left outside the launcher's and engine's own folders, relative to it."""
    paths = RunPaths(run_dir)
    root = Path(run_dir).resolve()
    files = [str(paths.final.relative_to(run_dir))]
    for event in read_records(run_dir):
        if event.get("event") != EventKind.EXPORT:
            continue
        try:
            relative = str(Path(str(event.get("path", ""))).resolve().relative_to(root))
        except ValueError:
            continue  # exported outside the run directory: the two runs would share it
        files.append(relative)
    for found in sorted(Path(run_dir).rglob("*")):
        relative_path = found.relative_to(run_dir)
        if (found.suffix in EXPORT_SUFFIXES and relative_path.parts[0] not in OWN_FOLDERS
                and not relative_path.name.startswith(".") and found.is_file()):
            files.append(str(relative_path))
    return list(dict.fromkeys(files))


def generator_of(name: str) -> str | None:
    """``python`` for ``/ranks[0]/rng/python[1][3]``: the generator a checkpoint entry belongs to, if any."""
    match = _GENERATOR.match(name)
    return match[1] if match else None


def unused_generators(straight: Comparison) -> tuple[str, ...]:
    """The generators whose states alone make the two straight runs differ (every other tensor and every
    metric equal): never seeded, and never drawn from, or the rest would differ too."""
    if straight.divergence is not None or not straight.tensors:
        return ()
    generators = {generator_of(difference.name) for difference in straight.tensors}
    return () if None in generators else tuple(sorted(name for name in generators if name is not None))


def generator_note(generator: str) -> str:
    """The note for a generator :func:`unused_generators` set aside."""
    from elfes.engine.rng import describe_generator  # the engine's list; torch is loaded once checkpoints were read

    return (f"{describe_generator(generator)} is never seeded; this job does not draw from it, but any use "
            "would make it not reproducible: seed it with `accelerate.utils.set_seed`")


def _compare_file(ours: Path, theirs: Path, relative: str) -> list[TensorDifference]:
    import torch

    if ours.is_dir() or theirs.is_dir():
        return _compare_sharded(ours, theirs, relative)
    try:
        a_payload = torch.load(ours, map_location="cpu", weights_only=True)
        b_payload = torch.load(theirs, map_location="cpu", weights_only=True)
    except Exception:  # not a torch file (torch raises KeyError, UnpicklingError, ... then): its bytes are compared
        return [] if ours.read_bytes() == theirs.read_bytes() else [TensorDifference(relative, "", None,
                                                                                      "the bytes differ")]
    return _compare_payloads(a_payload, b_payload, relative)


def _compare_sharded(ours: Path, theirs: Path, relative: str) -> list[TensorDifference]:
    """Two checkpoints of a sharded model (folders of DCP shards), read whole in this process."""
    from elfes.engine.checkpoint import CheckpointError
    from elfes.engine.sharded import whole_sharded_checkpoint

    if not (ours.is_dir() and theirs.is_dir()):
        return [TensorDifference(relative, "", None, "a sharded checkpoint (a folder) in one run, a file in the other")]
    try:
        return _compare_payloads(whole_sharded_checkpoint(ours), whole_sharded_checkpoint(theirs), relative)
    except (CheckpointError, OSError, RuntimeError) as error:  # DCP raises a RuntimeError (CheckpointException) for a damaged shard
        return [TensorDifference(relative, "", None, f"cannot be read: {error}")]


def _compare_payloads(a_payload: Any, b_payload: Any, relative: str) -> list[TensorDifference]:
    a, b = dict(named_leaves(a_payload)), dict(named_leaves(b_payload))
    differences = [TensorDifference(relative, name, None, "only in one run") for name in sorted(a.keys() ^ b.keys())]
    for name in a.keys() & b.keys():
        difference = _leaf_difference(a[name], b[name])
        if difference is not None:
            differences.append(TensorDifference(relative, name, *difference, relative_to(difference[0], b[name])))
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


def relative_to(difference: float | None, reference: Any) -> float | None:
    """``difference`` over the largest magnitude among ``reference``'s values (floating-point ones: a tensor or a
    number); None where there is no difference to scale or the values are counts, which rounding never changes;
    infinity where the reference is all zeros."""
    import torch

    floating = reference.is_floating_point() if isinstance(reference, torch.Tensor) else isinstance(reference, float)
    if difference is None or not floating:
        return None
    if isinstance(reference, torch.Tensor):
        finite = reference.double().nan_to_num(0.0, 0.0, 0.0).abs() if reference.numel() else torch.zeros(1)
        scale = float(finite.max())
    else:
        scale = abs(float(reference))
    return difference / scale if scale else (0.0 if difference == 0 else math.inf)


def bit_pattern(tensor: Any) -> Any:
    """``tensor`` as integers of its element size, so that ``torch.equal`` compares bits: NaN equals NaN in
    the same position (and -0.0 differs from 0.0)."""
    import torch

    if tensor.is_complex():
        tensor = torch.view_as_real(tensor)
    if not tensor.is_floating_point():
        return tensor
    integer = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()]
    return tensor.contiguous().view(integer)


def _leaf_difference(a: Any, b: Any) -> tuple[float | None, str] | None:
    """None when ``a`` and ``b`` are identical; else (max abs difference or None, a note)."""
    import torch

    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape or a.dtype != b.dtype:
            return None, f"{a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
        if a.numel() == 0 or torch.equal(bit_pattern(a), bit_pattern(b)):
            return None
        if not (a.is_floating_point() or a.is_complex()):
            return float((a.double() - b.double()).abs().max()), ""
        nan_a, nan_b = torch.isnan(a), torch.isnan(b)
        if not torch.equal(nan_a, nan_b):
            return None, f"NaN in one run only at {int((nan_a ^ nan_b).sum())} position(s)"
        wide = torch.complex128 if a.is_complex() else torch.float64
        difference = float(torch.where(nan_a, 0, (a.to(wide) - b.to(wide)).abs()).max())
        return difference, "" if difference else "the same values with other bit patterns (a NaN payload, a zero's sign)"
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
        if kind == EventKind.TRAIN:
            metrics = {k: v for k, v in (event.get("metrics") or {}).items() if k not in TIMING_METRICS}
            logged[(int(event["step"]), EventKind.TRAIN)] = metrics
        elif kind == EventKind.EVALUATION:
            flat = {f"{loader}/{name}": value for loader, values in (event.get("metrics") or {}).items()
                    for name, value in (values or {}).items()}
            logged[(int(event["step"]), f"{EventKind.EVALUATION}/{event.get('weights')}")] = flat
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
            if not _same_number(left.get(metric), right.get(metric)):
                return MetricDivergence(step, event.partition("/")[0], metric, left.get(metric), right.get(metric))
    return None


def _same_number(a: Any, b: Any) -> bool:
    """Equal, or NaN on both sides (a record read back from JSON may hold NaN)."""
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


# -- a continuation on another world size (elfes rehearse --resize) ---------------------------------------------
# The largest relative difference a continuation on another world size may show, in any tensor or logged loss:
# float rounding of sums reduced in another order, carried through the updates after the resume.
RESIZE_TOLERANCE = 1e-3
# Checkpoint entries that describe the ranks rather than the training: each rank's generators and data position
# (a rank of the new world size has none of the old ones') and the layout (its world size and accumulation).
PER_RANK_ENTRIES = ("/ranks", "/layout")


@dataclass(frozen=True)
class Resized:
    """How a run paused and continued on another world size compares with the uninterrupted run."""

    ranks: int
    resumed_at: int | None  # the step the continuation started from
    largest_loss_difference: float  # relative, over the logged train losses after the resume
    largest_difference: float  # relative, over every compared tensor and number
    largest_in: str  # where: "checkpoints/final /model/0.weight"
    unmatched: tuple[TensorDifference, ...]  # differences that no rounding explains: a missing entry, a shape, a count
    samples_differ_at: int | None = None  # the first logged step whose update counted other samples

    @property
    def samples_identical(self) -> bool:
        """Every logged update after the resume counted the same samples as the straight run's (exact)."""
        return self.samples_differ_at is None

    @property
    def losses_within_tolerance(self) -> bool:
        """Every logged train loss after the resume within :data:`RESIZE_TOLERANCE` (relative) of the straight run's."""
        return self.largest_loss_difference <= RESIZE_TOLERANCE

    @property
    def within_rounding(self) -> bool:
        return (self.samples_identical and self.losses_within_tolerance and not self.unmatched
                and self.largest_difference <= RESIZE_TOLERANCE)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "samples_identical": self.samples_identical,
                "losses_within_tolerance": self.losses_within_tolerance, "within_rounding": self.within_rounding,
                "tolerance": RESIZE_TOLERANCE}


def judge_resized(comparison: Comparison, ours: list[dict[str, Any]], theirs: list[dict[str, Any]], *, ranks: int,
                  resumed_at: int | None) -> Resized:
    """Judge ``comparison`` (the continued run against the uninterrupted one, its per-rank entries left out:
    :meth:`Comparison.without_per_rank_entries`) and both runs' records as a continuation on ``ranks`` ranks from
    step ``resumed_at``: every difference measured relative to the uninterrupted run's values."""
    measured = [t for t in comparison.tensors if t.max_relative_diff is not None]
    unmatched = tuple(t for t in comparison.tensors if t not in measured)
    largest = max(measured, key=lambda t: t.max_relative_diff or 0.0, default=None)
    a, b = logged_metrics(ours), logged_metrics(theirs)
    start = resumed_at or 0
    steps = sorted(step for step, event in a.keys() | b.keys() if event == EventKind.TRAIN and step > start)
    samples_differ_at, loss_difference = None, 0.0
    for step in steps:
        left, right = a.get((step, EventKind.TRAIN), {}), b.get((step, EventKind.TRAIN), {})
        if left.get("last_update_samples") != right.get("last_update_samples") or "loss" not in left or "loss" not in right:
            samples_differ_at = samples_differ_at or step
            continue
        loss_difference = max(loss_difference, abs(left["loss"] - right["loss"]) / max(abs(right["loss"]), 1e-30))
    return Resized(ranks, resumed_at, loss_difference,
                   largest.max_relative_diff if largest and largest.max_relative_diff else 0.0,
                   f"{largest.file} {largest.name}" if largest else "", unmatched, samples_differ_at)
