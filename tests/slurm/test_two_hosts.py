"""Two SLURM hosts on one machine (``two_hosts.py``): the fixture and the facts multi-node jobs rely on.

Proven against real daemons: ``srun -N2 -n2 hostname`` from the root namespace runs one task on each
host; a 2-node batch job's step sees its own host name, address and SLURM ranks on each node, the first
host of ``SLURM_JOB_NODELIST`` is ``node1`` (where submitit's ``TorchDistributedEnvironment`` puts the
master), and ``sacct`` works from inside the job; teardown ends by pid what a job left running in a node
and deletes the namespaces and bridge it made, and nothing else.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster import process_alive, wait_for
from two_hosts import TwoHostCluster

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
