"""The code snapshot: a copy of the spec's ``workdir`` taken at submission, which every attempt of the
run imports from (or, for a ``command:``, runs in), so that a job requeued after its author edited
``train.py``, pulled a branch or switched one still runs the code it was submitted with.

What is copied (:func:`select`): in a git work tree, the files git lists under ``workdir``, tracked or
untracked but not ignored (``git ls-files --cached --others --exclude-standard``), so ``.venv``,
``runs/`` and whatever else ``.gitignore`` names stay out; elsewhere, the whole folder (``.git``,
``__pycache__``, ``*.pyc`` and virtual environments left out). A submodule's files are listed by git in
the submodule, so its own ``.gitignore`` holds. Left out unless a ``snapshot.include`` pattern brings them
back (launcher/submit/snapshot_rules.py): what looks like a credential, by its name or a private key in it,
named at submission (:attr:`Selection.secrets`); what ELFES writes under a workdir (other runs' directories,
tracker stores, checkpoints: not code; the checkpoints named, :attr:`Selection.checkpoints`). The run
directory (or sweep folder) is never copied,
``snapshot.exclude`` patterns leave more out, ``snapshot.include`` patterns bring ignored files in, and
a selection over ``snapshot.max_mb`` or holding what is not a file (a named pipe, a socket) is refused
before anything is created (:class:`SnapshotError`, naming the files). :func:`take` copies the
selection into ``code/<N>/`` below the run directory, under a temporary name renamed into place,
readable by its owner only (``code.json`` records its fingerprint: launcher/rundir/code_record.py). A file
that vanishes between the listing and its copy (a log, a journal of a store being written) is not code: it is
left out of the copy, while a file that cannot be read is refused by its name (:class:`SnapshotError`).

Not submitit's ``helpers.RsyncSnapshot``: it needs ``rsync`` (absent from a bare Debian and from many
laptops), snapshots the whole git repository rather than the workdir, leaves untracked files out,
``git clone``s the repository into the snapshot (its ``.git`` too) and changes the submitting process's
working folder while it is entered. Here the copy is plain Python; ``git`` is asked only for the file
list and the commit (its argument lists never pass through a shell). Torch-free.

>>> selection = select(spec.workdir, spec.snapshot, leave_out=[spec.run_dir])   # reads, creates nothing  # doctest: +SKIP
>>> check_size(selection, spec.snapshot, field="snapshot.max_mb")               # SnapshotTooLarge if over  # doctest: +SKIP
>>> folder, copied = take(selection, RunPaths(spec.run_dir).code)              # code/1, code/2, ...  # doctest: +SKIP
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import shutil
import stat
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..spec.models import SpecError
from ..spec.sections import Snapshot
from .snapshot_rules import checkpoint, elfes_output, in_output_folder, is_output_folder, looks_secret, matches

GIT_TIMEOUT_S = 60.0
ALWAYS_LEFT_OUT = (".git", "__pycache__", "*.pyc")  # in a folder that is not a git work tree
OWNER_ONLY = 0o700  # a snapshot's folders; its files keep only their owner's permission bits


class SnapshotError(SpecError):
    """The workdir cannot be snapshotted as the spec asks (too large, unreadable); nothing was created."""


class SnapshotTooLarge(SnapshotError):
    pass


@dataclass(frozen=True)
class GitState:
    """What git says of the workdir: its commit, and whether the snapshot differs from it (and how)."""

    commit: str | None  # HEAD, None in a repository without commits
    dirty: bool  # tracked files changed, or untracked (not ignored) files copied
    diff_sha256: str | None  # sha256 of `git diff --binary HEAD` under workdir plus the copied untracked files


@dataclass(frozen=True)
class Selection:
    """The files a snapshot of ``workdir`` copies (paths relative to it), their sizes, and git's view."""

    workdir: Path
    files: tuple[str, ...]
    sizes: dict[str, int] = field(repr=False)
    git: GitState | None = None
    secrets: tuple[str, ...] = ()  # left out as looking like credentials, not brought back by include
    checkpoints: tuple[str, ...] = ()  # checkpoint files left out (not code), not brought back by include

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes.values())

    def without(self, names: Iterable[str]) -> Selection:
        """This selection less ``names`` (files that vanished before their copy)."""
        gone = set(names)
        return replace(self, files=tuple(name for name in self.files if name not in gone),
                       sizes={name: size for name, size in self.sizes.items() if name not in gone})

    def largest(self, count: int = 5) -> list[tuple[str, int]]:
        return sorted(self.sizes.items(), key=lambda item: (-item[1], item[0]))[:count]


def _git(workdir: Path, *arguments: str) -> subprocess.CompletedProcess[bytes] | None:
    if shutil.which("git") is None:
        return None
    try:
        return subprocess.run(["git", "-C", str(workdir), *arguments], capture_output=True, timeout=GIT_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None


def _in_git_work_tree(workdir: Path) -> bool:
    found = _git(workdir, "rev-parse", "--is-inside-work-tree")
    return found is not None and found.returncode == 0 and found.stdout.strip() == b"true"


def _walk(workdir: Path, leave_out: Sequence[Path]) -> list[str]:
    found = []
    for folder, folders, files in os.walk(workdir):
        here = Path(folder)
        folders[:] = sorted(name for name in folders if not _left_out(here / name, leave_out)
                            and not any(fnmatch.fnmatchcase(name, pattern) for pattern in ALWAYS_LEFT_OUT)
                            and not is_output_folder(here / name))
        linked = [name for name in folders if (here / name).is_symlink()]  # copied as links, not followed
        folders[:] = [name for name in folders if name not in linked]
        for name in sorted([*files, *linked]):
            if not any(fnmatch.fnmatchcase(name, pattern) for pattern in ALWAYS_LEFT_OUT):
                found.append((here / name).relative_to(workdir).as_posix())
    return sorted(found)


def _left_out(path: Path, leave_out: Sequence[Path]) -> bool:
    return any(path == folder or folder in path.parents for folder in leave_out)


def _git_files(workdir: Path) -> list[str] | None:
    listed = _git(workdir, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", ".")
    if listed is None or listed.returncode != 0:
        return None
    found = []
    for name in listed.stdout.decode(errors="surrogateescape").split("\0"):
        name = name.rstrip("/")
        if not name:
            continue
        path = workdir / name
        if path.is_dir() and not path.is_symlink():  # a submodule (or a nested repository): git lists its files
            inner = _git_files(path) if (path / ".git").exists() else None
            found += [f"{name}/{file}" for file in (inner if inner is not None else _walk(path, ()))]
        elif path.exists() or path.is_symlink():  # a tracked file deleted from the tree is not copied
            found.append(name)
    return sorted(set(found))


def _git_state(workdir: Path, files: Sequence[str]) -> GitState | None:
    head = _git(workdir, "rev-parse", "--verify", "-q", "HEAD")
    if head is None:
        return None
    commit = head.stdout.decode().strip() if head.returncode == 0 and head.stdout.strip() else None
    digest = hashlib.sha256()
    dirty = False
    if commit is not None:
        diff = _git(workdir, "diff", "--binary", "HEAD", "--", ".")
        if diff is not None and diff.returncode == 0 and diff.stdout:
            dirty = True
            digest.update(diff.stdout)
    untracked = _git(workdir, "ls-files", "-z", "--others", "--exclude-standard", "--", ".")
    wanted = set(files)
    for name in sorted(untracked.stdout.decode(errors="surrogateescape").split("\0") if untracked else ()):
        if name and name in wanted:
            dirty = True
            digest.update(name.encode(errors="surrogateescape") + b"\0" + _file_digest(workdir / name) + b"\0")
    if commit is None:
        dirty = bool(files)
    return GitState(commit=commit, dirty=dirty, diff_sha256=digest.hexdigest() if dirty else None)


def _file_digest(path: Path) -> bytes:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as stream:
            while chunk := stream.read(1 << 20):
                digest.update(chunk)
    except OSError:
        pass
    return digest.digest()


def select(workdir: Path, options: Snapshot, *, leave_out: Sequence[Path] = ()) -> Selection:
    """The files a snapshot of ``workdir`` copies with ``options`` (``snapshot.exclude``/``include``), without the
    folders in ``leave_out`` (the run directory). Reads only. :class:`SnapshotError` when a file cannot be read."""
    workdir = Path(os.path.abspath(workdir))
    leave_out = [Path(os.path.abspath(folder)) for folder in leave_out]
    git = _in_git_work_tree(workdir)
    listed = _git_files(workdir) if git else None
    if listed is None:
        git = False
        listed = _walk(workdir, leave_out)
    output_folders: dict[str, bool] = {}
    chosen = {name for name in listed if not _left_out(workdir / name, leave_out)
              and not (git and in_output_folder(workdir, name, output_folders))}  # a walk does not enter them
    included = set()
    for pattern in options.include:
        for path in workdir.glob(pattern):
            if (path.is_file() or path.is_symlink()) and not _left_out(path, leave_out):
                included.add(path.relative_to(workdir).as_posix())
            elif path.is_dir():
                included.update(f"{path.relative_to(workdir).as_posix()}/{inner}" for inner in _walk(path, leave_out))
    chosen |= included
    chosen = {name for name in chosen if not matches(name, options.exclude)}
    by_default = sorted(chosen.difference(included))  # what snapshot_rules may leave out
    outputs = [name for name in by_default if elfes_output(name)]
    secrets = [name for name in sorted(set(by_default).difference(outputs)) if looks_secret(workdir, name)]
    files, sizes = [], {}
    for name in sorted(chosen.difference(secrets, outputs)):
        try:
            status = (workdir / name).lstat()
        except FileNotFoundError:  # deleted since the listing: not code (a log, a journal)
            continue
        except OSError as error:
            raise SnapshotError(f"workdir = {str(workdir)!r}: {name} cannot be read for the code snapshot "
                                f"({error.strerror or error}); fix it, or leave it out with snapshot.exclude") from None
        if not (stat.S_ISREG(status.st_mode) or stat.S_ISLNK(status.st_mode)):
            raise SnapshotError(f"workdir = {str(workdir)!r}: {name} is {_kind(status.st_mode)}, not a file, so the "
                                f"code snapshot cannot copy it; leave it out with snapshot.exclude (e.g. exclude: "
                                f"[{name!r}]), or move it out of workdir")
        files.append(name)
        sizes[name] = status.st_size
    return Selection(workdir=workdir, files=tuple(files), sizes=sizes,
                     git=_git_state(workdir, files) if git else None, secrets=tuple(secrets),
                     checkpoints=tuple(name for name in outputs if checkpoint(name)))


def _kind(mode: int) -> str:
    return ("a named pipe (FIFO)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else
            "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file")


def _mb(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


def check_size(selection: Selection, options: Snapshot, *, source: str) -> None:
    """Refuse (:class:`SnapshotTooLarge`) a selection over ``options.max_mb``, naming its largest files."""
    limit = options.max_mb * 1e6
    if selection.total_bytes <= limit:
        return
    largest = ", ".join(f"{name} ({_mb(size)})" for name, size in selection.largest())
    raise SnapshotTooLarge(
        f"{source}: snapshot: the code snapshot of workdir = {str(selection.workdir)!r} would copy "
        f"{len(selection.files)} files, {_mb(selection.total_bytes)}, over snapshot.max_mb = {options.max_mb:g}; the "
        f"largest: {largest}. Leave files out with snapshot.exclude (e.g. exclude: [{selection.largest(1)[0][0]!r}]), "
        "have git ignore them, raise snapshot.max_mb, or turn the snapshot off with snapshot: false (then every "
        "attempt imports workdir as it is when it starts)")


def next_folder(parent: Path) -> Path:
    """``parent/<N>``: one above the highest snapshot number in ``parent`` (``1`` in a new one)."""
    numbers = [int(entry.name) for entry in parent.iterdir() if entry.name.isdigit()] if parent.is_dir() else []
    return parent / str(max(numbers, default=0) + 1)


def take(selection: Selection, parent: Path) -> tuple[Path, Selection]:
    """Copy ``selection`` into a new ``parent/<N>/`` (built under a temporary name, renamed into place); return it
    and what it holds (``selection`` less the files that vanished before their copy). Readable by its owner only:
    folders are ``rwx------``, files keep their owner's bits alone (and their times); symbolic links are copied as
    links (what they point to is not copied). :class:`SnapshotError` names a file that cannot be read; an
    ``OSError`` is the destination's."""
    destination = next_folder(parent)
    building = parent / f".{destination.name}.{os.getpid()}.partial"
    parent.mkdir(mode=OWNER_ONLY, parents=True, exist_ok=True)
    shutil.rmtree(building, ignore_errors=True)
    vanished = []
    try:
        building.mkdir(mode=OWNER_ONLY)  # an empty selection is an empty folder
        os.chmod(building, OWNER_ONLY)  # whatever the umask
        for name in selection.files:
            target = building / name
            _owner_only_folders(building, target.parent)
            if not _copy_file(selection.workdir, name, target):
                vanished.append(name)
        os.rename(building, destination)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return destination, selection.without(vanished)


def _copy_file(workdir: Path, name: str, target: Path) -> bool:
    """Copy ``workdir/name`` to ``target`` (a link as a link), owner-only; False when it vanished since the
    listing. The source's errors are :class:`SnapshotError` naming it; the target's stay ``OSError``."""
    source, link = workdir / name, None
    try:
        if source.is_symlink():
            link = os.readlink(source)
        else:
            reading = open(source, "rb")
    except FileNotFoundError:
        return False
    except OSError as error:
        raise _unreadable(workdir, name, error) from None
    if link is not None:
        os.symlink(link, target)
        return True
    with reading:
        status = os.fstat(reading.fileno())
        with open(target, "xb") as writing:
            while True:
                try:
                    chunk = reading.read(1 << 20)
                except OSError as error:
                    raise _unreadable(workdir, name, error) from None
                if not chunk:
                    break
                writing.write(chunk)
    os.chmod(target, stat.S_IMODE(status.st_mode) & OWNER_ONLY)
    os.utime(target, ns=(status.st_atime_ns, status.st_mtime_ns))
    return True


def _unreadable(workdir: Path, name: str, error: OSError) -> SnapshotError:
    return SnapshotError(f"workdir = {str(workdir)!r}: {name} cannot be read for the code snapshot "
                         f"({error.strerror or error}); fix its permissions, or leave it out with snapshot.exclude "
                         f"(e.g. exclude: [{name!r}])")


def _owner_only_folders(top: Path, folder: Path) -> None:
    """Create ``folder`` below ``top`` (and its parents), each ``rwx------``."""
    missing = []
    while folder != top and not folder.is_dir():
        missing.append(folder)
        folder = folder.parent
    for created in reversed(missing):
        created.mkdir(mode=OWNER_ONLY)
        os.chmod(created, OWNER_ONLY)


def prune(parent: Path, keep: Path) -> None:
    """Remove every snapshot in ``parent`` but ``keep`` (and leftovers of copies a kill cut short)."""
    if not parent.is_dir():
        return
    for entry in parent.iterdir():
        if entry.name != keep.name and (entry.name.isdigit() or entry.name.endswith(".partial")):
            shutil.rmtree(entry, ignore_errors=True)


def changed_files(snapshot: Path, selection: Selection) -> list[str]:
    """How the files of ``selection`` (the workdir now) differ from the ``snapshot`` folder: ``"changed: a.py"``,
    ``"added: b.py"``, ``"removed: c.py"``, sorted by path."""
    now = set(selection.files)
    before = set() if not snapshot.is_dir() else {
        path.relative_to(snapshot).as_posix() for path in snapshot.rglob("*") if path.is_file() or path.is_symlink()}
    found = []
    for name in sorted(now | before):
        if name not in before:
            found.append(f"added: {name}")
        elif name not in now:
            found.append(f"removed: {name}")
        elif not _same(selection.workdir / name, snapshot / name):
            found.append(f"changed: {name}")
    return found


def _same(left: Path, right: Path) -> bool:
    if left.is_symlink() or right.is_symlink():
        return left.is_symlink() and right.is_symlink() and os.readlink(left) == os.readlink(right)
    try:
        if left.stat().st_size != right.stat().st_size:
            return False
        return left.read_bytes() == right.read_bytes()
    except OSError:
        return False
