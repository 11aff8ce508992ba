"""A private single-node SLURM cluster for the tests, and for trying ELFES on SLURM by hand.

Everything lives in one folder: its own munged (private key, socket and pid file), MariaDB (a private
datadir, socket and loopback port) behind slurmdbd so that ``sacct`` works, slurmctld and slurmd. Daemons
listen on free loopback ports chosen at start, so two clusters (two checkouts) can run side by side and a
system SLURM, if any, is never touched. Two partitions: ``low`` (default, preemptible, PreemptMode=REQUEUE
with a grace time) and ``high`` (preempts it). Timers are short, so that tests wait seconds, not minutes:
the scheduler runs every 2 s (backfill every 1 s), KillWait and GraceTime are set per cluster, and a
COMPLETING job holds its node for KillWait at most.

By hand (as root)::

    python tests/slurm/cluster.py start [--dir D] [--no-user-signal]   # prints: export SLURM_CONF=...
    python tests/slurm/cluster.py status [--dir D]
    python tests/slurm/cluster.py stop [--dir D]

In tests: ``SlurmCluster(folder).start()`` ... ``.stop()``; every client command needs ``cluster.env``
(``SLURM_CONF``). Daemons are stopped by the pid in their pid files, never by name.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

PACKAGES = "slurmctld slurmd slurm-client munge slurmdbd mariadb-server-core mariadb-client-core"
INSTALL_COMMAND = f"apt-get install -y --no-install-recommends {PACKAGES}"
# Programs the cluster runs, with the package that ships each (Debian 12).
PROGRAMS = {
    "munged": "munge",
    "mungekey": "munge",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "slurmdbd": "slurmdbd",
    "sbatch": "slurm-client",
    "srun": "slurm-client",
    "squeue": "slurm-client",
    "sinfo": "slurm-client",
    "scontrol": "slurm-client",
    "scancel": "slurm-client",
    "sacct": "slurm-client",
    "mariadbd": "mariadb-server-core",
    "mariadb-install-db": "mariadb-server-core",
    "mariadb": "mariadb-client-core",
    "my_print_defaults": "mariadb-client-core",  # mariadb-install-db fails without it
}
MANIFEST = "cluster.json"
DEFAULT_DIRECTORY = Path(tempfile.gettempdir()) / "elfes-slurm"
CLUSTER_NAME = "elfes"
DATABASE_USER, DATABASE_PASSWORD, DATABASE_NAME = "slurm", "elfes-test", "slurm_acct_db"

T = TypeVar("T")


class ClusterError(RuntimeError):
    """A daemon did not start or stop, or a client command failed; the message carries the log tails."""


def missing_programs() -> list[str]:
    """Programs of ``PROGRAMS`` not on PATH (PATH plus the sbin folders, where Debian puts daemons)."""
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin", "/usr/local/sbin"])
    return [name for name in PROGRAMS if shutil.which(name, path=search) is None]


def program(name: str) -> str:
    path = shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))
    if path is None:
        raise ClusterError(
            f"{name} is not installed (package {PROGRAMS.get(name, '?')}); install with: {INSTALL_COMMAND}"
        )
    return path


def wait_for(condition: Callable[[], T], *, timeout_s: float, what: str, interval_s: float = 0.1) -> T:
    """Poll ``condition`` until it returns something truthy; raise ``TimeoutError`` naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)


def free_ports(count: int) -> list[int]:
    """``count`` different TCP ports free on every address now (the daemons bind them a moment later).

    Drawn at random below the kernel's ephemeral range, never from it: a port that ``bind(0)`` finds free is one
    that the next outgoing connection of any process (a gloo group of a test beside) may take, or that another
    cluster starting at the same moment may be handed too, before the daemon binds it."""
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    candidates = range(max(1024, ephemeral_low - 12000), ephemeral_low)
    ports: list[int] = []
    probes: list[socket.socket] = []  # held open until all are chosen: no port twice
    try:
        for port in secrets.SystemRandom().sample(candidates, min(len(candidates), 400)):
            probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                probe.bind(("0.0.0.0", port))
            except OSError:
                probe.close()
                continue
            probes.append(probe)
            ports.append(port)
            if len(ports) == count:
                return ports
    finally:
        for probe in probes:
            probe.close()
    raise ClusterError(f"found no {count} free TCP ports in {candidates.start}-{candidates.stop - 1}")


def process_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as ended: PID 1 here does not reap orphans)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def process_is(pid: int, executable: str) -> bool:
    """True if ``pid`` is alive and runs ``executable`` (guards against a pid file naming a reused pid)."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return process_alive(pid) and Path(command).name == executable


def parent_pid(pid: int) -> int:
    """The parent of ``pid`` (0 once it is gone)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return 0


def command_line(pid: int) -> bytes:
    """The raw command line of ``pid`` (b"" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return b""


@dataclass(frozen=True)
class Daemon:
    """One daemon of the cluster: the program it runs, its pid file and its log file."""

    name: str
    executable: str
    pid_file: Path
    log_file: Path

    def pid(self) -> int | None:
        """The pid in the pid file if that process is still this daemon, else None."""
        try:
            pid = int(self.pid_file.read_text().split()[0])
        except (FileNotFoundError, IndexError, ValueError):
            return None
        return pid if process_is(pid, self.executable) else None


@dataclass(frozen=True)
class Node:
    """A node of the cluster: its SLURM name and the address slurmd listens on."""

    name: str
    address: str


class SlurmCluster:
    """A private SLURM cluster in ``directory``; see the module docstring.

    ``user_signal``: ``SlurmctldParameters=preempt_send_user_signal`` (a preempted job submitted with
    ``--signal=USR2@N`` gets USR2; without it, SIGTERM). ``accounting``: slurmdbd + MariaDB (``sacct``).
    ``grace_time_s``: GraceTime of the ``low`` partition; ``kill_wait_s``: KillWait (the save budget of
    a cancelled job); ``cred_expire_s``: a requeued job may start again only after this. ``node_cpus``: the
    CPUs the node offers (default: what ``slurmd -C`` reports; more oversubscribes the machine, for many tiny jobs).
    ``max_array_size``: ``MaxArraySize`` (default SLURM's, 1001). Partitions: ``low`` (the default, preemptible),
    ``high`` (preempts ``low`` and ``shared``), ``shared`` (preemptible, up to 4 jobs per CPU).
    """

    # slurmd, slurmdbd and clients bind only the address the host name resolves to (CommunicationParameters=
    # NoInAddrAny); slurmctld 22.05 always binds every address (its port is a random free one).
    bind_host_address_only = True

    def __init__(
        self,
        directory: Path | None = None,
        *,
        user_signal: bool = True,
        accounting: bool = True,
        grace_time_s: int = 20,
        kill_wait_s: int = 10,
        cred_expire_s: int = 10,
        node_cpus: int | None = None,
        max_array_size: int | None = None,
    ) -> None:
        # Default: a new folder in the temporary folder (munged wants every folder above its socket
        # searchable by all users: pytest's tmp_path is not).
        if directory is None:
            directory = Path(tempfile.gettempdir()) / f"elfes-slurm-{secrets.token_hex(4)}"
        self.directory = Path(directory).resolve()
        self.created_directory = False
        self.user_signal = user_signal
        self.accounting = accounting
        self.grace_time_s = grace_time_s
        self.kill_wait_s = kill_wait_s
        self.cred_expire_s = cred_expire_s
        self.node_cpus = node_cpus
        self.max_array_size = max_array_size
        self.hostname = socket.gethostname().split(".")[0]
        self.ports: dict[str, int] = {}
        self.created: list[str] = []  # top-level entries of directory this cluster made
        self.timings_s: dict[str, float] = {}
        self._mariadbd: subprocess.Popen | None = None

    # ----------------------------------------------------------------------------------------- layout
    @property
    def slurm_conf(self) -> Path:
        return self.directory / "etc" / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.directory / "munge" / "run" / "munge.socket"

    @property
    def database_socket(self) -> Path:
        return self.directory / "run" / "mariadbd.sock"

    @property
    def nodes(self) -> list[Node]:
        return [Node(self.hostname, "127.0.0.1")]

    @property
    def controller_address(self) -> str:
        return "127.0.0.1"

    def daemons(self) -> list[Daemon]:
        """The cluster's daemons in start order."""
        run, log = self.directory / "run", self.directory / "log"
        daemons = [Daemon("munged", "munged", self.directory / "munge" / "run" / "munged.pid", log / "munged.log")]
        if self.accounting:
            daemons += [
                Daemon("mariadbd", "mariadbd", run / "mariadbd.pid", log / "mariadbd.log"),
                Daemon("slurmdbd", "slurmdbd", run / "slurmdbd.pid", log / "slurmdbd.log"),
            ]
        daemons.append(Daemon("slurmctld", "slurmctld", run / "slurmctld.pid", log / "slurmctld.log"))
        daemons += [
            Daemon(f"slurmd {node.name}", "slurmd", run / f"slurmd-{node.name}.pid", log / f"slurmd-{node.name}.log")
            for node in self.nodes
        ]
        return daemons

    @property
    def env(self) -> dict[str, str]:
        """The environment for client commands (sbatch, squeue, sacct, submitit): ``SLURM_CONF`` set."""
        return {**os.environ, "SLURM_CONF": str(self.slurm_conf)}

    # ------------------------------------------------------------------------------------ start, stop
    def start(self, *, timeout_s: float = 60) -> SlurmCluster:
        """Write the configuration, start every daemon, and return once the nodes are idle."""
        missing = missing_programs()
        if missing:
            raise ClusterError(f"missing programs: {', '.join(missing)}; install with: {INSTALL_COMMAND}")
        if os.geteuid() != 0:
            raise ClusterError("the private SLURM cluster runs slurmd and slurmctld as root; run as root")
        started = time.monotonic()
        self._make_directory()
        try:
            self._prepare_hosts()
            self._start_munged()
            if self.accounting:
                self._start_mariadbd(timeout_s)
                self._start_slurmdbd(timeout_s)
            self._start_slurmctld(timeout_s)
            self._start_slurmds(timeout_s)
            waited = time.monotonic()
            self._wait_nodes_idle(timeout_s)
            self.timings_s["nodes idle"] = time.monotonic() - waited
        except BaseException as error:
            message = f"{error}\n{self.log_tails()}"
            try:  # the daemons' logs are in the message: remove every file, so the next start begins afresh
                self.stop()
            except ClusterError as stopping:  # something still runs: the manifest stays for `stop`
                message += f"\n{stopping}"
            kind = type(error) if isinstance(error, ClusterError) else ClusterError  # keep NamespacesUnavailable
            raise kind(f"the private SLURM cluster did not start: {message}") from error
        self.timings_s["start"] = time.monotonic() - started
        self._write_manifest()
        return self

    def stop(self, *, remove: bool = True, timeout_s: float = 60) -> None:
        """Cancel every job, wait for the queue to empty, stop each daemon by its pid file's pid.

        ``remove``: delete what the cluster created in its folder (log files included); else keep it.
        """
        started = time.monotonic()
        errors = []
        slurmctld = next(daemon for daemon in self.daemons() if daemon.name == "slurmctld")
        if slurmctld.pid() is not None:
            try:
                self.cancel_all_jobs(timeout_s=timeout_s)
            except (ClusterError, TimeoutError) as error:
                errors.append(str(error))
        for daemon in reversed(self.daemons()):
            error = self._stop_daemon(daemon, timeout_s=15)
            if error:
                errors.append(error)
        if self._mariadbd is not None:
            self._mariadbd.wait(timeout=5)  # reap our own child
            self._mariadbd = None
        errors += self._release()
        self.timings_s["stop"] = time.monotonic() - started
        if remove and not errors:
            self.remove()
        if errors:
            raise ClusterError("stopping the private SLURM cluster: " + "; ".join(errors))

    def _prepare_hosts(self) -> None:
        """Before any daemon: set up the nodes' hosts (subclasses: namespaces and network)."""

    def _release(self) -> list[str]:
        """After the daemons: release what else the cluster set up (subclasses: network). Returns errors."""
        return []

    def remove(self) -> None:
        """Delete what this cluster created in its folder (and the folder if it made it); nothing else."""
        for name in [*self.created, MANIFEST]:
            path = self.directory / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
        if self.created_directory:
            try:
                self.directory.rmdir()
            except OSError:
                pass  # someone else put files there: leave them
        self.created = []

    def cancel_all_jobs(self, *, timeout_s: float = 60) -> None:
        """scancel every job until squeue is empty (a job that requeues itself on SIGTERM comes back)."""

        def queue_empty() -> bool:
            jobs = self.run("squeue", "-h", "-o", "%i").stdout.split()
            if jobs:
                self.run("scancel", *{job.split("_")[0] for job in jobs}, check=False)
            return not jobs

        wait_for(queue_empty, timeout_s=timeout_s, what="squeue to empty after scancel", interval_s=0.5)

    def reconfigure(self, *, user_signal: bool) -> None:
        """Switch ``preempt_send_user_signal`` on or off: rewrite slurm.conf, ``scontrol reconfigure``."""
        self.user_signal = user_signal
        self._write_slurm_conf()
        self.run("scontrol", "reconfigure")
        wait_for(
            lambda: ("preempt_send_user_signal" in self.config().get("SlurmctldParameters", "")) == user_signal,
            timeout_s=30,
            what=f"slurmctld to apply preempt_send_user_signal={'on' if user_signal else 'off'}",
        )
        self._wait_nodes_idle(30)
        self._write_manifest()

    @contextmanager
    def node_failure(self, job_id: str, *, timeout_s: float = 60) -> Iterator[None]:
        """The node running ``job_id`` fails as if it lost power, and comes back on leaving the block.

        Every process of the job (``scontrol listpids``, and the slurmstepd above them) and the node's
        slurmd are frozen, then killed, so the job records nothing; ``scontrol update state=down`` then
        tells slurmctld, which requeues the job (Restarts grows, ``PENDING``). On exit slurmd starts again
        and the node returns to service when it registers (``ReturnToService=2``). Single node only.
        """
        slurmd = self._daemon(f"slurmd {self.nodes[0].name}")
        listed = self.run("scontrol", "listpids", job_id).stdout.splitlines()[1:]  # PID JOBID STEPID ...
        pids = {int(line.split()[0]) for line in listed if line.split() and line.split()[0].isdigit()}
        stepds = {parent for parent in map(parent_pid, pids) if command_line(parent).startswith(b"slurmstepd:")}
        doomed = [pid for pid in (slurmd.pid(), *stepds, *pids) if pid is not None]
        for signum in (signal.SIGSTOP, signal.SIGKILL):  # frozen first: nothing reports its end
            for pid in doomed:
                try:
                    os.kill(pid, signum)
                except ProcessLookupError:
                    pass
        wait_for(lambda: not any(process_alive(pid) for pid in doomed), timeout_s=timeout_s,
                 what="the failed node's processes to die")
        self.run("scontrol", "update", f"nodename={self.nodes[0].name}", "state=down", "reason=elfes test: node failure")
        try:
            yield
        finally:
            self._start_slurmds(timeout_s)
            self._wait_nodes_idle(timeout_s)

    # --------------------------------------------------------------------------------------- clients
    def run(self, *command: str, check: bool = True, timeout_s: float = 60, **kwargs) -> subprocess.CompletedProcess:
        """Run a client command against this cluster; on failure (``check``) raise with its output."""
        completed = subprocess.run(
            list(command), env=kwargs.pop("env", self.env), capture_output=True, text=True, timeout=timeout_s, **kwargs
        )
        if check and completed.returncode != 0:
            raise ClusterError(
                f"{' '.join(command)} exited with {completed.returncode}\n"
                f"stdout: {completed.stdout.strip()}\nstderr: {completed.stderr.strip()}"
            )
        return completed

    def config(self) -> dict[str, str]:
        """``scontrol show config`` as a dict."""
        settings = {}
        for line in self.run("scontrol", "show", "config").stdout.splitlines():
            name, separator, value = line.partition("=")
            if separator:
                settings[name.strip()] = value.strip()
        return settings

    def node_states(self) -> dict[str, str]:
        """``{node: state}`` as sinfo reports them (``idle``, ``alloc``, ``down*``, ...)."""
        listing = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False).stdout.split()
        return dict(zip(listing[::2], listing[1::2]))

    def status(self) -> str:
        """A readable summary: each daemon's pid (or ``not running``), then sinfo and squeue."""
        lines = [f"cluster folder: {self.directory}", f"export SLURM_CONF={self.slurm_conf}"]
        for daemon in self.daemons():
            pid = daemon.pid()
            lines.append(f"  {daemon.name:<16} {'pid ' + str(pid) if pid else 'not running'}")
        if any(daemon.pid() for daemon in self.daemons() if daemon.executable == "slurmctld"):
            lines += [
                "",
                self.run("sinfo", check=False).stdout.rstrip(),
                "",
                self.run("squeue", check=False).stdout.rstrip(),
            ]
        return "\n".join(lines)

    # ------------------------------------------------------------------------------------------ logs
    def log_files(self) -> list[Path]:
        return sorted((self.directory / "log").glob("*.log"))

    def log_sizes(self) -> dict[Path, int]:
        """Current size of each log file (to show only what a test added, with ``log_tails(since=...)``)."""
        return {path: path.stat().st_size for path in self.log_files()}

    def log_tails(self, *, since: dict[Path, int] | None = None, max_chars: int = 6000) -> str:
        """The daemon logs (each from ``since``, at most its last ``max_chars``) as one text."""
        parts = []
        for path in self.log_files():
            with path.open("rb") as log:
                log.seek((since or {}).get(path, 0))
                text = log.read().decode(errors="replace")
            if not text.strip():
                continue
            if len(text) > max_chars:
                text = f"[... {len(text) - max_chars} characters cut ...]\n" + text[-max_chars:]
            parts.append(f"----- {path.name} -----\n{text.rstrip()}")
        return "\n".join(parts)

    # ------------------------------------------------------------------------------------- internals
    def _make_directory(self) -> None:
        if (self.directory / MANIFEST).exists():
            raise ClusterError(
                f"{self.directory} already holds a cluster ({MANIFEST}); stop it first: "
                f"python {Path(__file__).name} stop --dir {self.directory}"
            )
        existing = [folder for folder in (self.directory, *self.directory.parents) if folder.exists()]
        # munged refuses a socket below a folder without execute permission for all (user, group and other).
        searchable = {"u": stat.S_IXUSR, "g": stat.S_IXGRP, "o": stat.S_IXOTH}
        closed = [folder for folder in existing if any(not folder.stat().st_mode & bit for bit in searchable.values())]
        if closed:
            mode = closed[0].stat().st_mode
            missing = ",".join(f"{who}+x" for who, bit in searchable.items() if not mode & bit)
            raise ClusterError(
                f"munged needs every folder above its socket searchable by all users, and {closed[0]} is not "
                f"(mode {stat.S_IMODE(mode):o}): use another folder (under /tmp) or chmod {missing} it"
            )
        if not self.directory.exists():
            self.directory.mkdir(parents=True)
            self.created_directory = True
            self.directory.chmod(0o755)  # whatever the umask: see __init__
        names = ["etc", "run", "log", "state", "spool", "munge"] + (["database"] if self.accounting else [])
        taken = [name for name in names if (self.directory / name).exists()]
        if taken:
            raise ClusterError(f"{self.directory} already has {', '.join(taken)}; use a new or empty folder")
        for name in names:
            (self.directory / name).mkdir()
            self.created.append(name)
        listening = ["slurmctld", "slurmd"] + (["slurmdbd", "mariadbd"] if self.accounting else [])
        self.ports = dict(zip(listening, free_ports(len(listening)), strict=True))
        (self.directory / "etc" / "plugstack.conf").write_text("")  # not /etc/slurm's
        self._write_slurm_conf()
        self._write_manifest()

    def _daemon(self, name: str) -> Daemon:
        return next(daemon for daemon in self.daemons() if daemon.name == name)

    def _launch(self, daemon: Daemon, command: list[str], *, timeout_s: float) -> None:
        """Run a daemon that forks into the background; wait for its pid file to name it."""
        started = time.monotonic()
        output = self.directory / "log" / f"{daemon.name.replace(' ', '-')}.stdout"
        with output.open("ab") as sink:
            completed = subprocess.run(
                command, stdin=subprocess.DEVNULL, stdout=sink, stderr=sink, env=self.env, timeout=timeout_s
            )
        if completed.returncode != 0:
            raise ClusterError(f"{' '.join(command)} exited with {completed.returncode}: {output.read_text()[-2000:]}")
        wait_for(daemon.pid, timeout_s=timeout_s, what=f"{daemon.name} to write {daemon.pid_file}", interval_s=0.02)
        self.timings_s[daemon.name] = time.monotonic() - started

    def _start_munged(self) -> None:
        munge = self.directory / "munge"
        (munge / "key").mkdir(mode=0o700)
        (munge / "run").mkdir(mode=0o755)
        key = munge / "key" / "munge.key"
        subprocess.run([program("mungekey"), "--create", f"--keyfile={key}"], check=True, capture_output=True)
        key.chmod(0o400)
        daemon = self._daemon("munged")
        self._launch(
            daemon,
            [
                program("munged"),
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={daemon.pid_file}",
                f"--log-file={daemon.log_file}",
                f"--seed-file={munge / 'key' / 'munged.seed'}",
            ],
            timeout_s=10,
        )
        wait_for(self.munge_socket.exists, timeout_s=10, what=f"munged to create {self.munge_socket}", interval_s=0.02)

    def _start_mariadbd(self, timeout_s: float) -> None:
        started = time.monotonic()
        datadir = self.directory / "database"
        daemon = self._daemon("mariadbd")
        server_options = ["--innodb-log-file-size=4M", "--innodb-buffer-pool-size=32M", "--skip-name-resolve"]
        with (self.directory / "log" / "mariadb-install-db.log").open("wb") as sink:
            subprocess.run(
                [
                    program("mariadb-install-db"),
                    "--no-defaults",
                    f"--datadir={datadir}",
                    "--user=root",
                    "--auth-root-authentication-method=socket",
                    "--skip-test-db",
                    *server_options,
                ],
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=sink,
                check=True,
                timeout=timeout_s,
            )
        self.timings_s["mariadb-install-db"] = time.monotonic() - started
        # mariadbd stays in the foreground: its own session, so a Ctrl-C at the terminal does not reach it.
        with (self.directory / "log" / "mariadbd.stdout").open("ab") as sink:
            self._mariadbd = subprocess.Popen(
                [
                    program("mariadbd"),
                    "--no-defaults",
                    f"--datadir={datadir}",
                    f"--socket={self.database_socket}",
                    f"--port={self.ports['mariadbd']}",
                    "--bind-address=127.0.0.1",
                    f"--pid-file={daemon.pid_file}",
                    f"--log-error={daemon.log_file}",
                    "--user=root",
                    "--skip-log-bin",
                    *server_options,
                ],
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=sink,
                start_new_session=True,
            )

        def accepts_queries() -> bool:
            if self._mariadbd.poll() is not None:
                raise ClusterError(f"mariadbd exited with {self._mariadbd.returncode}")
            return self._database("SELECT 1", check=False).returncode == 0

        wait_for(accepts_queries, timeout_s=timeout_s, what="mariadbd to accept queries", interval_s=0.05)
        wait_for(daemon.pid, timeout_s=timeout_s, what=f"mariadbd to write {daemon.pid_file}", interval_s=0.02)
        self._database(
            f"CREATE USER '{DATABASE_USER}'@'127.0.0.1' IDENTIFIED BY '{DATABASE_PASSWORD}';"
            f" GRANT ALL ON {DATABASE_NAME}.* TO '{DATABASE_USER}'@'127.0.0.1';"
        )
        self.timings_s["mariadbd"] = time.monotonic() - started

    def _database(self, statement: str, *, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            [program("mariadb"), "--no-defaults", f"--socket={self.database_socket}", "--user=root", "-e", statement],
            capture_output=True,
            text=True,
            check=check,
            timeout=30,
        )

    def _start_slurmdbd(self, timeout_s: float) -> None:
        daemon = self._daemon("slurmdbd")
        conf = self.directory / "etc" / "slurmdbd.conf"
        conf.write_text(
            "\n".join(
                [
                    "AuthType=auth/munge",
                    f"AuthInfo=socket={self.munge_socket}",
                    f"DbdHost={self.hostname}",
                    f"DbdAddr={self.controller_address}",
                    f"DbdPort={self.ports['slurmdbd']}",
                    "SlurmUser=root",
                    *(["CommunicationParameters=NoInAddrAny"] if self.bind_host_address_only else []),
                    "DebugLevel=info",
                    f"LogFile={daemon.log_file}",
                    f"PidFile={daemon.pid_file}",
                    "StorageType=accounting_storage/mysql",
                    "StorageHost=127.0.0.1",
                    f"StoragePort={self.ports['mariadbd']}",
                    f"StorageUser={DATABASE_USER}",
                    f"StoragePass={DATABASE_PASSWORD}",
                    f"StorageLoc={DATABASE_NAME}",
                    "",
                ]
            )
        )
        conf.chmod(0o600)  # slurmdbd refuses a readable one
        started = time.monotonic()
        self._launch(daemon, [program("slurmdbd")], timeout_s=timeout_s)
        # slurmdbd creates its tables before it listens; slurmctld needs it listening.
        wait_for(
            lambda: self._port_open(self.controller_address, self.ports["slurmdbd"]),
            timeout_s=timeout_s,
            what="slurmdbd to listen",
            interval_s=0.05,
        )
        self.timings_s["slurmdbd"] = time.monotonic() - started

    def _start_slurmctld(self, timeout_s: float) -> None:
        (self.directory / "state").chmod(0o700)
        self._launch(
            self._daemon("slurmctld"), [program("slurmctld"), "-i", "-f", str(self.slurm_conf)], timeout_s=timeout_s
        )

    def _start_slurmds(self, timeout_s: float) -> None:
        for node in self.nodes:
            (self.directory / "spool" / node.name).mkdir(exist_ok=True)
            self._launch(
                self._daemon(f"slurmd {node.name}"),
                [program("slurmd"), "-f", str(self.slurm_conf), "-N", node.name],
                timeout_s=timeout_s,
            )

    def _wait_nodes_idle(self, timeout_s: float) -> None:
        names = [node.name for node in self.nodes]

        def idle() -> bool:
            for daemon in self.daemons():
                if daemon.pid() is None:
                    raise ClusterError(f"{daemon.name} is not running")
            states = self.node_states()
            return all(states.get(name) == "idle" for name in names)

        wait_for(idle, timeout_s=timeout_s, what=f"sinfo to show {', '.join(names)} idle", interval_s=0.1)

    @staticmethod
    def _port_open(address: str, port: int) -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.settimeout(0.5)
            return probe.connect_ex((address, port)) == 0

    def _stop_daemon(self, daemon: Daemon, *, timeout_s: float) -> str | None:
        """SIGTERM the daemon by its pid file's pid, wait; SIGKILL if it does not end (a loaded machine can keep
        munged past the wait). Returns an error only for a daemon that outlives the SIGKILL."""
        pid = daemon.pid()
        if pid is None:
            return None
        os.kill(pid, signal.SIGTERM)
        try:
            wait_for(lambda: not process_alive(pid), timeout_s=timeout_s, what=f"{daemon.name} (pid {pid}) to exit",
                     interval_s=0.05)
            return None
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
        try:
            wait_for(lambda: not process_alive(pid), timeout_s=5, what=f"{daemon.name} (pid {pid}) to die",
                     interval_s=0.05)
        except TimeoutError as error:
            return f"{daemon.name} (pid {pid}) ignored SIGTERM for {timeout_s:g} s and {error}"
        return None

    def _slurm_conf_text(self) -> str:
        lines = [
            f"ClusterName={CLUSTER_NAME}",
            f"SlurmctldHost={self.hostname}({self.controller_address})",
            f"SlurmctldPort={self.ports['slurmctld']}",
            f"SlurmdPort={self.ports['slurmd']}",
            "SlurmUser=root",
            "SlurmdUser=root",
            *(["CommunicationParameters=NoInAddrAny"] if self.bind_host_address_only else []),
            "MpiDefault=none",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            # A requeued job may start again only cred_expire + 1 s after the requeue (default 120).
            f"AuthInfo=socket={self.munge_socket},cred_expire={self.cred_expire_s}",
            f"StateSaveLocation={self.directory / 'state'}",
            f"SlurmdSpoolDir={self.directory / 'spool' / '%n'}",
            f"SlurmctldPidFile={self._daemon('slurmctld').pid_file}",
            f"SlurmdPidFile={self.directory / 'run' / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={self._daemon('slurmctld').log_file}",
            f"SlurmdLogFile={self.directory / 'log' / 'slurmd-%n.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            f"PlugStackConfig={self.directory / 'etc' / 'plugstack.conf'}",
            # No cgroups on these machines.
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            "DefMemPerCPU=1024",
            f"MailProg={shutil.which('true') or '/bin/true'}",
            "ReturnToService=2",
            "JobRequeue=1",
            # Short timers: a COMPLETING job blocks its node for up to KillWait; the scheduler runs often.
            f"KillWait={self.kill_wait_s}",
            "SchedulerParameters=bf_interval=1,sched_interval=2",
            "MinJobAge=60",
            "PreemptType=preempt/partition_prio",
            "PreemptMode=REQUEUE",
        ]
        if self.user_signal:
            lines.append("SlurmctldParameters=preempt_send_user_signal")
        if self.max_array_size is not None:
            lines.append(f"MaxArraySize={self.max_array_size}")
        if self.node_cpus is not None:
            lines.append("SlurmdParameters=config_overrides")  # slurmd takes the configured CPUs, not the machine's
        if self.accounting:
            lines += [
                "AccountingStorageType=accounting_storage/slurmdbd",
                f"AccountingStorageHost={self.controller_address}",
                f"AccountingStoragePort={self.ports['slurmdbd']}",
                # 22.05's slurmdbd connection ignores AuthInfo: name the private munge socket here too.
                f"AccountingStoragePass={self.munge_socket}",
            ]
        lines += self._node_lines()
        node_names = ",".join(node.name for node in self.nodes)
        lines += [
            f"PartitionName=low Nodes={node_names} Default=YES MaxTime=INFINITE State=UP PriorityTier=1 "
            f"PreemptMode=REQUEUE GraceTime={self.grace_time_s}",
            f"PartitionName=high Nodes={node_names} MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF",
            # Up to 4 jobs share each CPU: many tiny jobs run at once (a throttle, not the CPUs, limits them).
            f"PartitionName=shared Nodes={node_names} MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE "
            f"GraceTime={self.grace_time_s} OverSubscribe=FORCE:4",
        ]
        return "\n".join(lines) + "\n"

    def _node_lines(self) -> list[str]:
        hardware = self._hardware()
        return [f"NodeName={node.name} NodeAddr={node.address} {hardware} State=UNKNOWN" for node in self.nodes]

    def _hardware(self) -> str:
        """The node's CPUs and memory from ``slurmd -C``, with a little less memory than reported."""
        reported = dict(
            field.split("=", 1)
            for field in subprocess.run(
                [program("slurmd"), "-C"], capture_output=True, text=True, check=True
            ).stdout.split()
            if "=" in field
        )
        memory_mb = int(reported["RealMemory"])
        if self.node_cpus is not None:
            reported |= {"CPUs": str(self.node_cpus), "Boards": "1", "SocketsPerBoard": "1",
                         "CoresPerSocket": str(self.node_cpus), "ThreadsPerCore": "1"}
        fields = ["CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore"]
        return (
            " ".join(f"{name}={reported[name]}" for name in fields)
            + f" RealMemory={memory_mb - max(256, memory_mb // 20)}"
        )

    def _write_slurm_conf(self) -> None:
        text = self._slurm_conf_text()
        temporary = self.slurm_conf.with_suffix(".tmp")
        temporary.write_text(text)
        temporary.replace(self.slurm_conf)

    def _write_manifest(self) -> None:
        manifest = {
            "kind": type(self).__name__,
            "created": self.created,
            "created_directory": self.created_directory,
            "ports": self.ports,
            "options": {
                "user_signal": self.user_signal,
                "accounting": self.accounting,
                "grace_time_s": self.grace_time_s,
                "kill_wait_s": self.kill_wait_s,
                "cred_expire_s": self.cred_expire_s,
                "node_cpus": self.node_cpus,
                "max_array_size": self.max_array_size,
            },
            **self._manifest_extra(),
        }
        (self.directory / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")

    def _manifest_extra(self) -> dict:
        """More of the cluster's state for its manifest (subclasses)."""
        return {}

    def _restore(self, manifest: dict) -> None:
        """Take back what ``_manifest_extra`` wrote (subclasses)."""

    @classmethod
    def attach(cls, directory: Path) -> SlurmCluster:
        """The cluster described by ``directory``'s manifest (to stop or inspect one started elsewhere)."""
        directory = Path(directory).resolve()
        try:
            manifest = json.loads((directory / MANIFEST).read_text())
        except FileNotFoundError:
            raise ClusterError(
                f"no cluster in {directory} (no {MANIFEST}); start one with: start --dir {directory}"
            ) from None
        cluster = cls(directory, **manifest["options"])
        cluster.created = manifest["created"]
        cluster.created_directory = manifest["created_directory"]
        cluster.ports = manifest["ports"]
        if manifest["kind"] != cls.__name__:
            raise ClusterError(f"{directory} holds a {manifest['kind']}, not a {cls.__name__}")
        cluster._restore(manifest)
        return cluster


def main(
    argv: list[str] | None = None,
    *,
    cluster_class: type[SlurmCluster] = SlurmCluster,
    default_directory: Path = DEFAULT_DIRECTORY,
    description: str = __doc__.split("\n\n")[0],
) -> int:
    """``start|stop|status [--dir D]`` for ``cluster_class``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("action", choices=["start", "stop", "status"])
    parser.add_argument(
        "--dir", type=Path, default=default_directory, help=f"the cluster's folder (default {default_directory})"
    )
    parser.add_argument(
        "--no-user-signal", action="store_true", help="start: preemption sends SIGTERM, not the job's --signal"
    )
    parser.add_argument("--no-accounting", action="store_true", help="start: no slurmdbd/MariaDB (sacct will not work)")
    parser.add_argument("--keep-files", action="store_true", help="stop: keep the folder's logs and state")
    arguments = parser.parse_args(argv)
    try:
        if arguments.action == "start":
            cluster = cluster_class(
                arguments.dir, user_signal=not arguments.no_user_signal, accounting=not arguments.no_accounting
            ).start()
            timings = ", ".join(
                f"{name} {seconds:.1f}" for name, seconds in cluster.timings_s.items() if name != "start"
            )
            print(
                f"started in {cluster.timings_s['start']:.1f} s ({timings}); logs in {cluster.directory / 'log'}",
                file=sys.stderr,
            )
            print(f"export SLURM_CONF={cluster.slurm_conf}")
        elif arguments.action == "stop":
            cluster = cluster_class.attach(arguments.dir)
            cluster.stop(remove=not arguments.keep_files)
            print(f"stopped in {cluster.timings_s['stop']:.1f} s", file=sys.stderr)
        else:
            print(cluster_class.attach(arguments.dir).status())
    except ClusterError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
