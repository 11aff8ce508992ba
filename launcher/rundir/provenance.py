"""What an attempt ran on: its provenance, recorded per attempt in ``state.json`` (``attempts[].provenance``),
and the changes between attempts that threaten a bitwise resume. Torch-free: the job collects the values
(launcher/job/provenance.py); ``elfes status`` and the next attempt compare them here.

>>> environment_changes(state)  # doctest: +SKIP
['attempt 3 runs torch 2.14.0, attempt 2 ran 2.13.0: a threat to bitwise resume (kernels and their
  reduction orders may differ between versions); resume with the environment of the earlier attempts to keep it']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# What may change the bits of a resumed run: name in the record -> how messages name it.
BITWISE_FIELDS: dict[str, str] = {
    "torch": "torch",
    "cuda": "CUDA",
    "cudnn": "cuDNN",
    "gpu": "the GPU model",
    "threads": "the torch thread count",
}


@dataclass(frozen=True)
class CodeProvenance:
    """The code an attempt ran: its snapshot (``code.json`` at the start; launcher/rundir/code_record.py)."""

    path: str
    origin: str  # its code.json kind: "submit", or "current" (a fresh one of `elfes resume --code current`)
    taken_at: str
    commit: str | None = None
    dirty: bool | None = None
    diff_sha256: str | None = None
    fingerprint: str | None = None  # of the snapshot's names and contents (in or outside git)
    other_code_than: str | None = None  # the run continued from checkpoints that this code did not write


@dataclass(frozen=True)
class Provenance:
    """What one attempt ran on, as rank 0 saw it at its start (before ``main``). The hosts of every rank are the
    attempt's own ``hosts``. ``cuda``/``cudnn``/``gpu`` are None on a CPU build or without a GPU; for a
    ``command:`` job the versions are those of the launcher's interpreter and ``cuda``, ``cudnn`` and ``threads``
    stay None (the command's own process is not looked into)."""

    python: str
    torch: str | None = None
    accelerate: str | None = None
    cuda: str | None = None  # torch.version.cuda
    cudnn: str | None = None  # torch.backends.cudnn.version()
    gpu: str | None = None  # the model of rank 0's GPU
    threads: int | None = None  # torch.get_num_threads() on rank 0
    elfes: str | None = None
    code: CodeProvenance | None = None  # None: no snapshot; the attempt imported the workdir as it was

    @classmethod
    def from_json(cls, data: Any) -> Provenance:
        """The provenance in ``data`` (its ``dataclasses.asdict`` form); FieldError names a field that does not fit."""
        from .json_fields import read_record

        return read_record(cls, data)

    def describe(self) -> str:
        """A short line: ``torch 2.13.0, CUDA 12.8, cuDNN 91000, NVIDIA H200, 8 threads; code snapshot ...``."""
        parts = [f"Python {self.python}", f"torch {self.torch or '?'}"]
        parts.append(f"CUDA {self.cuda}" + (f", cuDNN {self.cudnn}" if self.cudnn else "") if self.cuda else "CPU build")
        if self.gpu:
            parts.append(self.gpu)
        if self.threads is not None:
            parts.append(f"{self.threads} thread{'s' if self.threads != 1 else ''}")
        code = "workdir as it was (no snapshot)"
        if self.code is not None:
            git = ("" if self.code.commit is None else f", git {self.code.commit[:12]}"
                   + (" dirty" if self.code.dirty else ""))
            if self.code.commit is None and self.code.fingerprint:
                git += f", fingerprint {self.code.fingerprint[:12]}"
            code = f"snapshot {self.code.path} ({self.code.origin}{git})"
            if self.code.other_code_than:
                code += (f", continued with other code than its checkpoints' ({self.code.other_code_than}): the "
                         "optimizer's and scheduler's state came from them")
        return ", ".join(parts) + f"; code: {code}"


def _value(provenance: Any, name: str) -> Any:
    return getattr(provenance, name, None)


def changes_between(before: Provenance, after: Provenance, *, earlier: int, later: int) -> list[str]:
    """The bitwise threats between attempt ``earlier`` (``before``) and attempt ``later`` (``after``)."""
    found = []
    for name, label in BITWISE_FIELDS.items():
        old, new = _value(before, name), _value(after, name)
        if old != new:
            found.append(f"attempt {later} runs {label} {_shown(new)}, attempt {earlier} ran {_shown(old)}: a threat to "
                         "bitwise resume (kernels, their reduction orders and thread splits may differ); resume in the "
                         "environment of the earlier attempts to keep the run bitwise equal to an uninterrupted one")
    return found


def _shown(value: Any) -> str:
    return "none" if value is None else str(value)


def environment_changes(state: Any) -> list[str]:
    """Every change of a bitwise field between consecutive attempts that recorded their provenance."""
    found = []
    previous = None
    for attempt in getattr(state, "attempts", ()):
        provenance = attempt.provenance
        if provenance is None:
            continue
        if previous is not None:
            found += changes_between(previous[1], provenance, earlier=previous[0], later=attempt.number)
        previous = (attempt.number, provenance)
    return found


def changes_at(state: Any, number: int) -> list[str]:
    """The bitwise threats of attempt ``number`` against the latest earlier attempt that recorded its provenance."""
    attempts = [attempt for attempt in getattr(state, "attempts", ()) if attempt.provenance is not None]
    current = next((attempt for attempt in attempts if attempt.number == number), None)
    earlier = [attempt for attempt in attempts if attempt.number < number]
    if current is None or not earlier:
        return []
    return changes_between(earlier[-1].provenance, current.provenance, earlier=earlier[-1].number, later=number)
