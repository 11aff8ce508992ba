"""The rendezvous port of a job: rank 0 takes one that is free and publishes it for this start; the other
ranks read it (submitit's port, derived from the job id, can be in use: EADDRINUSE)."""

from __future__ import annotations

import socket
import threading

import pytest

from elfes.launcher.job import distributed_env
from elfes.launcher.job.distributed_env import Start, rendezvous_port
from elfes.launcher.rundir.paths import RunPaths


def start(rank: int, world_size: int = 2) -> Start:
    return Start(executor="local", job_id="4242", restart=0, rank=rank, local_rank=rank, world_size=world_size,
                 host="h", hosts=("h",))


def test_every_rank_of_a_start_gets_the_free_port_rank_0_chose(tmp_path):
    paths = RunPaths(tmp_path / "run")
    found: dict[int, int] = {}
    rank1 = threading.Thread(target=lambda: found.__setitem__(1, rendezvous_port(paths, start(1), "4242:0/1")))
    rank1.start()  # waits for rank 0's file
    found[0] = rendezvous_port(paths, start(0), "4242:0/1")
    rank1.join(30)
    assert found[0] == found[1]
    with socket.socket() as server:
        server.bind(("", found[0]))  # free: nothing listens on it yet


def test_a_port_published_for_another_start_is_not_taken(tmp_path, monkeypatch):
    paths = RunPaths(tmp_path / "run")
    rendezvous_port(paths, start(0), "4242:0/1")
    monkeypatch.setattr(distributed_env, "PORT_WAIT_S", 0.3)
    with pytest.raises(RuntimeError, match="did not publish its rendezvous port"):
        rendezvous_port(paths, start(1), "4242:1/1")  # the relaunch: rank 0 has not written yet


def test_a_single_rank_writes_no_file(tmp_path):
    paths = RunPaths(tmp_path / "run")
    assert rendezvous_port(paths, start(0, world_size=1), "4242:0/1") > 0
    assert not paths.master_port.exists()
