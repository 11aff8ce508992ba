"""The torch-free atomic file helper shared by checkpoints and the launcher's state files."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from elfes.files import atomic_writer, check_writable_directory, replace_symlink, write_text_atomically


def test_importing_the_file_helper_and_the_records_reader_loads_neither_torch_nor_rich():
    code = (
        "import sys, json; import elfes.files, elfes.records; from elfes.records import read_events, summarize; "
        "print(json.dumps(sorted(m for m in ('torch', 'rich', 'numpy') if m in sys.modules)))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(loaded) == []


def test_a_failed_write_keeps_the_old_content_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "state.json"
    write_text_atomically(target, '{"state": "running"}')
    with pytest.raises(RuntimeError, match="writer crashed"):
        with atomic_writer(target) as stream:
            stream.write(b'{"state": "fini')
            raise RuntimeError("writer crashed")
    assert target.read_text() == '{"state": "running"}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_replacing_a_symlink_is_atomic_and_a_no_op_when_unchanged(tmp_path):
    (tmp_path / "a").write_text("a")
    (tmp_path / "b").write_text("b")
    assert replace_symlink(tmp_path / "last", "a") is True
    before = os.lstat(tmp_path / "last").st_ino
    assert replace_symlink(tmp_path / "last", "a") is False
    assert os.lstat(tmp_path / "last").st_ino == before
    assert replace_symlink(tmp_path / "last", "b") is True
    assert (tmp_path / "last").read_text() == "b" and os.readlink(tmp_path / "last") == "b"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "last"]


def test_a_folder_that_is_a_file_is_refused_with_its_role(tmp_path):
    target = tmp_path / "runs"
    target.write_text("")
    with pytest.raises(ValueError, match=r"run_dir .*runs is a file, not a folder"):
        check_writable_directory(target, what="run_dir")
    check_writable_directory(tmp_path / "new" / "nested", what="run_dir")
    assert (tmp_path / "new" / "nested").is_dir() and not list((tmp_path / "new" / "nested").iterdir())


def test_a_lock_whose_file_was_removed_while_waited_for_is_taken_on_the_file_there_now(tmp_path):
    """A waiter that gets the flock of a lock file removed meanwhile (a refused submission removes the lock
    files it created) takes the lock again on the file now at the path, so that it and a newcomer, who
    locks that file, never hold the lock at the same time."""
    import fcntl
    import os
    import threading
    import time

    from elfes.files import exclusive_lock

    path = tmp_path / ".submit.lock"
    waiter_holds, release_waiter = threading.Event(), threading.Event()

    def waiter() -> None:
        with exclusive_lock(path):
            waiter_holds.set()
            release_waiter.wait(30)

    with exclusive_lock(path):
        inode = os.stat(path).st_ino
        thread = threading.Thread(target=waiter)
        thread.start()
        deadline = time.monotonic() + 30
        while f":{inode} " not in "".join(line for line in open("/proc/locks") if "->" in line):
            assert time.monotonic() < deadline, "the waiter never blocked on the lock"
            time.sleep(0.01)
        path.unlink()
    assert waiter_holds.wait(30)
    newcomer = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        try:
            fcntl.flock(newcomer, fcntl.LOCK_EX | fcntl.LOCK_NB)
            took_it = True
        except BlockingIOError:
            took_it = False
        assert not took_it, "a newcomer locked the file at the path while the waiter held the lock"
    finally:
        os.close(newcomer)
        release_waiter.set()
        thread.join()
