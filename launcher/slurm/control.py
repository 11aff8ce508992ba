"""What ELFES asks SLURM to do to a job: requeue it (``scontrol requeue``), leave nodes out when it starts again
(``scontrol update ... ExcNodeList``), cancel or signal it (``scancel``), and submit ``elfes doctor``'s test job
(``sbatch --wait``). Each returns the command's :class:`~launcher.slurm.tools.Answer`; the caller words what it
means for the run. Torch-free.

>>> requeue("77").ok                     # from inside job 77 (rank 0)  # doctest: +SKIP
True
>>> signal_job("77", "USR2").command  # doctest: +SKIP
'scancel --signal=USR2 77'
"""

from __future__ import annotations

from collections.abc import Sequence

from .tools import IN_JOB_TIMEOUT_S, TOOL_TIMEOUT_S, Answer, Tool, run

# scancel answers at once when SLURM takes the signal; when SLURM answers "Job can not be altered now, try
# again later" it retries by itself, sleeping 5 s, then 6, 7, ... (about 95 s in all). `elfes preempt` gives it
# this long, then looks at the run's own record.
SIGNAL_ANSWER_S = 2.5
# How long elfes doctor's test job may wait in the queue and run before doctor gives up on it.
TEST_JOB_TIMEOUT_S = 180


def requeue(job_id: str) -> Answer:
    """``scontrol requeue JOB_ID`` from inside the job: SLURM ends every task and starts the job again, same id.
    It returns at once; the job's own SIGTERM does not cut it short."""
    return run(Tool.SCONTROL, "requeue", job_id, timeout_s=IN_JOB_TIMEOUT_S, in_job=True)


def exclude_nodes(job_id: str, hosts: Sequence[str]) -> Answer:
    """``scontrol update JobId=JOB_ID ExcNodeList=HOSTS`` from inside the job (the list replaces the job's).
    SLURM takes it only for a pending job: a requeued one is, until it may start again."""
    return run(Tool.SCONTROL, "update", f"JobId={job_id}", f"ExcNodeList={','.join(hosts)}",
               timeout_s=IN_JOB_TIMEOUT_S, in_job=True)


def cancel(job_id: str, *, in_job: bool = False) -> Answer:
    """``scancel JOB_ID``: SIGTERM to everything, SIGKILL KillWait later, state CANCELLED; ``in_job``: the job
    cancels itself."""
    if in_job:
        return run(Tool.SCANCEL, job_id, timeout_s=IN_JOB_TIMEOUT_S, in_job=True)
    return run(Tool.SCANCEL, job_id)


def signal_job(job_id: str, signal_name: str, *, full: bool = False, timeout_s: float = TOOL_TIMEOUT_S) -> Answer:
    """``scancel [--full] --signal=NAME JOB_ID`` (``NAME`` without ``SIG``): the job's steps get it, with ``full``
    the batch shell too. The job is not cancelled."""
    return run(Tool.SCANCEL, *(("--full",) if full else ()), f"--signal={signal_name}", job_id, timeout_s=timeout_s)


def cancel_by_name(name: str) -> Answer:
    """``scancel --name=NAME``: every job of this user with that name."""
    return run(Tool.SCANCEL, f"--name={name}")


def scontrol_test_job(name: str, partition: str, *, account: str | None = None, qos: str | None = None) -> Answer:
    """Submit a one-minute job named ``name`` that runs ``scontrol show job $SLURM_JOB_ID`` on its node, and wait
    (``sbatch --wait``, at most TEST_JOB_TIMEOUT_S) for its exit code; :func:`submitted_job_id` reads its id."""
    argv = ["--wait", "--parsable", f"--job-name={name}", f"--partition={partition}", "--time=1", "--ntasks=1",
            "--output=/dev/null", "--requeue"]
    argv += [f"--{option}={value}" for option, value in (("account", account), ("qos", qos)) if value]
    argv += ["--wrap", 'scontrol show job "$SLURM_JOB_ID" > /dev/null']
    return run(Tool.SBATCH, *argv, timeout_s=TEST_JOB_TIMEOUT_S)


def submitted_job_id(answer: Answer) -> str | None:
    """The job id ``sbatch --parsable`` printed (``ID`` or ``ID;CLUSTER``), or None."""
    return answer.stdout.strip().split(";")[0] or None
