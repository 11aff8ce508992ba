"""The SLURM adapter: every ``sbatch``, ``squeue``, ``sacct``, ``sacctmgr``, ``scontrol``, ``scancel`` and
``sinfo`` that ELFES runs itself, with its timeout and the parsing of its answer, returned typed (frozen
dataclasses). submitit keeps the ``sbatch`` of a submission (launcher/submit/executors.py drives it).

The launcher's lowest floor: every other floor may import it, it imports none of them. Torch-free.

- :mod:`.tools`: running one command (:func:`run` -> :class:`Answer`), the timeouts, :class:`SlurmError`.
- :mod:`.queue`: what SLURM says of jobs (:func:`queue_entry`, :func:`user_jobs`, :class:`SlurmQueue`,
  :func:`job_starts`).
- :mod:`.cluster`: what the cluster is (configuration, partitions, nodes, accounts, QOS).
- :mod:`.control`: what ELFES asks SLURM to do to a job (requeue, exclude nodes, cancel, signal, test job).
"""

from .cluster import (
    PartitionList,
    Settings,
    accounts,
    cluster_config,
    partition_list,
    partition_nodes,
    partitions,
    qos_names,
    slurm_available,
    slurm_configured,
    user_accounts,
)
from .control import (
    SIGNAL_ANSWER_S,
    TEST_JOB_TIMEOUT_S,
    cancel,
    cancel_by_name,
    exclude_nodes,
    requeue,
    scontrol_test_job,
    signal_job,
    submitted_job_id,
)
from .queue import ALIVE_STATES, GONE, JobStart, QueuedJob, QueueEntry, SlurmQueue, job_starts, queue_entry, user_jobs
from .tools import IN_JOB_TIMEOUT_S, TOOL_TIMEOUT_S, Answer, SlurmError, Tool, run

__all__ = [
    "ALIVE_STATES", "GONE", "IN_JOB_TIMEOUT_S", "SIGNAL_ANSWER_S", "TEST_JOB_TIMEOUT_S", "TOOL_TIMEOUT_S", "Answer",
    "JobStart", "PartitionList", "QueueEntry", "QueuedJob", "Settings", "SlurmError", "SlurmQueue", "Tool", "accounts", "cancel",
    "cancel_by_name", "cluster_config", "exclude_nodes", "job_starts", "partition_list", "partition_nodes", "partitions",
    "qos_names", "queue_entry", "requeue", "run", "scontrol_test_job", "signal_job", "slurm_available",
    "slurm_configured", "submitted_job_id", "user_accounts", "user_jobs",
]
