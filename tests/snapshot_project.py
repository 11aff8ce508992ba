"""A project folder of its own for the code snapshot tests (a git work tree holding
tests/launcher/snapshot_train.py as ``train.py``), and the edit the tests make to it. Shared by the local
and the SLURM tests (``tests/`` is on ``sys.path`` through its conftest)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

TRAIN = Path(__file__).resolve().parent / "launcher" / "snapshot_train.py"


def git(folder: Path, *arguments: str) -> str:
    return subprocess.run(["git", "-C", str(folder), "-c", "user.name=elfes-test", "-c", "user.email=test@elfes",
                           *arguments], check=True, capture_output=True, text=True).stdout.strip()


def make_project(folder: Path) -> Path:
    """A git work tree with the snapshot job as train.py, runs/ and *.bin ignored, one commit."""
    folder.mkdir(parents=True)
    shutil.copy(TRAIN, folder / "train.py")
    (folder / ".gitignore").write_text("runs/\n*.bin\n")
    git(folder, "init", "-q")
    git(folder, "add", "-A")
    git(folder, "commit", "-q", "-m", "the submitted code")
    return folder


def set_scale(project: Path, scale: float) -> None:
    """Edit train.py's constant (what the job computes) in the working tree."""
    train = project / "train.py"
    train.write_text(train.read_text().replace("SCALE = 1.0  #", f"SCALE = {scale}  #"))
