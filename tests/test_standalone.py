"""The project stands alone: no file of it names a path outside the repository (notes, checkouts)."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
# Spelled in pieces so that this file does not match itself.
OUTSIDE = ("../" + "shared", "shared" + "/notes", "/" + "work/")


def project_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPOSITORY, capture_output=True,
                            text=True, check=True).stdout.split("\n")
    return [REPOSITORY / name for name in listed if name and (REPOSITORY / name).is_file()]


def test_no_project_file_names_a_path_outside_the_repository():
    found = []
    for path in project_files():
        text = path.read_bytes().decode(errors="replace")
        found += [f"{path.relative_to(REPOSITORY)}: {outside}" for outside in OUTSIDE if outside in text]
    assert not found, "name only the repository's own files:\n" + "\n".join(found)
