"""Two SLURM hosts on one machine (``two_hosts.py``): the fixture and the facts multi-node jobs rely on.

Proven against real daemons: ``srun -N2 -n2 hostname`` from the root namespace runs one task on each
host; a 2-node batch job's step sees its own host name, address and SLURM ranks on each node, the first
host of ``SLURM_JOB_NODELIST`` is ``node1`` (where submitit's ``TorchDistributedEnvironment`` puts the
master), and ``sacct`` works from inside the job; teardown ends by pid what a job left running in a node
and deletes the namespaces and bridge it made, and nothing else.

ELFES on two hosts (real jobs through the `elfes` CLI, gloo between the hosts, the quickstart model): a
2-node job preempted by a `high` job (the user signal) saves, requeues itself and resumes bitwise equal
(torch.equal on every tensor) to the same job run uninterrupted, its hosts listed per attempt by `elfes
status`; the requeue signal sent to the task on node2 alone stops both ranks at the same window boundary
and requeues once; a 2-node x 2-task job forms one group of 4 ranks, numbered across the hosts.

Bad nodes left behind: a 1-node job that hangs is requeued onto the other host with the first excluded
(ExcNodeList) and resumes bitwise; a 2-node job that loses a rank names the lost rank's node, whose exclusion
leaves the requeue no room: the run ends failed saying so, and `elfes resume --include-nodes` finishes it
bitwise.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import slurm_runs
from cluster import process_alive, wait_for
from run_comparison import assert_runs_bitwise_equal
from two_hosts import TwoHostCluster

from elfes.launcher.rundir import state as run_state
from elfes.launcher.rundir.paths import RunPaths

STEP = (
    'echo "$(hostname) $(hostname -i) procid=$SLURM_PROCID nodeid=$SLURM_NODEID localid=$SLURM_LOCALID '
    'first=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1)"'
)


def test_srun_from_the_root_namespace_runs_a_task_on_each_host(slurm_two_hosts: TwoHostCluster):
    assert slurm_two_hosts.node_states() == {"node1": "idle", "node2": "idle"}
    completed = slurm_two_hosts.run("srun", "-N2", "-n2", "hostname", timeout_s=60)
    assert sorted(completed.stdout.split()) == ["node1", "node2"]


def test_two_node_batch_job_sees_one_host_per_node(slurm_two_hosts: TwoHostCluster, tmp_path: Path):
    output = tmp_path / "out.txt"
    script = f"srun bash -c '{STEP}' | sort\nsacct -n -X -o JobID -j $SLURM_JOB_ID | tr -d ' '\n"
    job_id = int(
        slurm_two_hosts.run(
            "sbatch", "--parsable", "-N2", "--ntasks-per-node=1", f"--output={output}", "--wrap", script, cwd=tmp_path
        ).stdout.strip()
    )
    wait_for(
        lambda: (
            slurm_two_hosts.run("sacct", "-n", "-X", "-P", "-o", "State", "-j", str(job_id)).stdout.strip()
            == "COMPLETED"
        ),
        timeout_s=30,
        what=f"sacct to report job {job_id} COMPLETED",
    )
    node1, node2 = (node.address for node in slurm_two_hosts.nodes)
    assert output.read_text().splitlines() == [
        f"node1 {node1} procid=0 nodeid=0 localid=0 first=node1",
        f"node2 {node2} procid=1 nodeid=1 localid=0 first=node1",
        str(job_id),  # sacct from inside a node reached slurmdbd through the bridge
    ]


@pytest.fixture
def open_folder() -> Iterator[Path]:
    """A new folder under /tmp that all users may search (munged requires it; pytest's tmp_path is private)."""
    folder = Path(tempfile.mkdtemp(prefix="elfes-test-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


def test_stop_ends_escaped_processes_and_deletes_only_its_network(
    slurm_two_hosts_cluster: TwoHostCluster, open_folder: Path
):
    """By hand (no accounting: fast), next to the session's two-host cluster, whose network must survive."""
    script = [sys.executable, str(Path(__file__).with_name("two_hosts.py"))]
    started = subprocess.run(
        [*script, "start", "--dir", str(open_folder), "--no-accounting"], capture_output=True, text=True, timeout=60
    )
    assert started.returncode == 0, started.stderr
    second = TwoHostCluster.attach(open_folder)
    try:
        assert second.subnet != slurm_two_hosts_cluster.subnet
        # A job whose step leaves a process behind in node2 (setsid: outside the job's process tracking).
        escape = "setsid -f sleep 600 </dev/null >/dev/null 2>&1"  # no stream left open for srun to wait on
        second.run("srun", "-w", "node2", "bash", "-c", escape, timeout_s=60)
        escaped = wait_for(
            lambda: [pid for pid in second.namespace_pids("node2") if _command(pid).startswith("sleep")],
            timeout_s=10,
            what="the escaped sleep in node2",
        )
        namespaces, bridge = list(second.namespaces.values()), second.bridge
    finally:
        stopped = subprocess.run(
            [*script, "stop", "--dir", str(open_folder)], capture_output=True, text=True, timeout=120
        )
    assert stopped.returncode == 0, stopped.stderr
    assert not any(process_alive(pid) for pid in escaped)
    assert not any(Path(f"/run/netns/{namespace}").exists() for namespace in namespaces)
    assert bridge not in subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert list(open_folder.iterdir()) == []
    # The session's cluster is untouched.
    assert slurm_two_hosts_cluster.node_states() == {"node1": "idle", "node2": "idle"}
    assert all(Path(f"/run/netns/{namespace}").exists() for namespace in slurm_two_hosts_cluster.namespaces.values())


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except FileNotFoundError:
        return ""


# -- ELFES jobs on the two hosts ----------------------------------------------------------------------------------
ELFES = str(Path(sys.executable).with_name("elfes"))
REPOSITORY = Path(__file__).resolve().parents[2]
# 256 samples in batches of 16, accumulation 2: on 2 ranks 4 optimizer steps per epoch, 8 in all (4 on 4 ranks).
CONFIG = {"epochs": 2, "train_samples": 256, "log_every": 1}
PLANNED_STEPS = 8
STEP_DELAY_S = 0.4  # per batch, in the interrupted runs: ~6 s of training, so that a signal lands mid-run
RUN_TIMEOUT_S = 180.0  # torch imports of several ranks on 2 loaded cores


def write_spec(folder: Path, name: str, *, tasks_per_node: int = 1, step_delay_s: float = 0.0, nodes: int = 2,
               entrypoint: str = "tests.slurm.two_host_jobs:ranked_quickstart", config: dict | None = None,
               requeue: dict | None = None) -> Path:
    spec = folder / f"{name}.yaml"
    spec.write_text(json.dumps({
        "name": name, "entrypoint": entrypoint, "workdir": str(REPOSITORY),
        "run_dir": str(folder / name), "config": {**CONFIG, "step_delay_s": step_delay_s, **(config or {})},
        "resources": {"nodes": nodes, "tasks_per_node": tasks_per_node, "gpus_per_node": 0, "cpus_per_task": 1,
                      "mem_gb": 1, "timeout_min": 10},
        "slurm": {"partition": "low", "signal_delay_s": 60}, "requeue": {"max_requeues": 3, **(requeue or {})},
        "env": {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPOSITORY)},
    }))
    return spec


def elfes(cluster: TwoHostCluster, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environment = {**cluster.env, **(env or {})}
    completed = subprocess.run([ELFES, *argv], env=environment, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, f"elfes {' '.join(argv)}: {completed.stderr}"
    return completed


def submit(cluster: TwoHostCluster, folder: Path, name: str, env: dict[str, str] | None = None, **spec: Any) -> Path:
    submitted = elfes(cluster, "submit", str(write_spec(folder, name, **spec)), "--executor", "slurm", env=env)
    assert "as slurm job" in submitted.stdout
    return folder / name


def state_of(run_dir: Path) -> run_state.RunState | None:
    return run_state.load_state(RunPaths(run_dir))


def diagnostics(run_dir: Path) -> str:
    paths = RunPaths(run_dir)
    files = [paths.state, *sorted(paths.pids.glob("*.json")), *sorted(paths.logs.glob("attempt-*/rank-*.*")),
             *sorted(paths.submitit.glob("*_log.*"))]
    return "\n".join(f"--- {file} (tail) ---\n{file.read_text(errors='replace')[-2500:]}" for file in files
                     if file.is_file())


def wait_run(run_dir: Path, condition: Callable[[], Any], what: str, timeout_s: float = RUN_TIMEOUT_S) -> Any:
    """``wait_for`` that fails with the run's files, and at once when the run failed meanwhile."""
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        state = state_of(run_dir)
        if state is not None and state.status == "failed" or time.monotonic() > deadline:
            pytest.fail(f"waiting for {what}: the run is {state.status if state else 'not started'}\n"
                        f"{diagnostics(run_dir)}")
        time.sleep(0.1)
    return value


def wait_ended(run_dir: Path, status: str = "finished") -> run_state.RunState:
    """The run's state once it ended, which must be ``status`` (a run that ends failed is awaited too)."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while (state := state_of(run_dir)) is None or state.status not in run_state.ENDED:
        if time.monotonic() > deadline:
            pytest.fail(f"waiting for the run to end: it is {state.status if state else 'not started'}\n"
                        f"{diagnostics(run_dir)}")
        time.sleep(0.1)
    assert state.status == status, diagnostics(run_dir)
    return state


def wait_finished(run_dir: Path) -> run_state.RunState:
    state = wait_run(run_dir, lambda: (s := state_of(run_dir)) is not None and s.status in run_state.ENDED and s,
                     "the run to end")
    assert state.status == "finished", diagnostics(run_dir)
    return state


def trained_to(run_dir: Path, step: int) -> bool:
    """Whether the run logged a train record at ``step`` or later."""
    try:
        lines = RunPaths(run_dir).events.read_text().splitlines()
    except FileNotFoundError:
        return False
    return any('"event": "train"' in line and json.loads(line).get("step", -1) >= step for line in lines[:-1])


def task(run_dir: Path, rank: int, attempt: int) -> dict | None:
    """The pid record of ``rank`` in ``attempt`` (written once its signal handlers are in), or None."""
    try:
        record = json.loads(RunPaths(run_dir).pid_file(rank).read_text())
    except (FileNotFoundError, ValueError):
        return None
    return record if record.get("attempt") == attempt else None


def rank_records(run_dir: Path, ranks: int) -> list[dict]:
    """What each rank of the latest attempt recorded about itself (tests/slurm/two_host_jobs.py)."""
    return [json.loads((run_dir / "ranks" / f"rank-{rank}.json").read_text()) for rank in range(ranks)]


def ends_in_logs(run_dir: Path, attempt: int, ranks: int) -> list[str]:
    """How each rank said ``attempt`` ended ("requeued (SIGUSR2) at step 3")."""
    paths = RunPaths(run_dir)
    return [re.search(rf"elfes: attempt {attempt} ended (.*)", paths.rank_log(attempt, rank).read_text()).group(1)
            for rank in range(ranks)]


def outcomes(state: run_state.RunState) -> list[tuple]:
    return [(attempt.outcome, attempt.signal, attempt.launch, attempt.hosts) for attempt in state.attempts]


def test_preempted_two_node_job_requeues_and_resumes_bitwise(
    slurm_two_hosts: TwoHostCluster, tmp_path: Path, reference: Callable[[int], Path]
):
    """A job in `low` on node1 and node2 is preempted by a job in `high` that needs both whole nodes: SLURM
    sends the user signal (USR2) to both tasks, they save `last` at one boundary, rank 0 runs `scontrol
    requeue`, the preemptor runs, and the relaunch on both hosts resumes to the uninterrupted run's end."""
    expected = reference(2)
    run_dir = submit(slurm_two_hosts, tmp_path, "preempted", step_delay_s=STEP_DELAY_S)
    wait_run(run_dir, lambda: task(run_dir, 0, 1) and task(run_dir, 1, 1) and trained_to(run_dir, 2),
             "attempt 1 to train to step 2")
    preemptor = slurm_two_hosts.run(
        "sbatch", "--parsable", "--partition=high", "--nodes=2", "--exclusive", "--mem=100M",
        f"--output={tmp_path / 'preemptor.out'}", "--wrap", "srun hostname", cwd=tmp_path).stdout.strip()
    wait_run(run_dir, lambda: (s := state_of(run_dir)) and s.attempts[0].ended, "attempt 1 to end")
    wait_for(lambda: slurm_two_hosts.run("sacct", "-n", "-X", "-P", "-o", "State", "-j", preemptor).stdout.strip()
             == "COMPLETED", timeout_s=60, what=f"the preempting job {preemptor} to complete")
    assert sorted((tmp_path / "preemptor.out").read_text().split()) == ["node1", "node2"]
    state = wait_finished(run_dir)

    hosts = ("node1", "node2")
    assert outcomes(state) == [("requeued", "SIGUSR2", "submit", hosts), ("finished", None, "requeue", hosts)]
    assert 2 <= state.attempts[0].step < PLANNED_STEPS and state.attempts[1].step == PLANNED_STEPS
    assert ends_in_logs(run_dir, 1, 2) == [f"requeued (SIGUSR2) at step {state.attempts[0].step}"] * 2
    assert {attempt.job_id for attempt in state.attempts} == {state.job_id}  # SLURM relaunched the same job
    assert [r["environment"]["SLURM_RESTART_COUNT"] for r in rank_records(run_dir, 2)] == ["1", "1"]
    report = json.loads(elfes(slurm_two_hosts, "status", str(run_dir), "--json").stdout)
    assert report["status"] == "finished" and [a["hosts"] for a in report["attempts"]] == [list(hosts)] * 2
    table = elfes(slurm_two_hosts, "status", str(run_dir)).stdout
    assert table.count("node1,node2") == 2, table  # the attempts table: one row per attempt
    assert wait_finished(expected).attempts[-1].step == PLANNED_STEPS
    assert_runs_bitwise_equal(run_dir, expected)


def test_requeue_signal_to_one_host_stops_both_ranks_at_one_boundary(
    slurm_two_hosts: TwoHostCluster, tmp_path: Path, reference: Callable[[int], Path]
):
    """USR2 sent to the task on node2 alone (by its pid, which is a pid of the root namespace too): rank 0 on
    node1 never sees it, yet both ranks stop at the same window boundary, rank 0 requeues the job (once),
    and the relaunch resumes bitwise."""
    expected = reference(2)
    run_dir = submit(slurm_two_hosts, tmp_path, "one-host", step_delay_s=STEP_DELAY_S)
    record = wait_run(run_dir, lambda: task(run_dir, 0, 1) and trained_to(run_dir, 2) and task(run_dir, 1, 1),
                      "attempt 1 to train to step 2")
    assert record["host"] == "node2"
    assert record["pid"] in slurm_two_hosts.namespace_pids("node2")
    assert record["pid"] not in slurm_two_hosts.namespace_pids("node1")
    assert "submitit.core._submit" in _command(record["pid"])
    os.kill(record["pid"], signal.SIGUSR2)
    state = wait_finished(run_dir)

    hosts = ("node1", "node2")
    assert outcomes(state) == [("requeued", "SIGUSR2", "submit", hosts), ("finished", None, "requeue", hosts)]
    saved = state.attempts[0].step
    assert 2 <= saved < PLANNED_STEPS and state.requeues_used == 1
    # Both ranks agreed on the stop (and on its reason) at the same boundary; the record of it, `last`,
    # came from rank 0.
    assert ends_in_logs(run_dir, 1, 2) == [f"requeued (SIGUSR2) at step {saved}"] * 2
    stopped = [json.loads(line) for line in RunPaths(run_dir).events.read_text().splitlines()
               if '"event": "stopped"' in line]
    assert [(event["reason"], event["state"]["step"]) for event in stopped] == [("SIGUSR2", saved)]
    assert [r["environment"]["SLURM_RESTART_COUNT"] for r in rank_records(run_dir, 2)] == ["1", "1"]
    assert wait_finished(expected).attempts[-1].step == PLANNED_STEPS
    assert_runs_bitwise_equal(run_dir, expected)


def test_a_sharded_model_over_two_hosts_preempted_resumes_bitwise(
    slurm_two_hosts: TwoHostCluster, tmp_path: Path, straight_runs: Callable[..., Path]
):
    """examples/charlm with its model sharded over 2 nodes x 1 task (FSDP2, gloo between the hosts), given the
    requeue signal by `elfes preempt`: the rank on each host writes its shards of `last` into one folder, rank 0
    requeues, and the relaunch on both hosts reads them back and ends bitwise equal to a straight local run
    (the session's, which test_slurm_preemption.py's sharded job compares with too)."""
    straight = straight_runs(tasks=2, **slurm_runs.SHARDED_CHARLM)
    spec = slurm_runs.write_spec(tmp_path, "sharded", nodes=2, tasks=1, step_delay_s=0.1, **slurm_runs.SHARDED_CHARLM)  # type: ignore[arg-type]
    assert "as slurm job" in elfes(slurm_two_hosts, "submit", str(spec), "--executor", "slurm").stdout
    run_dir = tmp_path / "sharded"
    wait_run(run_dir, lambda: task(run_dir, 0, 1) and task(run_dir, 1, 1) and trained_to(run_dir, 2),
             "attempt 1 to train to step 2")
    elfes(slurm_two_hosts, "preempt", str(run_dir))
    state = wait_finished(run_dir)

    hosts = ("node1", "node2")
    assert outcomes(state) == [("requeued", "SIGUSR2", "submit", hosts), ("finished", None, "requeue", hosts)]
    assert 2 <= state.attempts[0].step < state.attempts[1].step
    shards = sorted(entry.name for entry in RunPaths(run_dir).final.resolve().iterdir())
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp", "state.pt"], shards
    assert wait_finished(straight).attempts[-1].step == state.attempts[1].step
    assert_runs_bitwise_equal(run_dir, straight)


def test_a_two_node_run_continues_on_one_node_within_float_rounding(
    slurm_two_hosts: TwoHostCluster, tmp_path: Path, straight_runs: Callable[..., Path]
):
    """A finished 2-node x 1-task run whose job derives its accumulation from the world size (a window of 4
    microbatches, no dropout), extended with `elfes resume --set resources.nodes=1`: a new submission of the same
    run trains on one host and ends within float rounding of a run that had the larger budget on 2 ranks (the
    session's, which test_continuing_runs.py compares with too)."""
    import torch
    from run_comparison import named_tensors

    entrypoint, config = "tests.launcher.entrypoints:budget_free_quickstart", {**CONFIG, "window": 4, "dropout": 0.0}
    straight = straight_runs(entrypoint=entrypoint, tasks=2, config={**config, "epochs": 4})
    spec = slurm_runs.write_spec(tmp_path, "resized", nodes=2, tasks=1, step_delay_s=0.0, entrypoint=entrypoint,
                                 config=config)
    assert "as slurm job" in elfes(slurm_two_hosts, "submit", str(spec), "--executor", "slurm").stdout
    run_dir = tmp_path / "resized"
    job_id = wait_finished(run_dir).job_id
    wait_for(lambda: slurm_two_hosts.run("squeue", "-h", "-j", job_id).stdout.strip() == "", timeout_s=60,
             what=f"job {job_id} to leave the queue")
    resumed = elfes(slurm_two_hosts, "resume", str(run_dir), "--set", "config.epochs=4", "--set", "resources.nodes=1")
    assert "recorded spec changed: config.epochs, resources.nodes" in resumed.stdout
    state = wait_run(run_dir, lambda: (s := state_of(run_dir)) is not None and len(s.attempts) == 2
                     and s.status in run_state.ENDED and s, "the continuation on one node to end")
    assert state.status == "finished", diagnostics(run_dir)
    assert [(a.outcome, a.world_size, len(a.hosts)) for a in state.attempts] == [("finished", 2, 2), ("finished", 1, 1)]
    assert state.attempts[0].job_id != state.attempts[1].job_id
    wait_finished(straight)
    expected, final = ({name: tensor for name, tensor in named_tensors(
        torch.load(folder / "checkpoints" / "final", weights_only=True)) if "/rng/" not in name}
        for folder in (straight, run_dir))
    assert final.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(final[name], tensor, rtol=1e-4, atol=1e-6, msg=name)


def test_a_two_node_job_that_loses_a_rank_is_requeued_onto_both_nodes_and_resumes_bitwise(
    slurm_two_hosts: TwoHostCluster, tmp_path: Path, reference: Callable[[int], Path]
):
    """The task on node2 is SIGKILLed mid-run (a rank lost; it reports nothing): rank 0's collective fails
    with the lost peer, rank 0 waits for rank 1's report, none comes, so the failure names rank 1 and node2,
    where the silent rank ran. Leaving node2 out (requeue.exclude_failed_nodes, the default) would leave a 2-node job
    no room on the cluster's 2 nodes, where SLURM would hold it pending for good: so nothing is left out,
    the log says why, and the job is requeued onto both hosts and ends bitwise equal to the uninterrupted run."""
    expected = reference(2)
    run_dir = submit(slurm_two_hosts, tmp_path, "rank-lost", step_delay_s=STEP_DELAY_S)
    record = wait_run(run_dir, lambda: task(run_dir, 0, 1) and trained_to(run_dir, 2) and task(run_dir, 1, 1),
                      "attempt 1 to train to step 2")
    assert record["host"] == "node2" and "submitit.core._submit" in _command(record["pid"])
    os.kill(record["pid"], signal.SIGKILL)
    state = wait_finished(run_dir)

    failure = state.attempts[0].failure
    # the rank that failed is named, not the survivor whose connection to it broke
    assert failure.category == "lost" and failure.rank == 1 and failure.host == "node2", diagnostics(run_dir)
    assert failure.nodes == ("node2",) and failure.retried
    assert state.attempts[0].error.startswith("rank 1 was lost: it ended without reporting an error")
    # the requeue that could leave no node out says so where `elfes status` shows it, not only in the log
    assert "the requeued job cannot be placed without node2" in state.attempts[0].error
    assert state.excluded_nodes == () and state.failures_used == 1 and state.requeues_used == 0
    hosts = ("node1", "node2")
    assert [(a.outcome, a.launch, a.hosts) for a in state.attempts] == [
        ("failed", "submit", hosts), ("finished", "requeue", hosts)], diagnostics(run_dir)
    log = "".join(path.read_text() for path in RunPaths(run_dir).attempt_logs(1).glob("rank-*.out"))
    assert ("the requeued job cannot be placed without node2: partition low has 2 nodes (node1, node2) and the "
            "job needs 2 (resources.nodes), so no node is left out") in log, log[-3000:]
    assert wait_finished(expected).attempts[-1].step == PLANNED_STEPS
    assert_runs_bitwise_equal(run_dir, expected)


def test_two_nodes_of_two_tasks_form_one_group_of_four_ranks(slurm_two_hosts: TwoHostCluster, tmp_path: Path):
    """2 nodes x 2 tasks: global ranks 0-3 across the hosts (0, 1 on node1; 2, 3 on node2), local ranks
    per host, the master on the allocation's first host, one process group of 4 that trains to the end.
    Submitted from inside another distributed job: sbatch exports its variables to the job, where SLURM's
    view replaces every one of them (the port too: it comes from the job id, not from the submitter)."""
    surrounding = {"MASTER_ADDR": "elsewhere", "MASTER_PORT": "29517", "RANK": "5", "WORLD_SIZE": "9",
                   "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "3"}
    run_dir = submit(slurm_two_hosts, tmp_path, "four-ranks", env=surrounding, tasks_per_node=2)
    state = wait_finished(run_dir)
    records = rank_records(run_dir, 4)
    seen = [(r["host"], *(r["environment"][name] for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                                              "MASTER_ADDR"))) for r in records]
    assert seen == [("node1", "0", "0", "4", "2", "node1"), ("node1", "1", "1", "4", "2", "node1"),
                    ("node2", "2", "0", "4", "2", "node1"), ("node2", "3", "1", "4", "2", "node1")]
    assert [(r["job"]["rank"], r["job"]["local_rank"], r["job"]["world_size"]) for r in records] == [
        (0, 0, 4), (1, 1, 4), (2, 0, 4), (3, 1, 4)]
    assert len({r["environment"]["MASTER_PORT"] for r in records}) == 1
    assert records[0]["environment"]["MASTER_PORT"] != surrounding["MASTER_PORT"]
    assert outcomes(state) == [("finished", None, "submit", ("node1", "node2"))]
    assert state.attempts[0].world_size == 4 and state.attempts[0].step == PLANNED_STEPS // 2
    started = [json.loads(line) for line in RunPaths(run_dir).events.read_text().splitlines()
               if '"event": "started"' in line]
    assert [event["world_size"] for event in started] == [4]  # one gloo group of the 4 tasks


def test_a_one_node_job_that_hangs_is_requeued_onto_the_other_host_and_resumes_bitwise(
    slurm_two_hosts: TwoHostCluster, tmp_path: Path, reference: Callable[[int], Path]
):
    """A 1-node x 2-task job (the reference's 2 ranks, on one host): rank 1 hangs at step 7 in attempt 1; the
    watchdog (hang_timeout_s) ends the attempt and the deciding rank requeues the job with that host excluded
    (ExcNodeList); attempt 2 runs on the other host and ends bitwise equal to the uninterrupted run. Each rank
    recorded its host in each attempt, and the move of ranks on the CPU (gloo) is not named as a threat."""
    expected = reference(2)
    run_dir = submit(slurm_two_hosts, tmp_path, "leaves-node", nodes=1, tasks_per_node=2, step_delay_s=0.05,
                     entrypoint="tests.launcher.fault_entrypoints:sleeps_at_step_7",
                     config={"fault_rank": 1, "fault_attempts": [1]}, requeue={"hang_timeout_s": 10})
    state = wait_finished(run_dir)
    (first,), (second,) = (attempt.hosts for attempt in state.attempts)
    assert {first, second} == {"node1", "node2"}, diagnostics(run_dir)  # attempt 2 left the hung host out
    hung = state.attempts[0].failure
    assert hung.category == "hang" and hung.retried and hung.nodes == (first,) and hung.step == 7
    assert [(node.host, node.attempt) for node in state.excluded_nodes] == [(first, 1)]
    assert [attempt.launch for attempt in state.attempts] == ["submit", "requeue"]
    assert state.failures_used == 1 and state.attempts[1].step == PLANNED_STEPS
    logs = "".join(RunPaths(run_dir).rank_log(1, rank).read_text() for rank in range(2))  # the deciding rank's
    assert f"SLURM job {state.job_id} leaves out {first} when it starts again (ExcNodeList" in logs
    shown = elfes(slurm_two_hosts, "status", str(run_dir)).stdout
    assert f"node {first} excluded after attempt 1 failed there (hang: " in shown, shown
    # every rank recorded the host it ran on; gloo's order does not follow the host: the move is not a threat
    assert [[(place.host, place.device) for place in attempt.rank_places] for attempt in state.attempts] == [
        [(first, "cpu")] * 2, [(second, "cpu")] * 2]
    assert "on another host or GPU" not in shown, shown
    assert wait_finished(expected).attempts[-1].step == PLANNED_STEPS
    assert_runs_bitwise_equal(run_dir, expected)
