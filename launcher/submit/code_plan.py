"""What a submission does with the run's code snapshot, decided before anything is written and carried
out inside the hand-over transaction (launcher/commands/submission.py):

- ``elfes submit`` takes a fresh snapshot of the spec's workdir (``kind="submit"``);
- ``elfes resume`` keeps the recorded one, and says which files of the workdir changed since it was taken;
  ``elfes resume --code current`` takes a fresh one (``kind="current"``), recorded as such;
- ``snapshot: false`` takes none and removes ``code.json``: the job imports the workdir as it is.

A snapshot over the size limit is refused here, before anything is created. What a fresh snapshot leaves
out as looking like a secret, or as a checkpoint, is named (:attr:`CodePlan.warnings`). A fresh snapshot of other code for a run
that has checkpoints (``--code current``, a resubmission after an edit) is said to continue with the
optimizer's and scheduler's state the checkpoints hold, and recorded so in ``code.json`` (the attempts'
provenance). Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from ..rundir.code_record import CodeRecord, fingerprint, load_code_record, new_code_record, save_code_record
from ..rundir.paths import RunPaths
from ..rundir.state import RunDamaged
from ..spec import JobSpec
from ..spec.sections import Snapshot
from .continuation import has_checkpoints
from .handover import RunDirUndo
from .snapshot import Selection, SnapshotError, changed_files, check_size, next_folder, prune, select, take

CODE_CHOICES = ("snapshot", "current")  # `elfes resume --code`
SHOWN_CHANGES = 10
CONTINUED_WITH_OTHER_CODE = (
    "the run continues from its checkpoints with other code than wrote them ({other}): the model's weights and the "
    "optimizer's and scheduler's state (learning rate, momentum, the schedule's position) come from the checkpoint, "
    "so an edited constant that builds them (a learning rate in the code) has no effect, while a changed config key "
    "is refused; recorded in the run's provenance. To train from the start with this code, submit to a fresh run_dir "
    "(--set run_dir=NEW_FOLDER)")


@dataclass(frozen=True)
class CodePlan:
    """A fresh snapshot of ``selection`` (recorded with ``kind``), the recorded one kept (``keep``), or none."""

    selection: Selection | None = None
    kind: str = "submit"
    keep: bool = False
    note: str | None = None  # what the submitter tells the user about the code the job runs
    other_code_than: str | None = None  # the code that wrote the run's checkpoints, when the fresh snapshot differs

    @property
    def warnings(self) -> tuple[str, ...]:
        """What the user must know of this snapshot: the files left out as secrets or checkpoints, other code
        continuing a run."""
        found = []
        secrets = self.selection.secrets if self.selection is not None else ()
        if secrets:
            found.append(f"left out of the code snapshot as they look like credentials: {_shown(secrets)}; if the "
                         f"job needs one, bring it back with snapshot.include (e.g. include: [{secrets[0]!r}]), "
                         "better pass secrets through the environment")
        checkpoints = self.selection.checkpoints if self.selection is not None else ()
        if checkpoints:
            found.append(f"left out of the code snapshot as checkpoints, not code: {_shown(checkpoints)}; if the "
                         "job reads one by a relative path, bring it back with snapshot.include (e.g. include: "
                         f"[{checkpoints[0]!r}]) or give its absolute path")
        if self.other_code_than is not None:
            found.append(CONTINUED_WITH_OTHER_CODE.format(other=self.other_code_than))
        return tuple(found)

    def job_folder(self, paths: RunPaths, spec: JobSpec) -> Path:
        """Where the job will run, without taking anything (``submit --dry-run``)."""
        if self.selection is not None:
            return next_folder(paths.code)
        record = load_code_record(paths) if self.keep else None
        return Path(record.path) if record is not None else spec.workdir


def _shown(names: tuple[str, ...]) -> str:
    return ", ".join(names[:SHOWN_CHANGES]) + (f" and {len(names) - SHOWN_CHANGES} more"
                                               if len(names) > SHOWN_CHANGES else "")


def own_outputs(spec: JobSpec) -> tuple[Path, ...]:
    """What the run itself writes, never code: its run directory and its MLflow store where that is a file or a
    folder (``sqlite:///runs/experiments.db`` with SQLite's journals, ``file:mlruns``), whatever its name."""
    mlflow = spec.tracking.mlflow
    uri = mlflow.tracking_uri if mlflow is not None else ""
    if uri.startswith("sqlite:///"):
        store = Path(uri[len("sqlite:///"):].partition("?")[0])
        return (spec.run_dir, store, *(store.with_name(store.name + suffix) for suffix in ("-journal", "-wal", "-shm")))
    if uri.startswith("file:"):
        return (spec.run_dir, Path(urlsplit(uri).path))
    return (spec.run_dir,)


def _selection(spec: JobSpec, source: str, leave_out: tuple[Path, ...]) -> Selection:
    assert spec.snapshot is not False
    try:
        selection = select(spec.workdir, spec.snapshot, leave_out=(*own_outputs(spec), *leave_out))
    except OSError as error:
        raise SnapshotError(f"{source}: workdir = {str(spec.workdir)!r} cannot be read for the code snapshot "
                            f"({error.strerror or error})") from None
    except SnapshotError as error:
        raise SnapshotError(f"{source}: snapshot: {error}") from None
    check_size(selection, spec.snapshot, source=source)
    return selection


def _other_code(paths: RunPaths | None, selection: Selection) -> str | None:
    """What wrote the checkpoints of the run in ``paths``, when ``selection`` is other code; None without
    checkpoints, or for the same files as the run's recorded snapshot."""
    if paths is None or not has_checkpoints(paths):
        return None
    try:
        record = load_code_record(paths)
    except RunDamaged:
        return "code whose record cannot be read"
    if record is None:
        return "the workdir as it was (no code snapshot)"
    if record.fingerprint is not None:  # one read of the workdir's files, none of the snapshot's
        same = record.fingerprint == fingerprint(selection.workdir, selection.files)
    else:  # a record from before fingerprints: compare with its folder, where it still is
        same = Path(record.path).is_dir() and not changed_files(Path(record.path), selection)
    return None if same else record.describe()


def plan_submit(spec: JobSpec, source: str, *, leave_out: tuple[Path, ...] = (), paths: RunPaths | None = None
                ) -> CodePlan:
    """``elfes submit``: a fresh snapshot (refused here when over ``snapshot.max_mb``), or none. ``paths``: the run
    it may continue, whose checkpoints other code would continue."""
    if spec.snapshot is False:
        return CodePlan(note="snapshot: false: every attempt imports the workdir as it is when it starts")
    selection = _selection(spec, source, leave_out)
    return CodePlan(selection=selection, kind="submit", other_code_than=_other_code(paths, selection))


def plan_resume(spec: JobSpec, paths: RunPaths, source: str, code: str) -> CodePlan:
    """``elfes resume``: keep the recorded snapshot (``code="snapshot"``), naming the workdir's changes since,
    or take a fresh one (``code="current"``, or a run without one whose spec wants one)."""
    if code not in CODE_CHOICES:
        raise ValueError(f"--code must be one of {', '.join(CODE_CHOICES)}; got {code!r}")
    if spec.snapshot is False:
        if code == "current":
            raise SnapshotError(f"{source}: --code current takes a fresh code snapshot, but the spec says snapshot: "
                                "false; drop --code current (the job imports the workdir as it is), or --set "
                                "snapshot=true")
        return CodePlan(note="snapshot: false: the job imports the workdir as it is when it starts")
    record = load_code_record(paths)
    if code == "current" or record is None or not Path(record.path).is_dir():
        why = ("--code current" if code == "current" else
               "the run had no code snapshot" if record is None else f"its snapshot {record.path} is gone")
        selection = _selection(spec, source, ())
        return CodePlan(selection=selection, kind="current", other_code_than=_other_code(paths, selection),
                        note=f"a fresh code snapshot of {spec.workdir} ({why}); the job runs the code as it is now")
    return CodePlan(keep=True, note=_changes_note(spec, spec.snapshot, record, source))


def _changes_note(spec: JobSpec, options: Snapshot, record: CodeRecord, source: str) -> str:
    kept = f"the resume runs the code snapshot taken at {record.taken_at[:19]} ({record.path})"
    if not spec.workdir.is_dir():
        return f"{kept}; the workdir {spec.workdir} is gone"
    try:
        now = select(spec.workdir, options, leave_out=own_outputs(spec))
    except (OSError, SnapshotError):
        return kept
    changes = changed_files(Path(record.path), now)
    if not changes:
        return f"{kept}; the workdir has not changed since"
    shown = "; ".join(changes[:SHOWN_CHANGES]) + (f"; and {len(changes) - SHOWN_CHANGES} more"
                                                   if len(changes) > SHOWN_CHANGES else "")
    return (f"the workdir {spec.workdir} changed since the code snapshot ({shown}); {kept}, not the changed files "
            "(`elfes resume --code current` runs the code as it is now)")


def carry_out(plan: CodePlan, paths: RunPaths, undo: RunDirUndo) -> CodeRecord | None:
    """Inside the hand-over, under the submission lock: take the planned snapshot and record it in
    ``code.json`` (``undo`` removes both if the hand-over is refused), keep the recorded one, or record none."""
    if plan.keep:
        return load_code_record(paths)
    if plan.selection is None:
        save_code_record(paths, None)
        return None
    folder, copied = take(plan.selection, paths.code)
    undo.snapshots.append(folder)
    record = new_code_record(folder, copied, plan.kind, other_code_than=plan.other_code_than)
    save_code_record(paths, record)
    return record


def prune_older(paths: RunPaths, record: CodeRecord | None) -> None:
    """Once the job is handed over: remove the run's snapshots other than the one it runs."""
    if record is not None and Path(record.path).parent == paths.code:
        prune(paths.code, Path(record.path))
    elif record is None and paths.code.is_dir():
        prune(paths.code, paths.code / "none")
