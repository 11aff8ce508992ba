"""``code.json``: which code snapshot the run's attempts run, and what it was taken from. Torch-free.

Written atomically by ``elfes submit``/``resume`` (and a sweep's submission, for each member, naming the
sweep's one snapshot) before the job is handed over; read by every attempt at its start
(launcher/job/runtime.py), which then runs in that folder and imports the entrypoint from it, and by
``elfes status``. No ``code.json`` (``snapshot: false``, or a run from before snapshots): the job runs
in the spec's ``workdir`` as it is at each start.

>>> record = load_code_record(RunPaths(run_dir))  # doctest: +SKIP
>>> record.path, record.kind, record.commit, record.dirty  # doctest: +SKIP
('/runs/demo/code/1', 'submit', '8e78abc...', False)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elfes.files import write_text_atomically

from ..errors import RunDamaged
from .json_fields import read_record
from .paths import RunPaths
from .state import now

# How a snapshot came about: taken by `elfes submit` (or a sweep), kept by `elfes resume`, or taken afresh
# by `elfes resume --code current`.
KINDS = ("submit", "current")


@dataclass(frozen=True)
class CodeRecord:
    """One snapshot: the folder the job runs (``path``), the workdir it copies (``source``), when and how it was
    taken, its size, and git's view of the workdir then (``commit`` None outside git or before a first commit)."""

    path: str
    source: str
    taken_at: str
    kind: str  # one of KINDS
    files: int
    bytes: int
    commit: str | None = None
    dirty: bool | None = None  # None outside git
    diff_sha256: str | None = None  # of the uncommitted changes (and untracked files) it holds, when dirty
    fingerprint: str | None = None  # of its files' names and contents (:func:`fingerprint`), in or outside git
    secrets_left_out: tuple[str, ...] = ()  # files of workdir left out as looking like credentials
    # The run had checkpoints written by other code when this snapshot was taken for it: that code's description
    # (the earlier snapshot's describe(), or "unknown code"). The optimizer's and scheduler's state come from them.
    other_code_than: str | None = None

    def describe(self) -> str:
        """One short line: ``snapshot code/1 of 2026-12-02T10:11 (submit; git 8e78abc, dirty 3f2a9c01)``."""
        git = "not a git work tree"
        if self.commit is not None:
            git = f"git {self.commit[:12]}" + (f", dirty {self.diff_sha256[:8]}" if self.dirty and self.diff_sha256
                                               else ", clean" if not self.dirty else ", dirty")
        elif self.dirty is not None:
            git = "git, no commit yet"
        if self.commit is None and self.fingerprint:
            git += f", fingerprint {self.fingerprint[:12]}"
        return f"snapshot {self.path} of {self.taken_at[:19]} ({self.kind}; {git}; {self.files} files)"


def fingerprint(folder: Path, files: Any) -> str:
    """sha256 of the ``files`` of ``folder`` (posix paths relative to it): each name with its content (a link: its
    target). Two copies of the same files have the same fingerprint wherever they lie; any edit changes it."""
    digest = hashlib.sha256()
    for name in sorted(files):
        path = folder / name
        digest.update(name.encode(errors="surrogateescape") + b"\0")
        if path.is_symlink():
            digest.update(b"link\0" + os.readlink(path).encode(errors="surrogateescape"))
        else:
            content = hashlib.sha256()
            with open(path, "rb") as stream:
                while chunk := stream.read(1 << 20):
                    content.update(chunk)
            digest.update(b"file\0" + content.digest())
        digest.update(b"\0")
    return digest.hexdigest()


def new_code_record(folder: Path, selection: Any, kind: str, *, other_code_than: str | None = None) -> CodeRecord:
    """The record of the snapshot ``folder`` taken of ``selection`` (launcher/submit/snapshot.py); its fingerprint
    is that of the copy. ``other_code_than``: see :attr:`CodeRecord.other_code_than`."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}; got {kind!r}")
    git = selection.git
    return CodeRecord(path=str(folder), source=str(selection.workdir), taken_at=now(), kind=kind,
                      files=len(selection.files), bytes=selection.total_bytes,
                      commit=git.commit if git else None, dirty=git.dirty if git else None,
                      diff_sha256=git.diff_sha256 if git else None,
                      fingerprint=fingerprint(folder, selection.files),
                      secrets_left_out=tuple(selection.secrets), other_code_than=other_code_than)


def load_code_record(paths: RunPaths) -> CodeRecord | None:
    """The run's snapshot record, or None without ``code.json``. :class:`RunDamaged` names a damaged file."""
    try:
        content = paths.code_record.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as error:
        raise RunDamaged(f"{paths.code_record} cannot be read ({error}); check it and its permissions") from None
    try:
        record = read_record(CodeRecord, json.loads(content), choices={"kind": KINDS})
    except ValueError as error:
        raise RunDamaged(f"{paths.code_record} cannot be read: {error}. It is written atomically, so it was edited "
                         "outside elfes; `elfes resume --code current` takes a fresh snapshot") from None
    return record


def save_code_record(paths: RunPaths, record: CodeRecord | None) -> None:
    """Publish ``record`` as the run's ``code.json`` (None removes it: the run has no snapshot)."""
    if record is None:
        paths.code_record.unlink(missing_ok=True)
        return
    write_text_atomically(paths.code_record, json.dumps(dataclasses.asdict(record), indent=2) + "\n")


def code_folder(paths: RunPaths, workdir: Path) -> Path:
    """The folder the job runs in and imports from: the recorded snapshot, else ``workdir``."""
    record = load_code_record(paths)
    return Path(record.path) if record is not None else workdir


def job_spec(spec: Any, paths: RunPaths) -> Any:
    """``spec`` as the job sees it: ``workdir`` is the recorded snapshot when there is one (the executors start
    the job there, ``{workdir}`` names it, the runtime imports from it)."""
    folder = code_folder(paths, spec.workdir)
    return spec if folder == spec.workdir else spec.model_copy(update={"workdir": folder})
