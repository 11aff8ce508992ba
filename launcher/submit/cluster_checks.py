"""A spec's SLURM options checked against the cluster that will run it, before anything is created: the
partition (``sinfo``), the account and the QOS (``sacctmgr``, where accounting answers).

A check whose command is absent or does not answer is skipped (a laptop preparing a dry run, a cluster
without accounting): sbatch keeps the last word. Only options the spec sets are checked, each with one
command. Torch-free, a login-node module; ``check_executor`` (launcher/submit/executors.py) calls it.
"""

from __future__ import annotations

import json
import os
import pwd

from ..slurm import SlurmError, accounts, cluster_config, partition_list, qos_names, user_accounts
from ..spec import JobSpec


def partition_problem(partition: str) -> str | None:
    """Why ``slurm.partition`` (one name, or several separated by commas) names no partition of this
    cluster (None: it does, or ``sinfo`` does not answer)."""
    listed = partition_list()
    if listed is None:
        return None
    unknown = [name for name in partition.split(",") if name not in listed.names]
    if not unknown:
        return None
    shown = ", ".join(f"{name} (the default)" if name == listed.default else name for name in listed.names)
    return (f"slurm.partition = {json.dumps(partition)}: no partition {json.dumps(unknown[0])} on this cluster; "
            f"its partitions are "
            f"{shown}. Set slurm.partition to one of them, or null for the default")


def account_problem(account: str) -> str | None:
    """Why ``slurm.account`` is not an account this user may charge (None: it is, or ``sacctmgr`` does
    not answer). The user's associations decide; a user with none may name any account that exists."""
    user = pwd.getpwuid(os.getuid()).pw_name
    names = user_accounts(user)
    what = f"an account of user {user} on this cluster"
    if names == ():
        names = accounts()
        what = "an account on this cluster"
    if not names or account.lower() in (name.lower() for name in names):
        return None
    return (f"slurm.account = {json.dumps(account)}: not {what} (sacctmgr lists {', '.join(names)}). "
            "Set slurm.account to one of them, or null for your default account")


def qos_problem(qos: str) -> str | None:
    """Why ``slurm.qos`` names no QOS of this cluster (None: it does, or ``sacctmgr`` does not answer)."""
    names = qos_names()
    if not names or qos.lower() in (name.lower() for name in names):
        return None
    return (f"slurm.qos = {json.dumps(qos)}: no such QOS on this cluster (sacctmgr lists {', '.join(names)}). Set slurm.qos "
            "to one of them, or null for the default")


def cluster_problems(spec: JobSpec) -> list[str]:
    """What the cluster says is wrong with the spec's partition, account and QOS (empty: nothing, or no
    cluster answers here)."""
    slurm = spec.slurm
    problems = [
        partition_problem(slurm.partition) if slurm.partition else None,
        account_problem(slurm.account) if slurm.account else None,
        qos_problem(slurm.qos) if slurm.qos else None,
    ]
    return [problem for problem in problems if problem]


def max_array_size() -> int | None:
    """The cluster's ``MaxArraySize`` (``scontrol show config``): a job array's task indices run from 0 to one
    less than it, so an array holds at most this many tasks. None where scontrol does not answer."""
    try:
        return cluster_config().max_array_size
    except SlurmError:
        return None
