"""A SLURM cluster of two hosts on one machine: slurmd ``node1`` and ``node2``, each in its own namespaces.

The layout: a bridge in the root network
namespace holds the controller's address; each node has a network namespace joined to the bridge by a veth
pair, with its own address, ``lo`` up and no default route. Addresses come from 198.51.100.0/24 (TEST-NET-2,
RFC 5737: documentation addresses, never routed; this machine's own network is TEST-NET-1), one free /28 per
cluster. One munged in the root namespace serves every node (its socket is a file, reachable from any
network namespace). Each slurmd runs under ``nsenter --net`` + ``unshare --uts --mount`` with its own host
name and a private hosts file bind-mounted over /etc/hosts (not ``ip netns exec``: it remounts /sys and
slurmd 22.05 then dies initialising cgroups); it daemonizes there, and its jobs run there. slurmctld,
slurmdbd, MariaDB and every client (sbatch, squeue, sacct, submitit) stay in the root namespace with
``SLURM_CONF``; node names resolve only inside the nodes.

By hand (as root)::

    python tests/slurm/two_hosts.py start|status|stop [--dir D]
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from cluster import ClusterError, Node, SlurmCluster, main, process_alive, program, wait_for

TEST_NETWORK = ipaddress.ip_network("198.51.100.0/24")
NODE_NAMES = ("node1", "node2")
NETWORK_PROGRAMS = ("ip", "nsenter", "unshare")


class NamespacesUnavailable(ClusterError):
    """This machine does not let us create the network namespaces, veth pairs or bridge."""


def missing_network_programs() -> list[str]:
    return [name for name in NETWORK_PROGRAMS if _which(name) is None]


def _which(name: str) -> str | None:
    return shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin")


def ip(*arguments: str) -> str:
    """Run ``ip``; raise with its error."""
    completed = subprocess.run([_which("ip") or "ip", *arguments], capture_output=True, text=True, timeout=30)
    if completed.returncode != 0:
        raise ClusterError(f"ip {' '.join(arguments)}: {completed.stderr.strip()}")
    return completed.stdout


def free_subnet() -> ipaddress.IPv4Network:
    """The first /28 of ``TEST_NETWORK`` that no interface of the root namespace uses."""
    used = []
    for line in ip("-4", "-o", "address", "show").splitlines():
        fields = line.split()
        if "inet" in fields:
            used.append(ipaddress.ip_interface(fields[fields.index("inet") + 1]).network)
    for subnet in TEST_NETWORK.subnets(new_prefix=28):
        if not any(subnet.overlaps(network) for network in used):
            return subnet
    raise ClusterError(f"every /28 of {TEST_NETWORK} is in use: stop other two-host clusters first")


class TwoHostCluster(SlurmCluster):
    """Like ``SlurmCluster`` (same options, partitions and timers), with two nodes in namespaces."""

    # Root-namespace daemons must be reachable from the nodes through the bridge, and srun started in
    # the root namespace must be reachable by the nodes' slurmstepd: bind every address.
    bind_host_address_only = False

    def __init__(self, directory: Path | None = None, **options) -> None:
        if directory is None:
            directory = Path(tempfile.gettempdir()) / f"elfes-slurm2-{secrets.token_hex(4)}"
        super().__init__(directory, **options)
        self.token = secrets.token_hex(3)  # in the names of the bridge, veths and namespaces
        self.subnet: ipaddress.IPv4Network | None = None
        self.bridge: str | None = None  # set once created: the only bridge stop deletes
        self.namespaces: dict[str, str] = {}  # node -> namespace, set as each is created

    # ----------------------------------------------------------------------------------------- layout
    @property
    def controller_address(self) -> str:
        return str(self.subnet[1]) if self.subnet else "127.0.0.1"

    @property
    def nodes(self) -> list[Node]:
        if self.subnet is None:
            return [Node(name, "") for name in NODE_NAMES]
        return [Node(name, str(self.subnet[2 + index])) for index, name in enumerate(NODE_NAMES)]

    def namespace_pids(self, node: str) -> list[int]:
        """Pids of the processes in ``node``'s network namespace (slurmd, its job steps, escapees)."""
        namespace = self.namespaces.get(node)
        if namespace is None or not Path(f"/run/netns/{namespace}").exists():
            return []
        return [int(pid) for pid in ip("netns", "pids", namespace).split()]

    # ------------------------------------------------------------------------------------- internals
    def _prepare_hosts(self) -> None:
        self._create_network()

    def _start_slurmds(self, timeout_s: float) -> None:
        hosts = self.directory / "etc" / "hosts"
        hosts.write_text(
            f"127.0.0.1 localhost\n{self.controller_address} {self.hostname}\n"
            + "".join(f"{node.address} {node.name}\n" for node in self.nodes)
        )
        slurmd = program("slurmd")
        for node in self.nodes:
            (self.directory / "spool" / node.name).mkdir(exist_ok=True)
            inside = f"hostname {node.name}; mount --bind {shlex.quote(str(hosts))} /etc/hosts; " + shlex.join(
                [slurmd, "-f", str(self.slurm_conf), "-N", node.name]
            )
            self._launch(
                self._daemon(f"slurmd {node.name}"),
                [
                    program("nsenter"), f"--net=/run/netns/{self.namespaces[node.name]}", "--",
                    program("unshare"), "--uts", "--mount", "--propagation", "private", "--", "sh", "-ec", inside,
                ],
                timeout_s=timeout_s,
            )  # fmt: skip

    def _create_network(self) -> None:
        """Bridge with the controller's address, one namespace + veth pair per node; recorded as made."""
        try:
            self.subnet = free_subnet()
            bridge = f"elfbr{self.token}"
            ip("link", "add", bridge, "type", "bridge")
            self.bridge = bridge
            self._write_manifest()
            ip("address", "add", f"{self.controller_address}/{self.subnet.prefixlen}", "dev", bridge)
            ip("link", "set", bridge, "up")
            for index, node in enumerate(self.nodes, start=1):
                namespace = f"elfes-{self.token}-{node.name}"
                ip("netns", "add", namespace)
                self.namespaces[node.name] = namespace
                self._write_manifest()
                host_end = f"elf{self.token}v{index}"
                ip("link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", namespace)
                ip("link", "set", host_end, "master", bridge, "up")
                ip("-n", namespace, "address", "add", f"{node.address}/{self.subnet.prefixlen}", "dev", "eth0")
                ip("-n", namespace, "link", "set", "eth0", "up")
                ip("-n", namespace, "link", "set", "lo", "up")
        except ClusterError as error:
            raise NamespacesUnavailable(
                f"could not build the two hosts' network (network namespaces, veth pairs, a bridge; needs root "
                f"and a kernel that allows them): {error}"
            ) from error
        self._write_slurm_conf()  # now with the addresses

    def _release(self) -> list[str]:
        """End what still runs in the nodes' namespaces (by pid), then delete the namespaces and bridge."""
        errors = []
        for node in list(self.namespaces):
            try:
                _end_processes([pid for pid in self.namespace_pids(node) if process_alive(pid)])
                if Path(f"/run/netns/{self.namespaces[node]}").exists():
                    ip("netns", "delete", self.namespaces[node])  # takes its veth pair with it
                del self.namespaces[node]
            except ClusterError as error:
                errors.append(str(error))
        if self.bridge is not None:
            try:
                ip("link", "delete", self.bridge)
                self.bridge = None
            except ClusterError as error:
                errors.append(str(error))
        if (self.directory / "cluster.json").exists():
            self._write_manifest()
        return errors

    def _manifest_extra(self) -> dict:
        return {
            "network": {
                "token": self.token,
                "subnet": str(self.subnet) if self.subnet else None,
                "bridge": self.bridge,
                "namespaces": self.namespaces,
            }
        }

    def _restore(self, manifest: dict) -> None:
        network = manifest["network"]
        self.token = network["token"]
        self.subnet = ipaddress.ip_network(network["subnet"]) if network["subnet"] else None
        self.bridge = network["bridge"]
        self.namespaces = dict(network["namespaces"])


def _end_processes(pids: list[int], *, timeout_s: float = 5) -> None:
    """SIGTERM each pid; SIGKILL those still alive after ``timeout_s``."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
        try:
            wait_for(
                lambda: not any(process_alive(pid) for pid in pids),
                timeout_s=timeout_s,
                what=f"processes {pids} to end",
                interval_s=0.05,
            )
            return
        except TimeoutError:
            continue


if __name__ == "__main__":
    sys.exit(
        main(
            cluster_class=TwoHostCluster,
            default_directory=Path(tempfile.gettempdir()) / "elfes-slurm-two-hosts",
            description=__doc__.split("\n\n")[0],
        )
    )
