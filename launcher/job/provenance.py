"""Collecting what an attempt runs on, inside the job (rank 0, at the start of the attempt, before ``main``).

Versions come from the modules already imported (an entrypoint job has imported torch with the engine) or,
without importing them, from the installed distributions' metadata (a ``command:`` job's launcher process
never imports torch). The GPU model is torch's name for the task's device, else the NVIDIA driver's
(``/proc/driver/nvidia/gpus``) when torch is not imported and GPUs are visible. The record's format and the comparison live in launcher/rundir/provenance.py.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from pathlib import Path

from ..rundir.code_record import CodeRecord
from ..rundir.provenance import CodeProvenance, Provenance


def _installed(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _driver_gpu_model() -> str | None:
    for information in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        try:
            for line in information.read_text().splitlines():
                key, _, value = line.partition(":")
                if key.strip() == "Model" and value.strip():
                    return value.strip()
        except OSError:
            continue
    return None


def _gpus_visible() -> bool:
    """Whether the task may use a GPU at all (submitit hides them with an empty ``CUDA_VISIBLE_DEVICES``)."""
    return os.environ.get("CUDA_VISIBLE_DEVICES", "unset").strip() != ""


def _torch_values(local_rank: int) -> dict[str, object]:
    """What torch tells, when this process imported it already (never imported here)."""
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "__version__"):
        return {"torch": _installed("torch")}
    values: dict[str, object] = {"torch": str(torch.__version__), "cuda": torch.version.cuda,
                                 "threads": int(torch.get_num_threads())}
    try:
        if torch.backends.cudnn.is_available():
            values["cudnn"] = str(torch.backends.cudnn.version())
        if torch.cuda.is_available():
            values["gpu"] = torch.cuda.get_device_name(local_rank % torch.cuda.device_count())
    except Exception:  # a broken driver must not fail the attempt: the record just lacks the value
        pass
    return values


def collect(*, code: CodeRecord | None, local_rank: int = 0) -> Provenance:
    """The provenance of this attempt as this task sees it now."""
    values = _torch_values(local_rank)
    return Provenance(
        python=platform.python_version(),
        torch=values.get("torch"),  # type: ignore[arg-type]
        accelerate=_installed("accelerate"),
        cuda=values.get("cuda"),  # type: ignore[arg-type]
        cudnn=values.get("cudnn"),  # type: ignore[arg-type]
        gpu=values.get("gpu") if "threads" in values or not _gpus_visible() else _driver_gpu_model(),  # type: ignore[arg-type]
        threads=values.get("threads"),  # type: ignore[arg-type]
        elfes=_installed("elfes"),
        code=None if code is None else CodeProvenance(path=code.path, origin=code.kind, taken_at=code.taken_at,
                                                      commit=code.commit, dirty=code.dirty,
                                                      diff_sha256=code.diff_sha256, fingerprint=code.fingerprint,
                                                      other_code_than=code.other_code_than),
    )
