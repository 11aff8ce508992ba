"""``elfes doctor [JOB.yaml]``: what the cluster will do to this job on preemption, time limit and cancel,
read from SLURM's own configuration, with what to change where it will go wrong.

Reads ``scontrol show config`` and ``scontrol show partition <p> -o`` (the job's partition, else the
default one), the job spec, and the save times an earlier attempt recorded (the time the loop was
blocked by each synchronous ``checkpoint``, as a stop's save is, and the time from a noticed stop
(``stop_signal``) to the stop's checkpoint, in ``RUN_DIR/events.jsonl``). Asynchronous interval
checkpoints are left out: a stop never writes in the background.
With ``test_job`` it also submits a one-minute job to the partition that runs ``scontrol show job
$SLURM_JOB_ID`` (a job that requeues itself runs ``scontrol requeue`` from its compute node).

Torch-free, a login-node command. Returns data (:class:`Diagnosis`); the CLI prints it.

>>> diagnosis = doctor("job.yaml")  # doctest: +SKIP
>>> [(finding.topic, finding.level) for finding in diagnosis.findings][:2]  # doctest: +SKIP
[('partition', 'ok'), ('preemption', 'ok')]
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from elfes.contract import STOP_EVENTS, EventKind

from ..rundir.lookup import UsageError
from ..rundir.paths import RunPaths
from ..slurm import TEST_JOB_TIMEOUT_S, SlurmError, cancel_by_name, scontrol_test_job, submitted_job_id
from ..slurm import cluster_config as read_cluster_config
from ..slurm import partitions as read_partitions
from ..spec import JobSpec
from ..spec.overrides import load_spec_with
from .signalling import ActionFailed

LEVELS = ("ok", "note", "warning", "problem")
# SLURM may send the time-limit signal up to this much earlier than --signal=USR2@N asks (its timer).
SIGNAL_EARLY_S = 60


@dataclass(frozen=True)
class Finding:
    """One thing the cluster will do to the job: ``level`` (one of LEVELS), what happens, what to change."""

    topic: str
    level: str
    says: str
    change: str | None = None


@dataclass(frozen=True)
class SaveTimes:
    """Save times an earlier attempt recorded in the run's events (seconds; None when none was recorded)."""

    checkpoints: int  # synchronous checkpoint events seen
    longest_save_s: float | None  # the longest synchronous checkpoint's blocked_s (duration_s in older records)
    longest_stop_s: float | None  # the longest time from a noticed stop to `last` saved (window end + save)

    @property
    def needed_s(self) -> float | None:
        """What a stop needs from its signal to `last` saved: the longer of the two."""
        known = [value for value in (self.longest_save_s, self.longest_stop_s) if value is not None]
        return max(known) if known else None


@dataclass(frozen=True)
class Diagnosis:
    """``elfes doctor``'s answer: the settings it read and its findings, worst first within each topic."""

    spec_file: str | None
    job: str | None
    partition: str
    settings: dict[str, str]  # the cluster's and the partition's settings the findings rest on
    save_times: SaveTimes | None
    findings: list[Finding] = field(default_factory=list)

    @property
    def problems(self) -> list[Finding]:
        return [finding for finding in self.findings if finding.level == "problem"]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# -- reading SLURM --------------------------------------------------------------------------------------------
def _unanswered(error: SlurmError) -> ActionFailed:
    completed = error.answer
    if not completed.started:
        return ActionFailed("elfes doctor reads the cluster's configuration with scontrol, which is not on PATH here; "
                            "run it on the cluster's login node")
    return ActionFailed(f"{completed.command} failed: {completed.said or completed.code}; check that SLURM "
                        "answers here (scontrol ping; SLURM_CONF)")


def cluster_config() -> dict[str, str]:
    """``scontrol show config`` as a mapping (``KillWait`` -> ``"10 sec"``)."""
    try:
        return dict(read_cluster_config().values)
    except SlurmError as error:
        raise _unanswered(error) from None


def partitions() -> dict[str, dict[str, str]]:
    """Every partition's settings (``scontrol show partition -o``), by name."""
    try:
        return {name: dict(settings.values) for name, settings in read_partitions().items()}
    except SlurmError as error:
        raise _unanswered(error) from None


def _seconds(value: str | None) -> int | None:
    """``"10 sec"``, ``"30"`` -> seconds; None when not a number."""
    number = (value or "").split(" ")[0]
    return int(number) if number.isdigit() else None


def _minutes(value: str | None) -> int | None:
    """A SLURM time limit (``UNLIMITED``, ``MM``, ``HH:MM:SS``, ``D-HH:MM:SS``) in minutes; None: unlimited."""
    if not value or value.upper() in ("UNLIMITED", "INFINITE", "NONE"):
        return None
    days, _, clock = value.rpartition("-")
    parts = [int(part) for part in clock.split(":")]
    hours, minutes, seconds = ([0] * (3 - len(parts)) + parts) if len(parts) > 1 else (0, parts[0], 0)
    return (int(days or 0) * 24 + hours) * 60 + minutes + (1 if seconds else 0)


# -- what earlier attempts recorded ---------------------------------------------------------------------------
def _time(event: dict[str, Any]) -> datetime | None:
    try:
        return datetime.fromisoformat(str(event["time"]).replace("Z", "+00:00"))
    except (KeyError, ValueError):
        return None


def save_times(paths: RunPaths) -> SaveTimes | None:
    """The save times recorded in the run's events, or None without any synchronous checkpoint event."""
    try:
        lines = paths.events.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return None
    saves: list[float] = []
    stops: list[float] = []
    requested: datetime | None = None
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a line torn by a kill
        if event.get("event") in STOP_EVENTS and requested is None:
            requested = _time(event)  # noticed mid-window (stop_signal), or at the boundary
        elif event.get("event") == EventKind.CHECKPOINT:
            # A stop saves synchronously; a background write's time is not what a stop needs.
            blocked = event.get("blocked_s", event.get("duration_s"))
            if event.get("asynchronous") is not True and isinstance(blocked, (int, float)):
                saves.append(float(blocked))
            saved = _time(event)
            if event.get("reason") == "stop" and requested is not None and saved is not None:
                stops.append((saved - requested).total_seconds())
                requested = None
    if not saves:
        return None
    return SaveTimes(len(saves), max(saves), max(stops) if stops else None)


# -- the test job ---------------------------------------------------------------------------------------------
def scontrol_in_a_job(partition: str, spec: JobSpec | None) -> Finding:
    """Submit a one-minute job that runs ``scontrol show job $SLURM_JOB_ID``; wait for its exit code."""
    name = f"elfes-doctor-{secrets.token_hex(3)}"
    completed = scontrol_test_job(name, partition, account=spec.slurm.account if spec is not None else None,
                                  qos=spec.slurm.qos if spec is not None else None)
    if not completed.started:
        return Finding("scontrol in a job", "problem", "sbatch is not on PATH here; the test job was not submitted",
                       "run elfes doctor on the cluster's login node")
    if completed.timed_out:
        cancel_by_name(name)
        return Finding("scontrol in a job", "warning",
                       f"the test job {name} did not end within {TEST_JOB_TIMEOUT_S} s (the queue is busy?); "
                       "cancelled it", f"check by hand: srun -p {partition} -t 1 scontrol show job '$SLURM_JOB_ID'")
    job_id = submitted_job_id(completed) or "?"
    if completed.code == 0:
        return Finding("scontrol in a job", "ok", f"scontrol works from inside a job in partition {partition} (test "
                       f"job {job_id}): a job that gets the requeue signal can run `scontrol requeue` on itself")
    said = completed.stderr.strip().splitlines()[-1] if completed.stderr.strip() else f"exit code {completed.code}"
    return Finding("scontrol in a job", "problem",
                   f"the test job {job_id} could not run scontrol from its node ({said}): a job that gets the requeue "
                   "signal saves `last` but cannot requeue itself, and ends stopped",
                   "ask the administrators to put scontrol on the compute nodes' PATH (and SLURM_CONF or a configless "
                   "setup there); until then `elfes resume RUN_DIR` continues a stopped run")


# -- the findings ---------------------------------------------------------------------------------------------
def _preemption(config: dict[str, str], partition: str, settings: dict[str, str], needed: float | None
                ) -> list[Finding]:
    if "none" in config.get("PreemptType", "preempt/none"):
        return [Finding("preemption", "ok", "this cluster never preempts jobs (PreemptType=preempt/none)")]
    modes = set(settings.get("PreemptMode", config.get("PreemptMode", "OFF")).upper().split(","))
    grace = _seconds(settings.get("GraceTime")) or 0
    kill_wait = _seconds(config.get("KillWait")) or 30
    user_signal = "preempt_send_user_signal" in config.get("SlurmctldParameters", "")
    if "OFF" in modes:
        return [Finding("preemption", "ok", f"jobs in partition {partition} are not preempted (PreemptMode=OFF)")]
    if modes & {"SUSPEND", "GANG"}:
        return [Finding("preemption", "note", f"a preempted job in {partition} is suspended and continues later in "
                        f"memory (PreemptMode={settings.get('PreemptMode')}); nothing is saved and nothing is needed")]
    budget = grace + kill_wait
    signal = ("USR2 (preempt_send_user_signal is set): it saves `last` and requeues itself at once" if user_signal
              else "SIGTERM (preempt_send_user_signal is not set): it saves `last` and waits until SLURM kills it "
                   "at the end of GraceTime")
    findings = []
    if "REQUEUE" in modes:
        findings.append(Finding(
            "preemption", "ok", f"a preempted job in {partition} (PreemptMode=REQUEUE) gets {signal}; SLURM starts it "
            "again (same job id, SLURM_RESTART_COUNT + 1) and it resumes from `last`",
            None if user_signal else "optional: with SlurmctldParameters=preempt_send_user_signal (administrators) a "
            f"preempted job requeues itself at once instead of holding its resources for GraceTime ({grace} s)"))
    elif "CANCEL" in modes:
        findings.append(Finding(
            "preemption", "problem" if not user_signal else "warning",
            f"a preempted job in {partition} is cancelled (PreemptMode=CANCEL); it gets {signal}"
            + ("" if user_signal else "; it then stays stopped"),
            "submit to a partition with PreemptMode=REQUEUE (or ask the administrators for it); meanwhile "
            "`elfes resume RUN_DIR` continues a stopped run from `last`"))
    else:
        findings.append(Finding("preemption", "note", f"partition {partition} has PreemptMode="
                                f"{settings.get('PreemptMode')}, which elfes does not know; see `man slurm.conf`"))
    if grace == 0:
        findings.append(Finding(
            "grace time", "warning", f"GraceTime=0 in {partition}: a preempted job is signalled and killed KillWait "
            f"({kill_wait} s) later", "ask the administrators for a GraceTime that covers a save (e.g. 60-120 s)"))
    elif needed is not None and needed >= budget:
        findings.append(Finding(
            "grace time", "problem", f"a preemption leaves {budget} s (GraceTime {grace} + KillWait {kill_wait}) "
            f"before SIGKILL, but a stop took {needed:.1f} s: `last` may be lost",
            "make saves faster (smaller checkpoints, shorter windows between stop checks), or ask for a longer "
            "GraceTime"))
    else:
        findings.append(Finding(
            "grace time", "ok", f"a preempted job has GraceTime {grace} s + KillWait {kill_wait} s = {budget} s to "
            "save before SIGKILL" + (f" (a stop took {needed:.1f} s)" if needed is not None else "")))
    return findings


def _cancel(config: dict[str, str], needed: float | None) -> Finding:
    kill_wait = _seconds(config.get("KillWait")) or 30
    says = (f"`elfes cancel` (scancel): SIGTERM, then SIGKILL KillWait ({kill_wait} s) later: the job has {kill_wait} s "
            "to reach a window boundary and save `last`; it then stays cancelled")
    if needed is not None and needed >= kill_wait:
        return Finding("cancel", "problem", f"{says}, but a stop took {needed:.1f} s: a cancelled job loses its "
                       "progress since the previous save", "make saves faster or windows shorter, or ask the "
                       "administrators for a longer KillWait")
    return Finding("cancel", "ok", says + (f" (a stop took {needed:.1f} s)" if needed is not None else ""))


def _requeue(config: dict[str, str]) -> Finding:
    value = config.get("JobRequeue", "1")
    default = "requeueable by default" if value == "1" else "not requeueable by default"
    return Finding("requeue", "ok", f"JobRequeue={value} (jobs are {default}); elfes submits with --requeue, so "
                   "`scontrol requeue` and SLURM's own requeue after a preemption both work")


def _time_limit(spec: JobSpec, settings: dict[str, str], config: dict[str, str], times: SaveTimes | None
                ) -> list[Finding]:
    limit_s = spec.resources.timeout_min * 60
    delay = spec.slurm.signal_delay_s
    partition = settings.get("PartitionName", "?")
    findings = []
    max_minutes = _minutes(settings.get("MaxTime"))
    if max_minutes is not None and spec.resources.timeout_min > max_minutes:
        findings.append(Finding("time limit", "problem", f"resources.timeout_min = {spec.resources.timeout_min} exceeds "
                                f"partition {partition}'s MaxTime ({settings.get('MaxTime')}): sbatch refuses the job",
                                f"set resources.timeout_min to at most {max_minutes}"))
    training = limit_s - delay - SIGNAL_EARLY_S
    says = (f"USR2 comes {delay} s (slurm.signal_delay_s) before the {spec.resources.timeout_min} min limit, up to "
            f"~{SIGNAL_EARLY_S} s earlier (SLURM's timer): the job saves `last`, requeues itself and resumes with a "
            "fresh limit")
    if training < 60:
        findings.append(Finding("time limit", "warning", f"{says}; that leaves under a minute of training per attempt",
                                "raise resources.timeout_min or lower slurm.signal_delay_s"))
    else:
        findings.append(Finding("time limit", "ok", says))
    over = _minutes(config.get("OverTimeLimit", "0").split(" ")[0]) or 0
    if over:
        findings.append(Finding("time limit", "note", f"OverTimeLimit={over} min: SLURM kills jobs only that long "
                                "after their limit"))
    needed = times.needed_s if times is not None else None
    if times is None or needed is None:  # a SaveTimes always has a save, so its needed_s
        findings.append(Finding("save time", "note", "no save measured yet (no synchronous checkpoint, such as a stop's or the "
                                "final one, in the run's events.jsonl): "
                                "run the job once, then `elfes doctor` compares slurm.signal_delay_s with it"))
    elif needed >= delay:
        findings.append(Finding("save time", "problem", f"a stop took {needed:.1f} s (signal to `last` saved; longest "
                                f"checkpoint {times.longest_save_s:.1f} s), slurm.signal_delay_s is {delay} s: the time "
                                "limit kills the job before `last` is saved",
                                f"set slurm.signal_delay_s to at least {int(2 * needed) + 10}"))
    elif needed * 2 >= delay:
        findings.append(Finding("save time", "warning", f"a stop took {needed:.1f} s, more than half of "
                                f"slurm.signal_delay_s = {delay} s: a slower save (a loaded file system) may be killed "
                                "by the time limit", f"set slurm.signal_delay_s to at least {int(2 * needed) + 10}"))
    else:
        findings.append(Finding("save time", "ok", f"a stop took {needed:.1f} s (longest checkpoint "
                                f"{times.longest_save_s:.1f} s of {times.checkpoints} recorded), well within "
                                f"slurm.signal_delay_s = {delay} s"))
    return findings


def doctor(spec_file: str | os.PathLike[str] | None = None, *, test_job: bool = False, sets: Sequence[str] = ()
           ) -> Diagnosis:
    """Read the cluster's configuration and tell what preemption, the time limit and a cancel do to the
    job (``spec_file`` with the ``--set`` texts ``sets`` applied; without it, to any job of the default partition)."""
    if sets and spec_file is None:
        raise UsageError(f"--set {sets[0]}: --set changes a field of the job spec, and none was given; name it: "
                         f"elfes doctor JOB.yaml --set {sets[0]}")
    spec = load_spec_with(spec_file, sets) if spec_file is not None else None
    config = cluster_config()
    known = partitions()
    wanted = spec.slurm.partition if spec is not None else None
    default = next((name for name, settings in known.items() if settings.get("Default") == "YES"), None)
    partition = wanted or default
    findings: list[Finding] = []
    if partition is None or partition not in known:
        choices = ", ".join(sorted(known)) or "none"
        what = f"slurm.partition = {wanted!r}: no such partition" if wanted else "the cluster has no default partition"
        raise UsageError(f"{what} (partitions: {choices}); set slurm.partition to one of them")
    settings = known[partition]
    findings.append(Finding("partition", "ok", f"partition {partition}" + (" (the default)" if not wanted else "")
                            + f": PreemptMode={settings.get('PreemptMode')}, GraceTime={settings.get('GraceTime')} s, "
                            f"MaxTime={settings.get('MaxTime')}"))
    times = save_times(RunPaths(spec.run_dir)) if spec is not None else None
    needed = times.needed_s if times is not None else None
    findings += _preemption(config, partition, settings, needed)
    findings.append(_cancel(config, needed))
    findings.append(_requeue(config))
    if spec is not None:
        findings += _time_limit(spec, settings, config, times)
    if spec is not None and spec.sweep is not None:
        from .sweep.slurm import array_findings

        findings += [Finding("job array", *found) for found in array_findings(str(spec_file), config, sets)]
    if test_job:
        findings.append(scontrol_in_a_job(partition, spec))
    else:
        findings.append(Finding("scontrol in a job", "note", "not checked: a job requeues itself with `scontrol "
                                "requeue` from its compute node", "check with `elfes doctor"
                                + (f" {shlex.quote(str(spec_file))}" if spec_file else "")
                                + "".join(f" --set {shlex.quote(text)}" for text in sets)
                                + " --test-job` (submits a one-minute job), "
                                f"or by hand: srun -p {partition} -t 1 scontrol show job '$SLURM_JOB_ID'"))
    chosen = {name: config.get(name, "?") for name in ("SLURM_VERSION", "PreemptType", "PreemptMode", "KillWait",
                                                        "JobRequeue", "SlurmctldParameters", "OverTimeLimit")}
    chosen.update({f"partition.{name}": settings.get(name, "?") for name in ("PreemptMode", "GraceTime", "MaxTime")})
    return Diagnosis(str(spec_file) if spec_file is not None else None, spec.name if spec is not None else None,
                     partition, chosen, times, findings)
