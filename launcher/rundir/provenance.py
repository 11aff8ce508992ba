"""What an attempt ran on: its provenance, recorded per attempt in ``state.json`` (``attempts[].provenance``, and
each rank's host and device in ``attempts[].rank_places``), and the changes between attempts that threaten a
bitwise resume. Torch-free: the job collects the values (launcher/job/provenance.py); ``elfes status`` and the
next attempt compare them here.

>>> environment_changes(state)  # doctest: +SKIP
['attempt 3 runs torch 2.14.0, attempt 2 ran 2.13.0: a threat to bitwise resume (kernels and their
  reduction orders may differ between versions); resume with the environment of the earlier attempts to keep it']
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# What may change the bits of a resumed run: name in the record -> how messages name it.
BITWISE_FIELDS: dict[str, str] = {
    "torch": "torch",
    "cuda": "CUDA",
    "cudnn": "cuDNN",
    "gpu": "the GPU model",
    "threads": "the torch thread count",
}
_KERNELS = "kernels, their reduction orders and thread splits may differ"

# What decides the order in which NCCL adds the ranks' contributions on GPUs, besides its version and the
# rank-to-GPU map: ALGO picks the algorithm (ring, tree, CollNet, NVLS, PAT), each adding in its own order;
# PROTO the protocol (LL, LL128, Simple), and BUFFSIZE the buffer, which set the chunks a ring adds in turn;
# the channel counts (NCHANNELS, CTAS) split each buffer over channels; NVLS_ENABLE lets the NVSwitch add
# (NVLink SHARP) and COLLNET_ENABLE the network's switches (SHARP); a tuner plugin picks algorithm, protocol
# and channels per call. Recorded where set in the environment (NCCL's config files are not read).
NCCL_ORDER_VARIABLES: tuple[str, ...] = (
    "NCCL_ALGO", "NCCL_PROTO", "NCCL_NVLS_ENABLE", "NCCL_COLLNET_ENABLE", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS",
    "NCCL_MIN_CTAS", "NCCL_MAX_CTAS", "NCCL_BUFFSIZE", "NCCL_TUNER_PLUGIN",
)
_NCCL_ORDER = ("NCCL may add the ranks' contributions in another order: bitwise continuation on GPUs is not promised "
               "across this change")
_KEEP = "resume in the environment of the earlier attempts to keep the run bitwise equal to an uninterrupted one"


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
    ``command:`` job the versions are those of the launcher's interpreter and ``cuda``, ``cudnn``, ``threads`` and
    ``nccl`` stay None (the command's own process is not looked into); ``nccl_env`` is what the command inherits."""

    python: str
    torch: str | None = None
    accelerate: str | None = None
    cuda: str | None = None  # torch.version.cuda
    cudnn: str | None = None  # torch.backends.cudnn.version()
    gpu: str | None = None  # the model of rank 0's GPU
    threads: int | None = None  # torch.get_num_threads() on rank 0
    elfes: str | None = None
    code: CodeProvenance | None = None  # None: no snapshot; the attempt imported the workdir as it was
    nccl: str | None = None  # torch.cuda.nccl.version() where rank 0 computes on a GPU, e.g. "2.27.5"; None on CPU
    nccl_env: dict[str, str] = field(default_factory=dict)  # those of NCCL_ORDER_VARIABLES set in the job's environment

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
        if self.nccl:
            parts.append(f"NCCL {self.nccl}")
        parts += [f"{name}={value}" for name, value in sorted(self.nccl_env.items())]
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


@dataclass(frozen=True)
class RankPlace:
    """Where one rank of an attempt computed, as that rank saw it before ``main``: NCCL's reduction order follows
    the rank-to-GPU map."""

    rank: int
    host: str
    device: str | None  # "cuda:<index>" or "cpu"; None for a `command:` job (its own process is not looked into)
    gpu_uuid: str | None = None  # torch.cuda.get_device_properties(index).uuid
    pci_bus_id: str | None = None  # "<domain>:<bus>:<device>.0", as torch gives its parts

    def describe(self) -> str:
        """``node-a cuda:0 (GPU-5f..., 0000:1b:00.0)``."""
        ids = ", ".join(value for value in (self.gpu_uuid, self.pci_bus_id) if value)
        return f"{self.host} {self.device or '(device not looked into)'}" + (f" ({ids})" if ids else "")

    @property
    def on_gpu(self) -> bool:
        return (self.device or "").startswith("cuda")


def changes_between(before: Provenance, after: Provenance, *, earlier: int, later: int) -> list[str]:
    """The bitwise threats between attempt ``earlier`` (``before``) and attempt ``later`` (``after``). A change of
    an NCCL variable is named on a CPU run too: it was set on purpose, and it matters wherever the job uses NCCL."""
    found = []
    for name, label in BITWISE_FIELDS.items():
        old, new = _value(before, name), _value(after, name)
        if old != new:
            found.append(f"attempt {later} runs {label} {_shown(new)}, attempt {earlier} ran {_shown(old)}: a threat to "
                         f"bitwise resume ({_KERNELS}); {_KEEP}")
    old_nccl, new_nccl = _value(before, "nccl"), _value(after, "nccl")
    if old_nccl != new_nccl:
        found.append(f"attempt {later} runs NCCL {_shown(new_nccl)}, attempt {earlier} ran {_shown(old_nccl)}: a threat "
                     f"to bitwise resume ({_NCCL_ORDER}); {_KEEP}")
    old_env, new_env = _value(before, "nccl_env") or {}, _value(after, "nccl_env") or {}
    for name in sorted(set(old_env) | set(new_env)):
        if old_env.get(name) != new_env.get(name):
            found.append(f"attempt {later} runs {_assigned(name, new_env)}, attempt {earlier} ran "
                         f"{_assigned(name, old_env)}: a threat to bitwise resume ({_NCCL_ORDER}); {_KEEP}")
    return found


def place_changes(before: tuple[RankPlace, ...], after: tuple[RankPlace, ...], *, earlier: int, later: int,
                  rank: int | None = None) -> list[str]:
    """The ranks (or only ``rank``) that compute on a GPU in attempt ``earlier`` or ``later`` and moved to another
    host or device: NCCL's reduction order follows the rank-to-GPU map and the topology. A rank on a CPU in both
    is not named: gloo adds in an order set by the ranks and the sizes, not by the host."""
    old = {place.rank: place for place in before}
    moved = []
    for place in after:
        was = old.get(place.rank)
        if was is None or was == place or rank not in (None, place.rank):
            continue
        if (was.on_gpu or place.on_gpu) and None not in (was.device, place.device):  # a device not looked into: unknown
            moved.append((was, place))
    if not moved:
        return []
    shown = "; ".join(f"rank {new.rank}: {was.describe()} -> {new.describe()}" for was, new in moved[:4])
    more = f"; and {len(moved) - 4} more ranks" if len(moved) > 4 else ""
    return [f"attempt {later} runs {len(moved)} rank{'s' if len(moved) > 1 else ''} on another host or GPU than "
            f"attempt {earlier} ({shown}{more}): a threat to bitwise resume (NCCL's reduction order follows the "
            "rank-to-GPU map and the topology: bitwise continuation on GPUs is not promised across this change); "
            "resume on the hosts and GPUs of the earlier attempts to keep the run bitwise equal to an uninterrupted one"]


def _shown(value: Any) -> str:
    return "none" if value is None else str(value)


def _assigned(name: str, environment: dict[str, str]) -> str:
    return f"{name}={environment[name]}" if name in environment else f"{name} unset"


def environment_changes(state: Any) -> list[str]:
    """Every change of a bitwise field between consecutive attempts that recorded their provenance, and of the
    rank-to-GPU map between consecutive attempts that recorded where their ranks ran."""
    found = []
    previous = None
    places = None
    for attempt in getattr(state, "attempts", ()):
        provenance = attempt.provenance
        if provenance is not None:
            if previous is not None:
                found += changes_between(previous[1], provenance, earlier=previous[0], later=attempt.number)
            previous = (attempt.number, provenance)
        if attempt.rank_places:
            if places is not None:
                found += place_changes(places[1], attempt.rank_places, earlier=places[0], later=attempt.number)
            places = (attempt.number, attempt.rank_places)
    return found


def changes_at(state: Any, number: int) -> list[str]:
    """The bitwise threats of attempt ``number`` against the latest earlier attempt that recorded its provenance."""
    attempts = [attempt for attempt in getattr(state, "attempts", ()) if attempt.provenance is not None]
    current = next((attempt for attempt in attempts if attempt.number == number), None)
    earlier = [attempt for attempt in attempts if attempt.number < number]
    if current is None or not earlier:
        return []
    return changes_between(earlier[-1].provenance, current.provenance, earlier=earlier[-1].number, later=number)


def place_changes_at(state: Any, number: int, rank: int) -> list[str]:
    """Whether ``rank`` of attempt ``number`` moved to another host or GPU since the latest earlier attempt that
    recorded where that rank ran (its own log names it)."""
    attempts = [attempt for attempt in getattr(state, "attempts", ())
                if any(place.rank == rank for place in attempt.rank_places)]
    current = next((attempt for attempt in attempts if attempt.number == number), None)
    earlier = [attempt for attempt in attempts if attempt.number < number]
    if current is None or not earlier:
        return []
    return place_changes(earlier[-1].rank_places, current.rank_places, earlier=earlier[-1].number, later=number,
                         rank=rank)
