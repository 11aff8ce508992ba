"""What decides a collective's reduction order, recorded per attempt (launcher/job/provenance.py,
launcher/rundir/provenance.py): the NCCL version, the NCCL variables that choose the order, and where every rank
computes; a change between attempts is named as a threat to a bitwise resume on GPUs, and never stops the run.

The records compared are the ones this process collects for a job on the CPU (no NCCL, every rank on
"cpu"), changed as another attempt would record them; end to end, a two-rank local job resumed with another ``NCCL_ALGO``.
"""

from __future__ import annotations

import dataclasses
import json
import re
import socket
from pathlib import Path

import pytest
import torch
from local_runs import Runs, wait_ended

from elfes.launcher.cli.main import main as elfes
from elfes.launcher.commands.status import run_status
from elfes.launcher.job.provenance import collect, rank_place
from elfes.launcher.rundir import state as run_state
from elfes.launcher.rundir.paths import RunPaths
from elfes.launcher.rundir.provenance import NCCL_ORDER_VARIABLES, environment_changes

REPOSITORY = Path(__file__).resolve().parents[2]
THREAT = "a threat to bitwise resume (NCCL may add the ranks' contributions in another order: bitwise continuation " \
         "on GPUs is not promised across this change)"
MOVED = "a threat to bitwise resume (NCCL's reduction order follows the rank-to-GPU map and the topology: bitwise " \
        "continuation on GPUs is not promised across this change)"


def two_attempts(first: run_state.Attempt, second: run_state.Attempt) -> run_state.RunState:
    state = run_state.RunState(status="running", executor="slurm", max_requeues=5, attempts=(first, second))
    assert run_state.RunState.from_json(json.loads(json.dumps(state.to_json()))) == state  # state.json keeps it
    return state


def attempt(number: int, **fields) -> run_state.Attempt:
    return run_state.Attempt(number=number, token=f"7:{number}", job_id="7", launch="requeue", started_at="t", **fields)


def test_a_changed_nccl_variable_or_version_is_a_threat_and_other_variables_are_not_recorded(monkeypatch, tmp_path):
    for name in NCCL_ORDER_VARIABLES:  # whatever this machine sets
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NCCL_ALGO", "Ring")
    monkeypatch.setenv("NCCL_DEBUG", "INFO")  # says what NCCL does, changes nothing of its order: not recorded
    (tmp_path / "nccl.conf").write_text("NCCL_PROTO=LL\n")
    monkeypatch.setenv("NCCL_CONF_FILE", str(tmp_path / "nccl.conf"))  # NCCL's own file: not read
    before = collect(code=None, gpus=False)
    assert before.nccl is None and before.nccl_env == {"NCCL_ALGO": "Ring"}  # a job on the CPU: no NCCL
    monkeypatch.setenv("NCCL_ALGO", "Tree")
    monkeypatch.setenv("NCCL_PROTO", "Simple")
    after = collect(code=None, gpus=False)
    assert after.nccl_env == {"NCCL_ALGO": "Tree", "NCCL_PROTO": "Simple"} and "NCCL_ALGO=Tree" in after.describe()

    changes = environment_changes(two_attempts(attempt(1, provenance=before), attempt(2, provenance=after)))
    assert changes == [f"attempt 2 runs NCCL_ALGO=Tree, attempt 1 ran NCCL_ALGO=Ring: {THREAT}; resume in the "
                       "environment of the earlier attempts to keep the run bitwise equal to an uninterrupted one",
                       f"attempt 2 runs NCCL_PROTO=Simple, attempt 1 ran NCCL_PROTO unset: {THREAT}; resume in the "
                       "environment of the earlier attempts to keep the run bitwise equal to an uninterrupted one"]
    assert not environment_changes(two_attempts(attempt(1, provenance=after), attempt(2, provenance=after)))
    other_nccl = dataclasses.replace(after, nccl="2.27.3")  # as a GPU attempt with another NCCL would record
    changes = environment_changes(two_attempts(attempt(1, provenance=dataclasses.replace(after, nccl="2.21.5")),
                                               attempt(2, provenance=other_nccl)))
    assert [change.split(":")[0] for change in changes] == ["attempt 2 runs NCCL 2.27.3, attempt 1 ran 2.21.5"]
    assert THREAT in changes[0] and "NCCL 2.27.3" in other_nccl.describe()


def test_a_gpu_rank_on_another_host_or_gpu_is_a_threat_and_a_cpu_rank_on_another_host_is_not():
    here = [rank_place(rank=rank, local_rank=rank, host=socket.gethostname(), gpus=False) for rank in (0, 1)]
    assert [(place.rank, place.host, place.device) for place in here] == [
        (0, socket.gethostname(), "cpu"), (1, socket.gethostname(), "cpu")]  # a job on the CPU
    elsewhere = tuple(dataclasses.replace(place, host="node-b") for place in here)
    # gloo adds in an order the host does not change: the move is recorded, and named nowhere
    assert not environment_changes(two_attempts(attempt(1, rank_places=tuple(here)),
                                                attempt(2, rank_places=elsewhere)))

    # as ranks on GPUs record themselves: rank 1 moved to another GPU of the same host, rank 0 stayed
    gpus = tuple(dataclasses.replace(place, device=f"cuda:{place.rank}", gpu_uuid=f"GPU-{place.rank}aa",
                                     pci_bus_id=f"0000:{place.rank + 1:02x}:00.0") for place in here)
    moved = (gpus[0], dataclasses.replace(gpus[1], device="cuda:3", gpu_uuid="GPU-3cc", pci_bus_id="0000:07:00.0"))
    changes = environment_changes(two_attempts(attempt(1, rank_places=gpus), attempt(2, rank_places=moved)))
    assert changes == [f"attempt 2 runs 1 rank on another host or GPU than attempt 1 (rank 1: {here[1].host} cuda:1 "
                       f"(GPU-1aa, 0000:02:00.0) -> {here[1].host} cuda:3 (GPU-3cc, 0000:07:00.0)): {MOVED}; resume on "
                       "the hosts and GPUs of the earlier attempts to keep the run bitwise equal to an uninterrupted one"]
    assert not environment_changes(two_attempts(attempt(1, rank_places=gpus), attempt(2, rank_places=gpus)))


def test_state_json_keeps_each_rank_s_place_whichever_rank_records_first(tmp_path: Path):
    from run_fixtures import make_run

    paths = make_run(tmp_path, outcome="stopped")
    token = run_state.load_state(paths).attempts[0].token
    for rank in (1, 0, 1):  # rank 1 before rank 0, then again (a record replaces that rank's own)
        place = rank_place(rank=rank, local_rank=rank, host=f"node-{rank}", gpus=False)
        run_state.update_state(paths, lambda s, place=place: run_state.record_rank_place(s, token=token, place=place))
    assert [(p.rank, p.host, p.device) for p in run_state.load_state(paths).attempts[0].rank_places] == [
        (0, "node-0", "cpu"), (1, "node-1", "cpu")]


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here: the GPU case below runs instead")
def test_without_cuda_a_job_asking_for_gpus_records_the_cpu_and_no_nccl():
    assert rank_place(rank=0, local_rank=0, host="here", gpus=True).device == "cpu"
    assert collect(code=None, gpus=True).nccl is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the GPU's UUID, PCI bus id and NCCL version")
def test_a_rank_on_a_gpu_records_the_device_its_uuid_and_pci_bus_id_and_nccl():
    place = rank_place(rank=0, local_rank=0, host="here", gpus=True)
    assert place.device == "cuda:0" and place.gpu_uuid
    assert re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.0", place.pci_bus_id or ""), place.pci_bus_id
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", collect(code=None, gpus=True).nccl or ""), "no NCCL version recorded"
    assert collect(code=None, gpus=False).nccl is None and rank_place(rank=0, local_rank=0, host="here",
                                                                      gpus=False).device == "cpu"


def test_the_guide_names_the_recorded_nccl_variables():
    guide = (REPOSITORY / "docs" / "run-directory.md").read_text()
    named = re.search(r"those of (NCCL_.*?) that are set in the job's environment", guide, re.DOTALL)
    assert named is not None and re.findall(r"NCCL_[A-Z_]+", named.group(1)) == list(NCCL_ORDER_VARIABLES)


# -- end to end on the local executor ---------------------------------------------------------------------------
def test_a_run_resumed_with_another_nccl_algo_records_every_rank_and_warns(runs: Runs, capsys):
    """Two ranks finish one epoch with NCCL_ALGO=Ring; `elfes resume` with NCCL_ALGO=Tree and a second epoch: the
    run finishes (the warnings stop nothing), status and rank 0's log name the change, each attempt recorded both
    ranks on this host's CPU and no NCCL. Attempt 1's record says rank 1 was on a GPU of another host (as a
    SLURM attempt elsewhere would have): rank 1's log and status name its move, rank 0's log does not."""
    run_dir = runs.submit("algo", tasks=2, entrypoint="tests.launcher.entrypoints:budget_free_quickstart",
                          config={"epochs": 1, "train_samples": 64, "log_every": 1},
                          env={"OMP_NUM_THREADS": "1", "NCCL_ALGO": "Ring"})
    first = wait_ended(run_dir, "finished").attempts[0]
    host = socket.gethostname()
    assert [(p.rank, p.host, p.device) for p in first.rank_places] == [(0, host, "cpu"), (1, host, "cpu")]
    paths = RunPaths(run_dir)
    data = json.loads(paths.state.read_text())
    data["attempts"][0]["rank_places"][1].update(host="node-b", device="cuda:1", gpu_uuid="GPU-1aa",
                                                 pci_bus_id="0000:02:00.0")
    paths.state.write_text(json.dumps(data))

    assert elfes(["resume", str(run_dir), "--set", "config.epochs=2", "--set", "env.NCCL_ALGO=Tree"]) == 0
    state = wait_ended(run_dir, "finished")
    assert [a.outcome for a in state.attempts] == ["finished", "finished"]
    assert [a.provenance.nccl_env.get("NCCL_ALGO") for a in state.attempts] == ["Ring", "Tree"]
    assert [a.provenance.nccl for a in state.attempts] == [None, None]
    assert [(p.rank, p.host, p.device) for p in state.attempts[1].rank_places] == [(0, host, "cpu"), (1, host, "cpu")]

    algo = f"attempt 2 runs NCCL_ALGO=Tree, attempt 1 ran NCCL_ALGO=Ring: {THREAT}"
    moved = f"attempt 2 runs 1 rank on another host or GPU than attempt 1 (rank 1: node-b cuda:1 (GPU-1aa, " \
            f"0000:02:00.0) -> {host} cpu): {MOVED}"
    notes = run_status(run_dir).notes
    assert any(note.startswith(algo) for note in notes) and any(note.startswith(moved) for note in notes), notes
    rank_0, rank_1 = (paths.rank_log(2, rank, "err").read_text() for rank in (0, 1))
    assert algo in rank_0 and moved not in rank_0
    assert moved in rank_1 and algo not in rank_1  # each rank names its own move; rank 0 the rest
    capsys.readouterr()
    assert elfes(["status", str(run_dir)]) == 0
    shown = " ".join(capsys.readouterr().out.split())  # the console may wrap long lines
    assert algo in shown and moved in shown
