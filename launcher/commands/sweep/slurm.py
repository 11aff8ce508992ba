"""A sweep on SLURM: job arrays, task k of an array running its member k (submitit's batch submission).
Torch-free.

Members that share their sbatch options form one array (``--array=0-<n-1>%<max_parallel>``), cut into
several where they are more than the cluster's ``MaxArraySize`` (read from ``scontrol show config``
before anything is created). SLURM's ``%N`` throttles one array only, so the arrays are chained: each is
submitted with ``--dependency=afterany:<the one before>`` (the first after the sweep's arrays that are still
queued or running, e.g. when ``elfes resume SWEEP_DIR`` adds members), and together they never run more
than ``max_parallel`` members at once. Dependencies rather than a process that hands over the next array
as the previous drains: nothing has to stay alive on a login node (where long processes are killed), and
SLURM keeps the order even if the submitter dies; the cost is that an array's last tasks run without the
next array filling the free slots.

Each member's job id is ``<array job>_<task>`` (what submitit's ``JobEnvironment`` reports in the task):
``scontrol requeue`` of it requeues that member alone, ``squeue``/``scancel`` address it alone, and each
member counts its own requeues in its own ``state.json``. The hand-over is one transaction per array, the
steps of a single run's (launcher/submit/transaction.py's ``hand_over``): every member's submission is
recorded ahead ("submitted"), the room to record each job is reserved (a full disk refuses here), then sbatch
is asked once, then every member gets its job id; when anything before sbatch's answer fails, every member of
that array is restored as it was (the arrays queued before it stay, and the members left out are recorded as
the sweep's problems).

An array leaves out (``--exclude``) every node its members' failures excluded (``requeue.exclude_failed_nodes``,
each member's ``state.json``), as a single run's resubmission does: a node bad for one member is bad for its
array. Where that would leave the partition too few nodes (``sinfo``), nothing is left out, the members'
exclusions are cleared and the hand-over says so (launcher/submit/placement.py), as a single run's requeue does.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

from ...backends import Executor
from ...job.runtime import JobRuntime
from ...rundir import state as run_state
from ...rundir.code_record import job_spec
from ...rundir.lookup import UsageError
from ...rundir.paths import RunPaths, SweepPaths
from ...rundir.state import Launch
from ...rundir.sweep_record import MemberRecord, SweepJob, SweepRecord, change_sweep
from ...slurm import SlurmError, partition_nodes, user_jobs
from ...spec import JobSpec
from ...spec.sweep import SweepPlan
from ...submit import arrays, executors, scripts
from ...submit.handover import signals_deferred
from ...submit.placement import placement_problem
from ...submit.transaction import Ahead, HandOver, excluded_nodes, hand_over, held


def _options_key(spec: JobSpec) -> str:
    return json.dumps(scripts.slurm_parameters(spec), sort_keys=True, default=str)


def _groups(specs: Sequence[tuple[str, JobSpec]], limit: int | None = None) -> list[list[tuple[str, JobSpec]]]:
    """Members sharing their sbatch options, in order of first appearance, cut into arrays of at most
    ``limit`` tasks (the cluster's ``MaxArraySize``; None: no cut): one array each."""
    groups: dict[str, list[tuple[str, JobSpec]]] = {}
    for name, spec in specs:
        groups.setdefault(_options_key(spec), []).append((name, spec))
    size = max(1, limit) if limit is not None else None
    return [group[start:start + size] if size else group for group in groups.values()
            for start in (range(0, len(group), size) if size else (0,))]


def array_line(count: int, max_parallel: int) -> str:
    return f"#SBATCH --array=0-{count - 1}%{min(count, max_parallel)}"


def _with_header(script: str, header: list[str]) -> str:
    shebang, _, rest = script.partition("\n")  # the comments go below the shebang: the script stays runnable
    return "\n".join([shebang, *header, rest])


def array_scripts(plan: SweepPlan, limit: int | None = None) -> str:
    """``submit --dry-run`` of a sweep on SLURM: each array's sbatch script, its tasks named (arrays after the
    first start once the one before has ended: ``--dependency=afterany:<it>``)."""
    folder = SweepPaths(plan.sweep_dir).submitit
    by_name = {member.name: member for member in plan.members}
    groups = _groups([(member.name, member.spec) for member in plan.members], limit)
    parts = []
    for number, group in enumerate(groups, start=1):
        header = [f"# job array {number} of {len(groups)} of sweep {plan.base.name}: {len(group)} member(s), at most "
                  f"{plan.max_parallel} at once; task k runs member k:"]
        header += [f"#   task {k}: {by_name[name].spec.run_dir}" for k, (name, _) in enumerate(group)]
        if number > 1:
            header.append(f"# submitted with --dependency=afterany:<job array {number - 1}>: it starts once that one "
                          f"has ended, so that at most {plan.max_parallel} members run at once across the arrays")
        if len(group) == 1:
            header.append("# (one member: submitted as a plain job, not an array)")
            parts.append(_with_header(scripts.sbatch_script(group[0][1], RunPaths(folder.parent)), header))
        else:
            parts.append(_with_header(arrays.array_sbatch_script(group[0][1], folder, len(group),
                                                                    plan.max_parallel), header))
    return "\n".join(parts)


@dataclass(frozen=True)
class ArraysSubmitted:
    array_ids: list[str]  # the job arrays submitted now
    left: dict[str, str]  # member -> why it was not handed over (it has a job, or one may still be starting)
    refused: dict[str, str] = field(default_factory=dict)  # member -> why not: sbatch refused its array (or an earlier one)
    error: str | None = None  # sbatch's refusal of an array after others were queued
    interrupted: int | None = None  # a stop signal (Ctrl-C) that arrived during the hand-over, held until it was done
    notes: tuple[str, ...] = ()  # e.g. an array that could not leave its members' excluded nodes out


def _settle(member: HandOver) -> str | None:
    """Under the member's submission lock: why it is left out of this hand-over (a job an interrupted
    hand-over started, now adopted; or one that may still be starting), or None when it is due. A job that
    is gone without an outcome is recorded lost first, as a single run's submission does."""
    try:
        adopted = member.settle(())
    except (run_state.RunDamaged, run_state.NotNow) as error:
        return str(error)
    state = member.state
    if adopted and state is not None:
        return f"adopted SLURM job {state.job_id}, which an interrupted hand-over had started"
    if state is not None and state.status not in run_state.ENDED:
        return f"{state.status} (job {state.job_id})"  # handed over meanwhile, e.g. by `elfes resume` of the member
    return None


def _recorded(member: HandOver) -> JobSpec:
    """The member's recorded spec (``job.yaml``), as its hand-over read it under its locks."""
    if member.recorded is None:
        raise UsageError(f"{member.paths.spec} is missing: the sweep member has no recorded spec; remove the member's "
                         "folder and submit the sweep again")
    return member.recorded


def _restore(members: Sequence[HandOver]) -> None:
    """The members' run directories as they were, except those whose job the executor already took."""
    for member in members:
        if not member.taken:
            member.restore()


def array_exclusions(members: Sequence[tuple[HandOver, JobSpec]]) -> tuple[str, ...]:
    """The nodes an array of ``members`` (hand-over, spec) leaves out (``--exclude``): those each member that
    excludes the nodes of its failures (``requeue.exclude_failed_nodes``) recorded in its ``state.json``."""
    hosts: dict[str, None] = {}
    for member, spec in members:
        hosts.update(dict.fromkeys(excluded_nodes(spec, member.state, Executor.SLURM)))
    return tuple(hosts)


def _placeable(members: Sequence[tuple[HandOver, JobSpec]], excluded: tuple[str, ...],
               nodes: Sequence[str] | None) -> tuple[tuple[str, ...], str | None]:
    """``excluded``, and None; or, where leaving them out would leave the partition (``nodes``, sinfo's; None:
    unknown) too few nodes for the array, nothing and why: the members' exclusions are cleared, as a single run's
    requeue clears them, so that the array is not refused (sbatch: "Requested node configuration is not
    available"). Under the members' submission locks."""
    spec = members[0][1]
    problem = None if not nodes else placement_problem(
        needed=spec.resources.nodes, partition=spec.slurm.partition, nodes=nodes, excluded=excluded,
        job=f"the job array of {', '.join(member.paths.run_dir.name for member, _ in members)}",
        placed="it may run on every node")
    if not problem:
        return excluded, None
    for member, _ in members:
        member.include_nodes()
    return (), problem


def live_arrays(record: SweepRecord) -> list[str]:
    """The sweep's recorded job arrays (and plain jobs) that SLURM still holds a task of, queued or running:
    a new array waits for them to end, so that ``max_parallel`` holds across arrays (SLURM's ``%N`` throttles
    one array only)."""
    recorded = {job.job_id for job in record.jobs}
    if not recorded:
        return []
    try:
        queued = user_jobs()
    except SlurmError as error:
        # Not knowing which arrays still run, a new one could run beside them past max_parallel: refuse.
        answer = error.answer
        why = "squeue is not on PATH here" if not answer.started else (answer.stderr.strip() or f"exit {answer.code}")
        raise executors.SubmissionError(
            f"cannot tell which of the sweep's job arrays {', '.join(sorted(recorded))} still run ({why}), so a new "
            f"array could run beside them past max_parallel {record.max_parallel}; nothing was handed over. Run the "
            "same command again once squeue answers") from None
    found = set()
    for job in queued:
        if job.base_id in recorded:
            found.add(job.base_id)
    return sorted(found, key=int)


def record_adopted_arrays(paths: SweepPaths, record: SweepRecord) -> SweepRecord:
    """Arrays that an interrupted hand-over queued and a later one adopted (members now hold a task of an
    array ``sweep.json`` does not list) are added to its jobs. The caller holds the sweep's lock."""
    recorded = {job.job_id for job in record.jobs}
    found: dict[str, list[str]] = {}
    kinds: dict[str, str] = {}
    for member in record.members:
        try:
            state = run_state.load_state(RunPaths(Path(member.run_dir)))
        except run_state.RunDamaged:
            continue
        submission = state.submissions[-1] if state is not None and state.submissions else None
        if submission is None or submission.job_id is None or submission.submitit_folder != str(paths.submitit):
            continue
        array_id = submission.job_id.partition("_")[0]
        if array_id not in recorded:
            found.setdefault(array_id, []).append(member.name)
            kinds[array_id] = submission.kind if submission.kind in (Launch.SUBMIT, Launch.RESUME) else Launch.RESUME
    if not found:
        return record
    at = run_state.now()
    jobs = tuple(SweepJob(job_id=array_id, kind=kinds[array_id], members=tuple(names), at=at,
                          max_parallel=record.max_parallel) for array_id, names in found.items())
    return change_sweep(paths, lambda r: replace(r, jobs=(*r.jobs, *jobs)))


def submit_array(paths: SweepPaths, record: SweepRecord, members: Sequence[MemberRecord], *,
                 kind: str, limit: int | None = None, include_nodes: bool = False) -> ArraysSubmitted:
    """Hand ``members`` over as job array(s) (``kind``: "submit" or "resume"): one per distinct set of sbatch
    options, cut at ``limit`` tasks (``MaxArraySize``), each after the one before
    (``--dependency=afterany``), the first after the sweep's arrays still queued or running: together they
    never run more than ``max_parallel`` members at once. Each member's job id goes to its ``state.json``,
    each array to ``sweep.json``. The caller holds the sweep's lock; each member's submission lock is held
    for the whole hand-over, so that a single-run ``elfes resume`` of a member cannot hand it over a second
    time. sbatch refusing the first array raises (every member's run directory as it was); refusing a later
    one keeps what was queued and returns the members left out (``refused``). A stop signal that arrives
    meanwhile waits for the hand-over to be recorded (``interrupted``). Each array leaves out the nodes its
    members excluded after failures (:func:`array_exclusions`; ``include_nodes``: those exclusions are cleared
    first, ``elfes resume SWEEP_DIR --include-nodes``)."""
    left: dict[str, str] = {}
    notes: list[str] = []
    refused: dict[str, str] = {}
    array_ids: list[str] = []
    error_text = None
    member_paths = {member.name: RunPaths(Path(member.run_dir)) for member in members}
    with signals_deferred() as arrived, ExitStack() as locks:
        runs: dict[str, HandOver] = {}
        for member in members:
            # Under its submission lock and state lock, its undo taken there, state.json read once.
            with ExitStack() as member_locks:
                run = member_locks.enter_context(held(member_paths[member.name]))
                why = _settle(run)
                if why is None:
                    runs[member.name] = run
                    locks.enter_context(member_locks.pop_all())  # held until its array is recorded
                else:  # adopted or live: its job may write state.json while the arrays are submitted
                    left[member.name] = why
        # Each member's spec as its job sees it, read once under its locks: workdir is the sweep's code snapshot
        # (the member's code.json).
        due = [(member.name, job_spec(_recorded(runs[member.name]), member_paths[member.name]))
               for member in members if member.name not in left]
        # After the arrays still queued or running, those an interrupted hand-over queued (just adopted) too.
        after = live_arrays(record_adopted_arrays(paths, record))
        for group in _groups(due, limit):
            if error_text is not None:  # an earlier array was refused: this one would have waited for it
                refused.update((name, f"not handed over: {error_text}") for name, _ in group)
                continue
            group_runs = [runs[name] for name, _ in group]
            try:
                if include_nodes:
                    for run in group_runs:
                        run.include_nodes()
                pairs = [(run, spec) for run, (_, spec) in zip(group_runs, group)]
                exclude = array_exclusions(pairs)
                if exclude:
                    exclude, note = _placeable(pairs, exclude, partition_nodes(group[0][1].slurm.partition))
                    notes += [note] if note else []
                aheads = [(run, Ahead(spec, Executor.SLURM, Launch.SUBMIT if run.state is None else Launch.RESUME,
                                      submitit_folder=paths.submitit, array_task=task if len(group) > 1 else None))
                          for task, (run, (_, spec)) in enumerate(zip(group_runs, group))]
                tasks = [JobRuntime(str(run.paths.run_dir)) for run in group_runs]
                ask = partial(arrays.submit_array, group[0][1], tasks,
                              paths, record.max_parallel, after=after, exclude=exclude)
                job_ids = [str(state.job_id) for state in hand_over(aheads, ask)]
            except (executors.SubmissionError, OSError) as error:  # sbatch refused, or no room to record the jobs
                _restore(group_runs)
                if not array_ids:
                    raise
                error_text = str(error)
                refused.update((name, error_text) for name, _ in group)
                continue
            except BaseException:
                _restore(group_runs)
                raise
            array_id = job_ids[0].partition("_")[0]
            array_ids.append(array_id)
            after = [array_id]
            job = SweepJob(job_id=array_id, kind=kind, members=tuple(name for name, _ in group), at=run_state.now(),
                           max_parallel=record.max_parallel)

            def recorded(r: SweepRecord, job: SweepJob = job) -> SweepRecord:
                return replace(r, jobs=(*r.jobs, job), problems={
                    name: why for name, why in r.problems.items() if name not in job.members})

            change_sweep(paths, recorded)
        if refused:
            change_sweep(paths, lambda r: replace(r, problems={**r.problems, **refused}))
    return ArraysSubmitted(array_ids, left, refused, error_text, arrived[0] if arrived else None, tuple(notes))


def array_findings(spec_file: str, config: dict[str, str], sets: Sequence[str] = ()
                   ) -> list[tuple[str, str, str | None]]:
    """``elfes doctor`` of a sweep spec (``--set`` texts ``sets`` applied): each array's ``--array`` line, cut at
    ``MaxArraySize`` (level, what it says, what to change)."""
    from ...spec.sweep import plan_sweep

    plan = plan_sweep(spec_file, sets=sets, check_files=False)
    limit = int(config["MaxArraySize"]) if config.get("MaxArraySize", "").isdigit() else None
    groups = _groups([(member.name, member.spec) for member in plan.members], limit)
    found: list[tuple[str, str, str | None]] = []
    for group in groups:
        line = array_line(len(group), plan.max_parallel)
        says = (f"{len(group)} member(s) run as one job array: {line} (task k runs member k; a preempted "
                "member requeues alone as <array>_<k>)" + (f" (MaxArraySize={limit})" if limit is not None else ""))
        found.append(("ok", says, None))
    if len(groups) > 1:
        found.append(("note", f"the sweep's {len(plan.members)} members form {len(groups)} arrays (members that differ "
                      "in sbatch options, or more than MaxArraySize, go to separate arrays); each starts once the one "
                      f"before has ended (--dependency=afterany), so max_parallel={plan.max_parallel} holds across "
                      "them", None))
    return found
