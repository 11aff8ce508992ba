"""Collecting what an attempt runs on, inside the job (rank 0, at the start of the attempt, before ``main``).

Versions come from the modules already imported (an entrypoint job has imported torch with the engine) or,
without importing them, from the installed distributions' metadata (a ``command:`` job's launcher process
never imports torch). The GPU model is torch's name for the task's device, else the NVIDIA driver's
(``/proc/driver/nvidia/gpus``) when torch is not imported and GPUs are visible. Every rank also tells where
it computes (:func:`rank_place`): its host, and on a GPU the device's index, UUID and PCI bus id. The record's
format and the comparison live in launcher/rundir/provenance.py.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from pathlib import Path
from typing import Any, TypedDict

from ..rundir.code_record import CodeRecord
from ..rundir.provenance import NCCL_ORDER_VARIABLES, CodeProvenance, Provenance, RankPlace


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


def _imported_torch() -> Any:
    """torch, when this process imported it already (never imported here), else None."""
    torch = sys.modules.get("torch")
    return torch if torch is not None and hasattr(torch, "__version__") else None


class _TorchValues(TypedDict, total=False):
    """What torch tells of this process (:func:`_torch_values`); a key is missing where torch does not tell it."""

    torch: str | None
    cuda: str | None
    threads: int
    cudnn: str
    gpu: str
    nccl: str


def _torch_values(local_rank: int, *, gpus: bool) -> _TorchValues:
    """What torch tells, when this process imported it already. ``gpus``: the job computes on GPUs (the spec's
    ``resources.gpus_per_node``), so NCCL reduces its collectives."""
    torch = _imported_torch()
    if torch is None:
        return {"torch": _installed("torch")}
    values: _TorchValues = {"torch": str(torch.__version__), "cuda": torch.version.cuda,
                            "threads": int(torch.get_num_threads())}
    try:
        if torch.backends.cudnn.is_available():
            values["cudnn"] = str(torch.backends.cudnn.version())
        if torch.cuda.is_available():
            values["gpu"] = torch.cuda.get_device_name(local_rank % torch.cuda.device_count())
            if gpus:
                values["nccl"] = ".".join(str(part) for part in torch.cuda.nccl.version())
    except Exception:  # a broken driver must not fail the attempt: the record just lacks the value
        pass
    return values


def rank_place(*, rank: int, local_rank: int, host: str, gpus: bool) -> RankPlace:
    """Where this rank computes: on a GPU (``gpus`` and CUDA available), the device Accelerate gives it (index
    ``local_rank`` among the visible ones), with its UUID and PCI bus id; else "cpu". Without torch imported
    (a ``command:`` job) the device is not known: None."""
    torch = _imported_torch()
    if torch is None:
        return RankPlace(rank=rank, host=host, device=None)
    try:
        if not (gpus and torch.cuda.is_available()):
            return RankPlace(rank=rank, host=host, device="cpu")
        index = local_rank % torch.cuda.device_count()
        properties = torch.cuda.get_device_properties(index)
        uuid = getattr(properties, "uuid", None)
        domain, bus, device = (getattr(properties, f"pci_{part}_id", None) for part in ("domain", "bus", "device"))
        pci_bus_id = None if None in (domain, bus, device) else f"{domain:04x}:{bus:02x}:{device:02x}.0"
        return RankPlace(rank=rank, host=host, device=f"cuda:{index}", gpu_uuid=None if uuid is None else str(uuid),
                         pci_bus_id=pci_bus_id)
    except Exception:  # a broken driver must not fail the attempt: the place says the device is not known
        return RankPlace(rank=rank, host=host, device=None)


def nccl_environment() -> dict[str, str]:
    """The variables of ``NCCL_ORDER_VARIABLES`` set in this process's environment (the spec's ``env`` applied)."""
    return {name: os.environ[name] for name in NCCL_ORDER_VARIABLES if name in os.environ}


def collect(*, code: CodeRecord | None, local_rank: int = 0, gpus: bool = False) -> Provenance:
    """The provenance of this attempt as this task sees it now."""
    values = _torch_values(local_rank, gpus=gpus)
    return Provenance(
        python=platform.python_version(),
        torch=values.get("torch"),
        accelerate=_installed("accelerate"),
        cuda=values.get("cuda"),
        cudnn=values.get("cudnn"),
        gpu=values.get("gpu") if "threads" in values or not _gpus_visible() else _driver_gpu_model(),
        threads=values.get("threads"),
        elfes=_installed("elfes"),
        nccl=values.get("nccl"),
        nccl_env=nccl_environment(),
        code=None if code is None else CodeProvenance(path=code.path, origin=code.kind, taken_at=code.taken_at,
                                                      commit=code.commit, dirty=code.dirty,
                                                      diff_sha256=code.diff_sha256, fingerprint=code.fingerprint,
                                                      other_code_than=code.other_code_than),
    )
