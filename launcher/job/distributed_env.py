"""Who this task is, as the executor (SLURM or submitit's local controller) sees it, and the torch
distributed environment it exports for the entrypoint.

- :func:`detect_start`: job id, restart number, rank, local rank, world size and hosts of this task's
  start (the same job id and restart on every rank), from submitit's ``JobEnvironment`` (which reads
  ``SLURM_*`` or ``SUBMITIT_LOCAL_*``).
- :func:`reserve_rendezvous_port`: the ``MASTER_PORT`` of this start, held by rank 0, read by the others.
- :func:`export_distributed_environment`: ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``,
  ``LOCAL_RANK`` (submitit's ``TorchDistributedEnvironment``) and, without GPUs, ``ACCELERATE_USE_CPU``,
  so that a plain ``Accelerator()`` in the entrypoint forms one process group of all the tasks.

Inside the job only; torch-free (the engine is imported later).
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass

from elfes.files import write_text_atomically

from ..backends import Executor, ExecutorError, backend_for
from ..rundir.paths import RunPaths


@dataclass(frozen=True)
class Start:
    """Who and where this task is, and which start of the job it belongs to (the same on every rank)."""

    executor: Executor  # submitit's SUBMITIT_EXECUTOR
    job_id: str
    restart: int  # 0 for the job's first start; SLURM_RESTART_COUNT, or this rank's local start count - 1
    rank: int
    local_rank: int
    world_size: int
    host: str
    hosts: tuple[str, ...]

    def token(self, submissions: int) -> str:
        """This start's name in ``state.json``: job id and restart, and the number of submissions so far
        (a local job id is a process id, which a later submission of the same run may reuse)."""
        return f"{self.job_id}:{self.restart}/{submissions}"


def detect_start(paths: RunPaths, submissions: int) -> Start:
    """This task's :class:`Start`. Every rank; ``submissions`` is the count in ``state.json`` before it."""
    from submitit.core.job_environment import JobEnvironment

    environment = JobEnvironment()
    rank = environment.global_rank
    try:
        backend = backend_for(environment.name())
    except ExecutorError:
        raise RuntimeError(
            f"JobRuntime runs under submitit's slurm or local executor; SUBMITIT_EXECUTOR is {environment.name()!r}. "
            "Submit the job with `elfes submit` (--executor local or slurm)."
        ) from None
    restart = backend.restart(paths.start_count(rank), job=f"{environment.job_id}/{submissions}")
    return Start(executor=backend.executor, job_id=str(environment.job_id), restart=restart, rank=rank,
                 local_rank=environment.local_rank, world_size=environment.num_tasks,
                 host=socket.gethostname(), hosts=tuple(environment.hostnames))


PORT_WAIT_S = 300.0  # how long the other ranks wait for rank 0's port (a shared file system may show it late)


@dataclass
class RendezvousPort:
    """The port of torch's rendezvous for this start, and on rank 0 the socket that holds it: bound with
    SO_REUSEADDR and never listening, it keeps the kernel from handing the port to another process's bind
    or outgoing connection, while the TCPStore that torch creates later (also SO_REUSEADDR) can still
    listen on it. Keep the object for as long as the job runs."""

    port: int
    holder: socket.socket | None = None

    def release(self) -> None:
        if self.holder is not None:
            self.holder.close()
            self.holder = None


def _held_free_port() -> socket.socket:
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("", 0))
    return holder


def reserve_rendezvous_port(paths: RunPaths, start: Start, token: str) -> RendezvousPort:
    """The rendezvous port of this start of the job: rank 0 (on the first host, MASTER_ADDR) takes a free
    one and holds it, and publishes it in ``RunPaths.master_port`` (the run directory is shared by every
    host of a job); the other ranks read it from there. submitit derives the port from the job id instead,
    which can be in use: a local job's id is a process id, and ports in the ephemeral range are taken by
    other processes' connections; two jobs or a busy host then clash with EADDRINUSE. A port found free
    and let go again can be taken the same way before torch binds it, hence the holder."""
    if start.rank == 0:
        holder = _held_free_port()
        port = holder.getsockname()[1]
        if start.world_size > 1:
            paths.pids.mkdir(parents=True, exist_ok=True)
            write_text_atomically(paths.master_port, json.dumps({"start": token, "port": port}) + "\n")
        return RendezvousPort(port, holder)
    deadline = time.monotonic() + PORT_WAIT_S
    while True:
        try:
            recorded = json.loads(paths.master_port.read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            recorded = {}
        if recorded.get("start") == token and isinstance(recorded.get("port"), int):
            return RendezvousPort(recorded["port"])
        if time.monotonic() > deadline:
            raise RuntimeError(f"rank 0 of {start.executor} job {start.job_id} did not publish its rendezvous port in "
                               f"{paths.master_port} within {PORT_WAIT_S:.0f} s; see rank 0's log")
        time.sleep(0.05)


def export_distributed_environment(*, gpus_per_node: int, master_port: int) -> None:
    """Export the torch distributed variables of this task (every rank, before the entrypoint), with
    ``master_port`` from :func:`reserve_rendezvous_port`."""
    if gpus_per_node == 0:
        os.environ["ACCELERATE_USE_CPU"] = "1"  # without it Accelerate forms no group on a CPU-only machine
    from submitit.helpers import TorchDistributedEnvironment

    # A job submitted from inside another distributed job (or from a shell that sets them) inherits its
    # variables: sbatch exports the submitter's environment. overwrite replaces them, except that submitit
    # keeps an inherited MASTER_PORT (or derives one from the job id, which may be in use): rank 0's
    # reserved port replaces it.
    TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
    os.environ["MASTER_PORT"] = str(master_port)
