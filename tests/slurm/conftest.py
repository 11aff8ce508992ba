"""Fixtures for tests against real, private SLURM clusters (``cluster.py``, ``two_hosts.py``).

Without the SLURM, munge and MariaDB binaries these tests skip, saying how to install them; with
``ELFES_REQUIRE_SLURM=1`` (as in CI) they fail instead. Each cluster serves the whole session; each test
gets it with an empty queue, and a failing test's report carries what the daemons logged during it.

- ``slurm_available`` (session): only the skip/fail rule, for tests that start daemons themselves.
- ``slurm_cluster`` (session): the single-node cluster, in whatever preemption configuration it has
  (``MaxArraySize=10``; partitions ``low``, ``high`` and ``shared``, where 4 jobs share a CPU).
- ``slurm``: the single-node cluster for one test; its jobs are cancelled at the end.
- ``slurm_user_signal`` / ``slurm_plain_sigterm``: the same with ``preempt_send_user_signal`` on / off.
- ``slurm_env``: ``SLURM_CONF`` set in ``os.environ`` for the test (for in-process submitit).
- ``slurm_two_hosts_cluster`` (session) / ``slurm_two_hosts``: the cluster of two hosts (``node1``,
  ``node2``, each in its own network namespace), user signal on; the same skip/fail rule, also when this
  machine does not allow network namespaces (the reason quotes the error).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cluster import INSTALL_COMMAND, SlurmCluster, missing_programs
from shared_runs import QUICKSTART
from slurm_runs import CONFIG
from two_hosts import NamespacesUnavailable, TwoHostCluster, missing_network_programs

REQUIRE_SLURM = os.environ.get("ELFES_REQUIRE_SLURM") == "1"
# The single-node cluster's MaxArraySize: low, so that a sweep of a few tiny members spans several arrays.
MAX_ARRAY_SIZE = 10
LOG_MARKS = pytest.StashKey[dict]()  # on a test item: {cluster: log sizes when the test began}
CLUSTER_TIMINGS = pytest.StashKey[dict]()  # on the config: {"single node": timings_s, ...}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test in this folder carries the ``slurm`` marker (``-m "not slurm"`` deselects them)."""
    here = Path(__file__).parent
    for item in items:
        if item.path.is_relative_to(here):
            item.add_marker(pytest.mark.slurm)


def unavailable_reason() -> str | None:
    """Why a private SLURM cluster cannot run here, with what to do about it; None if it can."""
    missing = missing_programs()
    if missing:
        return (
            f"the SLURM tests need SLURM, munge and MariaDB (not installed: {', '.join(missing)}); "
            f"install them (Debian/Ubuntu, as root): apt-get update && {INSTALL_COMMAND}"
        )
    if os.geteuid() != 0:
        return "the SLURM tests start slurmctld and slurmd as root; run them as root (in a container or a VM)"
    return None


def skip_or_fail(reason: str) -> None:
    """Skip with ``reason``; fail instead when ``ELFES_REQUIRE_SLURM=1``."""
    if REQUIRE_SLURM:
        pytest.fail(f"ELFES_REQUIRE_SLURM=1, but {reason}", pytrace=False)
    pytest.skip(f"{reason} (set ELFES_REQUIRE_SLURM=1 to make this a failure)")


@pytest.fixture(scope="session")
def slurm_available() -> None:
    """Skip (or fail, with ``ELFES_REQUIRE_SLURM=1``) where a private cluster cannot run."""
    reason = unavailable_reason()
    if reason:
        skip_or_fail(reason)


def _session_cluster(cluster: SlurmCluster, name: str, request: pytest.FixtureRequest) -> Iterator[SlurmCluster]:
    """Start ``cluster``, yield it, stop it by pid; its folder is removed unless a test failed."""
    request.config.stash.setdefault(CLUSTER_TIMINGS, {})[name] = cluster.timings_s  # filled by start and stop
    cluster.start()  # on failure it stops what it started and raises with the daemon logs
    try:
        yield cluster
    finally:
        keep = request.session.testsfailed > 0
        cluster.stop(remove=not keep)
        if keep:
            print(f"\nthe {name} SLURM cluster's logs and state are kept in {cluster.directory}")


def _test_cluster(cluster: SlurmCluster, request: pytest.FixtureRequest) -> Iterator[SlurmCluster]:
    """``cluster`` for one test: an empty queue before and after; its daemon logs attached on failure."""
    cluster.cancel_all_jobs()
    request.node.stash.setdefault(LOG_MARKS, {})[cluster] = cluster.log_sizes()
    yield cluster
    cluster.cancel_all_jobs()


@pytest.fixture(scope="session")
def slurm_cluster(slurm_available: None, request: pytest.FixtureRequest) -> Iterator[SlurmCluster]:
    """The private single-node cluster (a new folder in the temporary folder), for the session."""
    yield from _session_cluster(SlurmCluster(max_array_size=MAX_ARRAY_SIZE), "single-node", request)


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster, request: pytest.FixtureRequest) -> Iterator[SlurmCluster]:
    """The single-node cluster for one test (empty queue before and after, logs attached on failure)."""
    yield from _test_cluster(slurm_cluster, request)


@pytest.fixture
def slurm_user_signal(slurm: SlurmCluster) -> SlurmCluster:
    """The cluster with ``preempt_send_user_signal``: a preempted job gets its ``--signal`` (USR2)."""
    if not slurm.user_signal:
        slurm.reconfigure(user_signal=True)
    return slurm


@pytest.fixture
def slurm_plain_sigterm(slurm: SlurmCluster) -> SlurmCluster:
    """The cluster without ``preempt_send_user_signal``: a preempted job gets SIGTERM."""
    if slurm.user_signal:
        slurm.reconfigure(user_signal=False)
    return slurm


@pytest.fixture
def slurm_env(slurm: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> SlurmCluster:
    """``SLURM_CONF`` in this process's environment for the test, for code that calls SLURM itself."""
    monkeypatch.setenv("SLURM_CONF", str(slurm.slurm_conf))
    return slurm


@pytest.fixture(scope="session")
def slurm_two_hosts_cluster(slurm_available: None, request: pytest.FixtureRequest) -> Iterator[TwoHostCluster]:
    """The private cluster of two hosts (``node1``, ``node2``), for the session."""
    missing = missing_network_programs()
    if missing:
        skip_or_fail(f"the two-host SLURM tests need {', '.join(missing)} (apt-get install iproute2 util-linux)")
    cluster = TwoHostCluster()
    try:
        yield from _session_cluster(cluster, "two-host", request)
    except NamespacesUnavailable as error:  # raised by start, which stopped what it had started
        cluster.remove()
        skip_or_fail(str(error))


@pytest.fixture
def slurm_two_hosts(
    slurm_two_hosts_cluster: TwoHostCluster, request: pytest.FixtureRequest
) -> Iterator[TwoHostCluster]:
    """The two-host cluster for one test (empty queue before and after, logs attached on failure)."""
    yield from _test_cluster(slurm_two_hosts_cluster, request)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Attach what the daemons logged during a failed test to its report."""
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for cluster, marks in item.stash.get(LOG_MARKS, {}).items():
            title = f"SLURM daemon logs during this test ({cluster.directory.name})"
            report.sections.append((title, cluster.log_tails(since=marks)))


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    """One line per private cluster with its start and stop times (the suite's budget depends on them)."""
    for name, timings in config.stash.get(CLUSTER_TIMINGS, {}).items():
        if "start" not in timings:
            continue
        steps = ", ".join(f"{step} {seconds:.1f}" for step, seconds in timings.items() if step not in ("start", "stop"))
        stop = f", stopped in {timings['stop']:.1f} s" if "stop" in timings else ""
        terminalreporter.write_line(f"{name} SLURM cluster: started in {timings['start']:.1f} s ({steps}){stop}")


@pytest.fixture(scope="session")
def reference(straight_runs: Callable[..., Path]) -> Callable[[int], Path]:
    """``reference(tasks)``: the run directory of the job run uninterrupted on ``tasks`` ranks (the local executor,
    unslowed; tests/conftest.py's ``straight_runs``, the same run as the launcher tests' ``references(tasks)``:
    call it early, it trains while the SLURM job waits). The SLURM jobs' entrypoint (``slurm_jobs.py``) is the
    same quickstart, slowed in its first attempt only: a sleep changes no number."""
    return lambda tasks: straight_runs(entrypoint=QUICKSTART, tasks=tasks, config=CONFIG)
