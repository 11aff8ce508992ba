"""Packaging: launcher/ installs as elfes.launcher (package-dir) with the templates inside it, the
`elfes` script and `python -m elfes` run the CLI, and every package folder is listed in pyproject."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from launching import REPOSITORY

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11


def pyproject() -> dict:
    return tomllib.loads((REPOSITORY / "pyproject.toml").read_text())


def test_every_package_folder_is_listed_in_pyproject():
    setuptools = pyproject()["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    found = {".".join(path.parent.relative_to(REPOSITORY).parts) for path in (REPOSITORY / "elfes").rglob("__init__.py")}
    found |= {"elfes.launcher" + "".join("." + part for part in path.parent.relative_to(REPOSITORY / "launcher").parts)
              for path in (REPOSITORY / "launcher").rglob("__init__.py")}
    found.add("elfes.launcher.templates")
    assert listed == found, "list new package folders in pyproject.toml [tool.setuptools] packages"
    assert setuptools["package-dir"] == {"elfes.launcher": "launcher", "elfes.launcher.templates": "templates"}
    assert pyproject()["project"]["scripts"] == {"elfes": "elfes.launcher.cli.main:run"}


@pytest.mark.parametrize("where", ["repository_root", "elsewhere"])
def test_elfes_launcher_imports_from_the_repository_root_and_from_elsewhere(tmp_path: Path, where: str):
    cwd = REPOSITORY if where == "repository_root" else tmp_path
    probe = ("import elfes.launcher.cli.main, elfes.launcher.spec.loading, importlib.resources as r; "
             "print(elfes.launcher.__file__); "
             "print(sorted(p.name for p in r.files('elfes.launcher.templates').iterdir() if p.name.endswith('.yaml')))")
    completed = subprocess.run([sys.executable, "-c", probe], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert completed.returncode == 0, completed.stderr
    module_file, templates = completed.stdout.splitlines()
    assert Path(module_file) == REPOSITORY / "launcher" / "__init__.py"
    assert "slurm-multinode.yaml" in templates


def test_the_elfes_script_and_python_m_elfes_run_the_cli(tmp_path: Path):
    script = Path(sys.executable).with_name("elfes")
    for command in ([str(script)], [sys.executable, "-m", "elfes"]):
        completed = subprocess.run([*command, "schema"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert completed.returncode == 0 and '"title": "ELFES job spec"' in completed.stdout, completed.stderr


def test_the_wheel_holds_elfes_launcher_and_its_templates(tmp_path: Path):
    source = tmp_path / "source"
    shutil.copytree(REPOSITORY, source, ignore=shutil.ignore_patterns(
        ".git", "runs", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".ruff_cache", ".benchmarks"))
    completed = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(source)],
        capture_output=True, text=True, timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    (wheel,) = tmp_path.glob("elfes-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("elfes/launcher/cli/main.py", "elfes/launcher/job/runtime.py", "elfes/launcher/templates/local-debug.yaml",
                 "elfes/launcher/templates/slurm-multinode.yaml", "elfes/launcher/templates/train.py", "elfes/records/__init__.py", "elfes/engine/trainer.py",
                 "elfes/__main__.py"):
        assert name in names, name
    assert not any(name.startswith("launcher/") for name in names)  # no top-level `launcher` package
    entry_points = next(name for name in names if name.endswith("entry_points.txt"))
    assert "elfes = elfes.launcher.cli.main:run" in zipfile.ZipFile(wheel).read(entry_points).decode()
