"""The rendezvous port of a job: rank 0 takes one that is free, holds it and publishes it for this start; the
other ranks read it (submitit's port, derived from the job id, can be in use: EADDRINUSE)."""

from __future__ import annotations

import socket
import threading

import pytest

from elfes.launcher.job import distributed_env
from elfes.launcher.job.distributed_env import Start, reserve_rendezvous_port
from elfes.launcher.rundir.paths import RunPaths


def start(rank: int, world_size: int = 2) -> Start:
    return Start(executor="local", job_id="4242", restart=0, rank=rank, local_rank=rank, world_size=world_size,
                 host="h", hosts=("h",))


def rendezvous_port(paths: RunPaths, start: Start, token: str) -> int:
    reservation = reserve_rendezvous_port(paths, start, token)
    reservation.release()
    return reservation.port


def test_every_rank_of_a_start_gets_the_port_rank_0_holds(tmp_path):
    paths = RunPaths(tmp_path / "run")
    found: dict[int, int] = {}
    rank1 = threading.Thread(target=lambda: found.__setitem__(1, rendezvous_port(paths, start(1), "4242:0/1")))
    rank1.start()  # waits for rank 0's file
    held = reserve_rendezvous_port(paths, start(0), "4242:0/1")
    rank1.join(30)
    assert found[1] == held.port
    with socket.socket() as other, pytest.raises(OSError, match="Address already in use"):
        other.bind(("", held.port))  # nobody else can take it while rank 0 holds it...
    held.release()
    with socket.socket() as server:
        server.bind(("", held.port))  # ...and it is free once let go


def test_torch_rendezvous_listens_on_the_held_port(tmp_path):
    import datetime

    import torch.distributed as dist

    held = reserve_rendezvous_port(RunPaths(tmp_path / "run"), start(0), "4242:0/1")
    for use_libuv in (True, False):  # both of torch's TCPStore backends
        server = dist.TCPStore("127.0.0.1", held.port, 2, True, timeout=datetime.timedelta(seconds=30),
                               wait_for_workers=False, use_libuv=use_libuv)
        client = dist.TCPStore("127.0.0.1", held.port, 2, False, timeout=datetime.timedelta(seconds=30),
                               use_libuv=use_libuv)
        client.set("ready", "yes")
        assert server.get("ready") == b"yes"
        del client, server
    held.release()


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
