"""What the cluster is: whether one answers here, its configuration (``scontrol show config``), its partitions
(``scontrol show partition``, ``sinfo``), and its accounts and QOS (``sacctmgr``). Torch-free; asks, changes
nothing.

>>> cluster_config().get("KillWait")  # doctest: +SKIP
'10 sec'
>>> partition_nodes("low")  # doctest: +SKIP
('node1', 'node2')
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from .tools import IN_JOB_TIMEOUT_S, PING_TIMEOUT_S, Tool, answered, run

SLURM_CONFIG_FILES = (Path("/etc/slurm/slurm.conf"), Path("/etc/slurm-llnl/slurm.conf"))


def slurm_configured() -> bool:
    """Whether SLURM's client commands can find a cluster: ``SLURM_CONF``, a ``slurm.conf`` in its
    usual places, or (configless clusters) a controller that answers ``scontrol ping``."""
    if os.environ.get("SLURM_CONF") or any(path.is_file() for path in SLURM_CONFIG_FILES):
        return True
    return run(Tool.SCONTROL, "ping", timeout_s=PING_TIMEOUT_S).ok


def slurm_available() -> bool:
    """Whether ``auto`` means SLURM here: ``sbatch`` is on PATH and a SLURM configuration is found
    (the client packages alone, without a cluster, do not count)."""
    return shutil.which(Tool.SBATCH.value) is not None and slurm_configured()


@dataclass(frozen=True)
class Settings:
    """``Name=value`` settings as SLURM prints them (the cluster's configuration, or one partition's), read-only."""

    values: Mapping[str, str]

    def get(self, name: str, default: str | None = None) -> str | None:
        return self.values.get(name, default)

    def __contains__(self, name: object) -> bool:
        return name in self.values

    def __getitem__(self, name: str) -> str:
        return self.values[name]

    @property
    def max_array_size(self) -> int | None:
        """``MaxArraySize``: a job array's task indices run from 0 to one less than it. None where not a number."""
        value = (self.values.get("MaxArraySize") or "").strip()
        return int(value) if value.isdigit() else None


def cluster_config() -> Settings:
    """``scontrol show config`` (``KillWait`` -> ``"10 sec"``); raises :class:`SlurmError` where it does not answer."""
    values = {}
    for line in answered(run(Tool.SCONTROL, "show", "config")).stdout.splitlines():
        name, separator, value = line.partition("=")
        if separator and name.strip() and " " not in name.strip():
            values[name.strip()] = value.strip()
    return Settings(MappingProxyType(values))


def partitions() -> dict[str, Settings]:
    """Every partition's settings (``scontrol show partition -o``), by name; raises :class:`SlurmError` where
    scontrol does not answer."""
    found = {}
    for line in answered(run(Tool.SCONTROL, "show", "partition", "-o")).stdout.splitlines():
        settings = dict(part.split("=", 1) for part in line.split() if "=" in part)
        if "PartitionName" in settings:
            found[settings["PartitionName"]] = Settings(MappingProxyType(settings))
    return found


@dataclass(frozen=True)
class PartitionList:
    """The cluster's partitions as ``sinfo --all`` lists them, and its default one (None: no default)."""

    names: tuple[str, ...]
    default: str | None


def partition_list() -> PartitionList | None:
    """Every partition of the cluster (``sinfo``); None where sinfo does not answer or lists none."""
    listed = run(Tool.SINFO, "--all", "--noheader", "--format=%P")
    lines = listed.lines() if listed.ok else []
    if not lines:
        return None
    return PartitionList(tuple(name.rstrip("*") for name in lines),
                         next((name.rstrip("*") for name in lines if name.endswith("*")), None))


def partition_nodes(partition: str | None) -> tuple[str, ...] | None:
    """The nodes of ``partition`` (a comma-separated list, as SLURM writes it; None: every partition),
    from ``sinfo``; None when SLURM does not answer. A job asks it of itself before a requeue."""
    listed = run(Tool.SINFO, "-h", "-N", "-o", "%N", *(("-p", partition) if partition else ()),
                 timeout_s=IN_JOB_TIMEOUT_S)
    return (tuple(listed.lines()) or None) if listed.ok else None


def _sacctmgr_names(*arguments: str) -> tuple[str, ...] | None:
    listed = run(Tool.SACCTMGR, "--noheader", "--parsable2", "show", *arguments)
    return tuple(listed.lines()) if listed.ok else None


def user_accounts(user: str) -> tuple[str, ...] | None:
    """The accounts ``user`` has associations with (``sacctmgr``); None where accounting does not answer."""
    return _sacctmgr_names("associations", "where", f"user={user}", "format=account")


def accounts() -> tuple[str, ...] | None:
    """Every account of the cluster (``sacctmgr``); None where accounting does not answer."""
    return _sacctmgr_names("accounts", "format=account")


def qos_names() -> tuple[str, ...] | None:
    """Every QOS of the cluster (``sacctmgr``); None where accounting does not answer."""
    return _sacctmgr_names("qos", "format=name")
