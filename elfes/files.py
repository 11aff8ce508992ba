"""Files that other processes read, published atomically. Torch-free: the launcher uses it too.

A file is written under a temporary name in its own folder, flushed and fsynced, renamed over its
final name, and the folder is fsynced, so a reader (or a writer killed half-way) finds either the
old complete file or the new complete file, never a torn one. Symlinks are replaced the same way.

>>> write_text_atomically(run_dir / "state.json", json.dumps(state))  # doctest: +SKIP
>>> with atomic_writer(path) as stream:  # doctest: +SKIP
...     torch.save(payload, stream)
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

TEMPORARY_PREFIX = ".tmp-"


def temporary_name(path: Path) -> Path:
    """The temporary sibling that :func:`atomic_writer` writes before renaming it to ``path``."""
    return path.with_name(f"{TEMPORARY_PREFIX}{path.name}.{os.getpid()}")


def is_temporary(path: Path) -> bool:
    return path.name.startswith(TEMPORARY_PREFIX)


@contextmanager
def atomic_writer(path: Path) -> Iterator[BinaryIO]:
    """Yield a binary stream whose content replaces ``path`` atomically when the block ends.

    Nothing is published when the block raises: the temporary file is removed and ``path`` keeps
    its old content. A full disk is reported as an ``OSError`` naming ``path``, even when the writer
    (``torch.save``, say) hid it behind an error of its own.
    """
    path = Path(path)
    temporary = temporary_name(path)
    stream: _FailureRecordingStream | None = None
    try:
        with open(temporary, "wb") as file:
            stream = _FailureRecordingStream(file)
            yield stream  # type: ignore[misc]  # a BinaryIO by delegation: its own write, the file's other methods
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException as error:
        # torch.save reports a full disk as its own RuntimeError; the stream kept the real cause.
        failure = stream.failure if stream is not None and stream.failure is not None else error
        if isinstance(failure, OSError) and failure.errno in (errno.ENOSPC, errno.EDQUOT):
            raise OSError(
                failure.errno,
                f"No space left to write {path} ({os.strerror(failure.errno)}); the previous file, if any, is "
                "unchanged. Free space on that file system or write to another folder",
            ) from None
        raise
    finally:
        temporary.unlink(missing_ok=True)
    fsync_directory(path.parent)


class _FailureRecordingStream:
    """A file's ``write`` that remembers the OSError it raised, for writers that replace it."""

    def __init__(self, file: BinaryIO) -> None:
        self._file = file
        self.failure: OSError | None = None

    def write(self, data: bytes) -> int:
        try:
            return self._file.write(data)
        except OSError as error:
            self.failure = error
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)


def write_bytes_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically."""
    with atomic_writer(path) as stream:
        stream.write(data)


def write_text_atomically(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` (UTF-8) atomically."""
    write_bytes_atomically(path, text.encode("utf-8"))


def replace_symlink(link: Path, target: str) -> bool:
    """Make ``link`` a symlink to ``target`` (kept as given, e.g. relative), replacing any old link
    atomically. Returns False, touching nothing, when the link already points there."""
    link = Path(link)
    if link.is_symlink() and os.readlink(link) == target:
        return False
    temporary = temporary_name(link)
    temporary.unlink(missing_ok=True)
    os.symlink(target, temporary)
    try:
        os.replace(temporary, link)
    finally:
        temporary.unlink(missing_ok=True)
    fsync_directory(link.parent)
    return True


def fsync_directory(path: Path) -> None:
    """Make renames and deletions inside ``path`` durable."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def check_writable_directory(path: Path, *, what: str) -> None:
    """Create ``path`` if needed and prove that files can be created and renamed in it.

    Raises ``ValueError`` naming ``what`` (e.g. ``"checkpoint_dir"``), the path, the reason and the fix.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{what} {path} is a file, not a folder; give a folder path (it is created if missing).")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f"{TEMPORARY_PREFIX}probe.{os.getpid()}"
        write_bytes_atomically(probe, b"")
        probe.unlink()
    except OSError as error:
        raise ValueError(
            f"{what} {path} cannot be written ({error.strerror or error}); give a folder this process can create "
            "files in (not read-only, with free space), or fix its permissions."
        ) from None


@contextmanager
def exclusive_lock(path: Path, *, wait: bool = True) -> Iterator[None]:
    """Hold an exclusive ``fcntl.flock`` on ``path`` (created if missing) for the block; released when the
    block ends or the process dies, so a killed holder never leaves it taken. The lock file may be removed
    (a refused submission removes the ones it created): a lock taken on a file no longer at ``path`` is
    dropped and taken again on the file there now, so two holders never hold two different files. With
    ``wait=False``, :class:`BlockingIOError` when another holder has it."""
    while True:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            try:
                current = os.stat(path)
            except FileNotFoundError:
                current = None
            held = os.fstat(descriptor)
            if current is not None and (current.st_dev, current.st_ino) == (held.st_dev, held.st_ino):
                break
        except BaseException:
            os.close(descriptor)
            raise
        os.close(descriptor)
    try:
        yield
    finally:
        os.close(descriptor)
