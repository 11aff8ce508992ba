"""A sweep on SLURM: one job array per distinct set of sbatch options among the members (usually one),
task k running member k (``--array=0-<n-1>%<max_parallel>``, submitit's batch submission). Torch-free.

Each member's job id is ``<array job>_<task>`` (what submitit's ``JobEnvironment`` reports in the task):
``scontrol requeue`` of it requeues that member alone, ``squeue``/``scancel`` address it alone, and each
member counts its own requeues in its own ``state.json``. The hand-over is one transaction per array:
every member's submission is recorded ahead ("submitted"), then sbatch is asked once, then every member
gets its job id; when sbatch refuses, every member's run directory is restored as it was.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path

from ..job.runtime import JobRuntime
from ..rundir import state as run_state
from ..rundir.code_record import job_spec
from ..rundir.paths import RunPaths, SweepPaths
from ..rundir.sweep_record import MemberRecord, SweepJob, SweepRecord, change_sweep
from ..spec import JobSpec, load_spec
from ..spec.sweep import SweepPlan
from ..submit import arrays, executors
from ..submit.handover import RunDirUndo, record_ahead, record_job, signals_deferred, submission_lock
from .submission import close_lost_job, settle_interrupted_handover


def _options_key(spec: JobSpec) -> str:
    return json.dumps(executors.slurm_parameters(spec), sort_keys=True, default=str)


def _groups(specs: Sequence[tuple[str, JobSpec]]) -> list[list[tuple[str, JobSpec]]]:
    """Members sharing their sbatch options, in order of first appearance: one array each."""
    groups: dict[str, list[tuple[str, JobSpec]]] = {}
    for name, spec in specs:
        groups.setdefault(_options_key(spec), []).append((name, spec))
    return list(groups.values())


def array_line(count: int, max_parallel: int) -> str:
    return f"#SBATCH --array=0-{count - 1}%{min(count, max_parallel)}"


def _with_header(script: str, header: list[str]) -> str:
    shebang, _, rest = script.partition("\n")  # the comments go below the shebang: the script stays runnable
    return "\n".join([shebang, *header, rest])


def array_scripts(plan: SweepPlan) -> str:
    """``submit --dry-run`` of a sweep on SLURM: each array's sbatch script, its tasks named."""
    folder = SweepPaths(plan.sweep_dir).submitit
    parts = []
    for group in _groups([(member.name, member.spec) for member in plan.members]):
        by_name = {member.name: member for member in plan.members}
        header = [f"# job array of sweep {plan.base.name}: {len(group)} member(s), at most {plan.max_parallel} "
                  "at once; task k runs member k:"]
        header += [f"#   task {k}: {by_name[name].spec.run_dir}" for k, (name, _) in enumerate(group)]
        if len(group) == 1:
            header.append("# (one member: submitted as a plain job, not an array)")
            parts.append(_with_header(executors.sbatch_script(group[0][1], RunPaths(folder.parent)), header))
        else:
            parts.append(_with_header(arrays.array_sbatch_script(group[0][1], folder, len(group),
                                                                    plan.max_parallel), header))
    return "\n".join(parts)


@dataclass(frozen=True)
class ArraysSubmitted:
    array_ids: list[str]  # the job arrays submitted now
    left: dict[str, str]  # member -> why it was not handed over (it has a job, or one may still be starting)


def _settle(member: RunPaths) -> str | None:
    """Under the member's submission lock: why it is left out of this hand-over (a job an interrupted
    hand-over started, now adopted; or one that may still be starting), or None when it is due. A job that
    is gone without an outcome is recorded lost first, as a single run's submission does."""
    try:
        adopted = settle_interrupted_handover(member, ())
    except run_state.StateError as error:
        return str(error)
    if adopted is not None:
        return f"adopted SLURM job {adopted.job_id}, which an interrupted hand-over had started"
    try:
        state = close_lost_job(member)
    except run_state.StateError as error:
        return str(error)
    if state is not None and state.status not in run_state.ENDED:
        return f"{state.status} (job {state.job_id})"  # handed over meanwhile, e.g. by `elfes resume` of the member
    return None


def submit_array(paths: SweepPaths, record: SweepRecord, members: Sequence[MemberRecord], *,
                 kind: str) -> ArraysSubmitted:
    """Hand ``members`` over as job array(s) (``kind``: "submit" or "resume"); record each member's job id in
    its ``state.json`` and each array in ``sweep.json``. The caller holds the sweep's lock; each member's
    submission lock is held for the whole hand-over, so that a single-run ``elfes resume`` of a member
    cannot hand it over a second time."""
    left: dict[str, str] = {}
    array_ids: list[str] = []
    member_paths = {member.name: RunPaths(Path(member.run_dir)) for member in members}
    with signals_deferred(), ExitStack() as held:
        undo = {}
        for member in members:
            held.enter_context(submission_lock(member_paths[member.name]))
            undo[member.name] = RunDirUndo(member_paths[member.name])  # its snapshot, taken under the lock
            why = _settle(member_paths[member.name])
            if why is not None:
                left[member.name] = why
        # Each member's spec as its job sees it: workdir is the sweep's code snapshot (the member's code.json).
        due = [(member.name, job_spec(load_spec(member_paths[member.name].spec), member_paths[member.name]))
               for member in members if member.name not in left]
        for group in _groups(due):
            group_paths = [member_paths[name] for name, _ in group]
            try:
                for task, (member, (_, spec)) in enumerate(zip(group_paths, group)):
                    launch = "submit" if run_state.load_state(member) is None else "resume"
                    member.cancel_marker.unlink(missing_ok=True)
                    record_ahead(spec, member, "slurm", launch, submitit_folder=paths.submitit,
                                 array_task=task if len(group) > 1 else None)
                job_ids = arrays.submit_array(group[0][1], [JobRuntime(str(member.run_dir)) for member in group_paths],
                                              paths, record.max_parallel)
            except BaseException:
                for name, _ in group:
                    undo[name].restore()
                raise
            for member, job_id in zip(group_paths, job_ids):
                record_job(member, job_id)
            array_id = job_ids[0].partition("_")[0]
            array_ids.append(array_id)
            job = SweepJob(job_id=array_id, kind=kind, members=tuple(name for name, _ in group), at=run_state.now(),
                           max_parallel=record.max_parallel)
            change_sweep(paths, lambda r, job=job: replace(r, jobs=(*r.jobs, job)))
    return ArraysSubmitted(array_ids, left)


def array_findings(spec_file: str, config: dict[str, str]) -> list[tuple[str, str, str | None]]:
    """``elfes doctor`` of a sweep spec: each array's ``--array`` line, checked against ``MaxArraySize``
    (level, what it says, what to change)."""
    from ..spec.sweep import plan_sweep

    plan = plan_sweep(spec_file, check_files=False)
    groups = _groups([(member.name, member.spec) for member in plan.members])
    limit = int(config["MaxArraySize"]) if config.get("MaxArraySize", "").isdigit() else None
    found = []
    for group in groups:
        line = array_line(len(group), plan.max_parallel)
        says = (f"the sweep's {len(group)} member(s) run as one job array: {line} (task k runs member k; a preempted "
                "member requeues alone as <array>_<k>)")
        if limit is not None and len(group) > limit - 1:
            found.append(("problem", says + f"; MaxArraySize={limit} allows indices up to {limit - 1}",
                          f"split the sweep into sweeps of at most {limit - 1} members, or ask the admins to raise "
                          "MaxArraySize"))
        else:
            found.append(("ok", says + (f" (MaxArraySize={limit})" if limit is not None else ""), None))
    if len(groups) > 1:
        found.append(("note", f"the members differ in sbatch options, so they form {len(groups)} arrays; "
                      f"max_parallel={plan.max_parallel} holds in each", None))
    return found
