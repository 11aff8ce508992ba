"""Bad nodes left behind, without jobs: which host a failure blames (launcher/job/failures.py), how
state.json records, lifts and clears exclusions, what `elfes status` says of them, when a requeue that
leaves nodes out cannot be placed (launcher/submit/placement.py), and the `--exclude` of a resubmission.
The jobs themselves, on two SLURM hosts: tests/slurm/test_two_hosts.py."""

from __future__ import annotations

import dataclasses
import io
import json
import time
from pathlib import Path

from rich.console import Console

from elfes.launcher.cli.status import print_status
from elfes.launcher.commands.status import run_status
from elfes.launcher.job.failures import (
    FailureReport,
    await_first_hand,
    cause_of,
    decide_failure,
    failed_nodes,
    rank_hosts,
    repeats,
    write_report,
)
from elfes.launcher.rundir import state as run_state
from elfes.launcher.rundir.paths import RunPaths, SweepPaths
from elfes.launcher.spec import load_spec, validate_spec_data
from elfes.launcher.submit.arrays import array_sbatch_script
from elfes.launcher.submit.placement import placement_problem
from elfes.launcher.submit.scripts import sbatch_script

TWO_HOSTS = ("node1", "node2")
LOST = RuntimeError("[pair.cc:553] Connection closed by peer [198.51.100.3]:1234")


BOOM = RuntimeError("boom")


def report(rank: int, host: str, *, error: BaseException = BOOM, at: float = 100.0,
           category: str | None = None, peer_lost: bool | None = None) -> FailureReport:
    made = FailureReport.of_exception(error, rank=rank, host=host, at=at, step=7, updated=True)
    changes = {key: value for key, value in (("category", category), ("peer_lost", peer_lost)) if value is not None}
    return dataclasses.replace(made, **changes)


# -- which node a failure blames --------------------------------------------------------------------------------
def test_an_error_blames_its_host_a_lost_rank_the_silent_ranks_host_and_one_host_itself() -> None:
    ranks = {0: "node1", 1: "node1", 2: "node2", 3: "node2"}
    raised = [report(2, "node2"), report(0, "node1", error=LOST, at=101.0)]
    assert failed_nodes(cause_of(raised), raised, hosts=TWO_HOSTS, ranks=ranks) == ("node2",)
    lost = [report(rank, "node1" if rank < 2 else "node2", error=LOST) for rank in (0, 1, 2)]  # rank 3 died silently
    assert failed_nodes(cause_of(lost), lost, hosts=TWO_HOSTS, ranks=ranks) == ("node2",)
    on_one_host = [report(0, "node1", error=LOST)]
    assert failed_nodes(cause_of(on_one_host), on_one_host, hosts=("node1",), ranks={0: "node1"}) == ("node1",)


def test_a_hang_on_two_hosts_blames_no_node_when_every_rank_reported() -> None:
    hung = [report(0, "node1", category="hang", peer_lost=False), report(1, "node2", category="hang", peer_lost=True)]
    assert failed_nodes(cause_of(hung), hung, hosts=TWO_HOSTS, ranks={0: "node1", 1: "node2"}) == ()
    one_silent = hung[:1]  # rank 1 never reported: its process is gone or holds the GIL
    assert failed_nodes(cause_of(one_silent), one_silent, hosts=TWO_HOSTS, ranks={0: "node1", 1: "node2"}) == ("node2",)


def test_each_ranks_host_comes_from_its_pid_record_of_that_attempt(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    paths.pids.mkdir()
    for rank, host, attempt in ((0, "node1", 2), (1, "node2", 2), (2, "node3", 1)):
        paths.pid_file(rank).write_text(json.dumps({"pid": 1, "host": host, "attempt": attempt, "rank": rank}))
    (paths.pids / "rank-3.json").write_text("{torn")
    assert rank_hosts(paths, 2) == {0: "node1", 1: "node2"}


def test_a_rank_that_saw_its_peer_vanish_waits_for_the_others_only_while_none_reported_a_cause(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    write_report(paths, 1, report(0, "node1", error=LOST))
    began = time.monotonic()
    assert [r.rank for r in await_first_hand(paths, 1, world_size=2, grace_s=0.6)] == [0]
    assert time.monotonic() - began >= 0.6  # rank 1 stayed silent: the whole grace
    write_report(paths, 1, report(1, "node2"))
    began = time.monotonic()
    assert len(await_first_hand(paths, 1, world_size=3, grace_s=30)) == 2
    assert time.monotonic() - began < 5  # a first-hand cause is in: no wait


# -- state.json -----------------------------------------------------------------------------------------------
def _failed_run(failure: run_state.Failure) -> run_state.RunState:
    state = run_state.record_submission(None, executor="slurm", kind="submit", max_requeues=5, job_id="7",
                                        run_dir="runs/failed")
    state = run_state.begin_attempt(state, token="7:0/1", job_id="7", launch="submit", hosts=("node1",), world_size=2)
    return run_state.end_attempt(state, token="7:0/1", outcome="failed", error="boom", failure=failure)


def test_exclusions_are_recorded_once_round_trip_and_are_lifted_or_cleared() -> None:
    failure = dataclasses.replace(decide_failure(report(1, "node1"), previous=None, failures_used=0, max_failures=3),
                                  nodes=("node1",))
    state = run_state.exclude_nodes(_failed_run(failure), hosts=("node1",), attempt=1, cause=failure.cause)
    assert run_state.exclude_nodes(state, hosts=("node1",), attempt=2, cause="again") is state  # kept once
    state = run_state.exclude_nodes(state, hosts=("node2", "node1"), attempt=2, cause="hang")
    assert state.excluded_hosts == TWO_HOSTS and [node.attempt for node in state.excluded_nodes] == [1, 2]
    assert run_state.RunState.from_json(json.loads(json.dumps(state.to_json()))) == state
    assert run_state.lift_exclusions(state, attempt=1).excluded_hosts == ("node2",)
    cleared = run_state.include_nodes(state)
    assert cleared.excluded_nodes == () and run_state.include_nodes(cleared) is cleared


def test_a_failure_that_repeats_the_previous_one_is_the_jobs_not_the_nodes() -> None:
    first = dataclasses.replace(decide_failure(report(1, "node1"), previous=None, failures_used=0, max_failures=3),
                                nodes=("node1",))
    previous = _failed_run(first).attempts[0]
    again = decide_failure(report(1, "node2"), previous=previous, failures_used=1, max_failures=3)
    assert repeats(again, previous) and not again.retried  # the runtime then lifts attempt 1's exclusion


def test_status_lists_the_excluded_nodes_and_why(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "run")
    paths.run_dir.mkdir()
    failure = decide_failure(report(1, "node1"), previous=None, failures_used=0, max_failures=3)
    failed = dataclasses.replace(failure, retried=False, reason="the requeued job cannot be placed")
    run_state.save_state(paths, run_state.exclude_nodes(_failed_run(failed), hosts=("node1",), attempt=1,
                                                        cause=failure.cause))
    result = run_status(paths.run_dir)
    assert [(node["host"], node["attempt"], node["cause"]) for node in result.excluded_nodes] == [
        ("node1", 1, "RuntimeError: boom")]
    console = Console(file=io.StringIO(), width=400)
    print_status(console, [result])
    assert ("node node1 excluded after attempt 1 failed there (RuntimeError: boom); `elfes resume --include-nodes` "
            "allows it again") in console.file.getvalue()


# -- placement and resubmission ---------------------------------------------------------------------------------
def test_a_requeue_the_exclusions_leave_no_room_for_says_so() -> None:
    two_of_two = placement_problem(needed=2, partition="low", nodes=TWO_HOSTS, excluded=("node2",))
    assert two_of_two.startswith("the requeued job cannot be placed without node2: partition low has 2 nodes "
                                 "(node1, node2) and the job needs 2 (resources.nodes), so no node is left out")
    assert placement_problem(needed=1, partition=None, nodes=TWO_HOSTS, excluded=TWO_HOSTS).startswith(
        "the requeued job cannot be placed without node1, node2: the cluster has 2 nodes")
    assert placement_problem(needed=1, partition="low", nodes=TWO_HOSTS, excluded=("node2",)) is None


def test_a_resubmission_leaves_the_excluded_nodes_out(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("def main(job):\n    pass\n")
    spec = validate_spec_data({"name": "nodes", "entrypoint": "train:main", "workdir": str(tmp_path),
                               "run_dir": str(tmp_path / "run")}, source="spec", base=tmp_path)
    assert spec.requeue.exclude_failed_nodes is True  # the default
    script = sbatch_script(spec, RunPaths(spec.run_dir), exclude=TWO_HOSTS)
    assert "#SBATCH --exclude=node1,node2\n" in script
    assert "--exclude" not in sbatch_script(spec, RunPaths(spec.run_dir))


def _deciding_rank(executor: str, previous: run_state.Attempt | None, *, exclude: bool = True):
    """What the deciding rank of attempt 2 (launcher/job/failed_attempt.py) turns a decided failure into:
    ``(state, failure, final=...)`` -> state with the exclusions."""
    import functools
    from types import SimpleNamespace

    from elfes.launcher.job.failed_attempt import excludes_nodes, with_exclusions

    spec = SimpleNamespace(requeue=SimpleNamespace(exclude_failed_nodes=exclude))  # only the field it reads
    return functools.partial(with_exclusions, attempt=2, previous=previous, excluding=excludes_nodes(executor, spec))


def test_the_deciding_rank_excludes_the_failures_nodes_and_lifts_them_when_the_failure_repeats() -> None:
    first = dataclasses.replace(decide_failure(report(1, "node1"), previous=None, failures_used=0, max_failures=3),
                                nodes=("node1",))
    state = run_state.exclude_nodes(_failed_run(first), hosts=("node1",), attempt=1, cause=first.cause)
    previous = state.attempts[0]
    other = dataclasses.replace(decide_failure(report(1, "node2", error=ValueError("bad batch")), previous=previous,
                                               failures_used=1, max_failures=3), nodes=("node2",))
    assert _deciding_rank("slurm", previous)(state, other, final=False).excluded_hosts == TWO_HOSTS
    assert _deciding_rank("slurm", previous)(state, other, final=True) is state  # e.g. a refused `last`
    assert _deciding_rank("slurm", previous, exclude=False)(state, other, final=False) is state
    assert _deciding_rank("local", previous)(state, other, final=False) is state
    again = dataclasses.replace(decide_failure(report(1, "node2"), previous=previous, failures_used=1, max_failures=3),
                                nodes=("node2",))
    assert _deciding_rank("slurm", previous)(state, again, final=False).excluded_nodes == ()


def _sweep_of_failed_members(tmp_path: Path, excluded: dict[str, tuple[str, ...]]):
    """A SLURM sweep whose members (name -> nodes their failures excluded) all ended failed."""
    from elfes.launcher.rundir.sweep_record import MemberRecord, SweepRecord, save_sweep

    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "train.py").write_text("def main(job):\n    pass\n")
    sweep = SweepPaths(tmp_path / "sweep")
    members = []
    for index, (name, hosts) in enumerate(excluded.items()):
        spec = validate_spec_data({"name": "sweep", "entrypoint": "train:main", "workdir": str(tmp_path),
                                   "run_dir": str(sweep.sweep_dir / name), "slurm": {"partition": "low"}},
                                  source="spec", base=tmp_path)
        paths = RunPaths(spec.run_dir)
        paths.run_dir.mkdir(parents=True)
        paths.spec.write_text(spec.to_yaml())
        failure = decide_failure(report(0, "node1"), previous=None, failures_used=3, max_failures=3)
        state = _failed_run(failure)
        run_state.save_state(paths, run_state.exclude_nodes(state, hosts=hosts, attempt=1, cause="boom") if hosts
                             else state)
        members.append(MemberRecord(index, name, str(paths.run_dir), {}))
    record = SweepRecord(name="sweep", executor="slurm", max_parallel=2, members=tuple(members))
    save_sweep(sweep, record)
    return sweep, record


def _handed_over(monkeypatch, sweep, record, *, nodes, include_nodes=False):
    """``elfes resume SWEEP_DIR``'s hand-over of every member, up to sbatch: what each array would leave out
    (sbatch and sinfo answer from here)."""
    from elfes.launcher.commands.sweep import slurm as sweep_slurm

    submitted = []

    def sbatch(spec, tasks, paths, max_parallel, after=(), exclude=()):
        submitted.append(exclude)
        return [f"77_{k}" for k in range(len(tasks))]

    monkeypatch.setattr(sweep_slurm.arrays, "submit_array", sbatch)
    monkeypatch.setattr(sweep_slurm, "partition_nodes", lambda partition: nodes if partition == "low" else None)
    result = sweep_slurm.submit_array(sweep, record, list(record.members), kind="resume", include_nodes=include_nodes)
    return submitted, result


def test_a_resumed_sweep_array_leaves_out_the_nodes_its_members_failures_excluded(tmp_path: Path, monkeypatch) -> None:
    sweep, record = _sweep_of_failed_members(tmp_path, {"a": ("node1",), "b": ("node3", "node1"), "c": ()})
    submitted, result = _handed_over(monkeypatch, sweep, record, nodes=("node1", "node2", "node3"))
    assert submitted == [("node1", "node3")] and result.notes == ()
    script = array_sbatch_script(load_spec(RunPaths(sweep.sweep_dir / "a").spec), sweep.submitit, 3, 2,
                                 exclude=("node1", "node3"))
    assert "#SBATCH --exclude=node1,node3\n" in script and "#SBATCH --array=0-2%2\n" in script
    # `elfes resume SWEEP_DIR --include-nodes` allows them again first
    sweep, record = _sweep_of_failed_members(tmp_path / "again", {"a": ("node1",), "b": ("node3", "node1")})
    submitted, _ = _handed_over(monkeypatch, sweep, record, nodes=("node1", "node2", "node3"), include_nodes=True)
    assert submitted == [()] and run_state.load_state(RunPaths(sweep.sweep_dir / "b")).excluded_nodes == ()


def test_a_sweep_array_that_cannot_be_placed_without_its_excluded_nodes_leaves_none_out(tmp_path: Path,
                                                                                       monkeypatch) -> None:
    sweep, record = _sweep_of_failed_members(tmp_path, {"a": ("node1",), "b": ("node2",)})
    submitted, result = _handed_over(monkeypatch, sweep, record, nodes=("node1", "node2"))
    assert submitted == [()]
    (note,) = result.notes
    assert note.startswith("the job array of a, b cannot be placed without node1, node2: partition low has 2 nodes")
    assert all(run_state.load_state(RunPaths(sweep.sweep_dir / name)).excluded_nodes == () for name in "ab")
