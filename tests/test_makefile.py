"""The Makefile's two commands: `make run` and `make test` set up .venv, then run what the README says."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]


def make(*arguments: str, cwd: Path) -> subprocess.CompletedProcess:
    assert shutil.which("make"), "make is not installed: apt-get install make (.ci/run installs it)"
    return subprocess.run(["make", "--no-print-directory", *arguments], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def bare_checkout(tmp_path: Path) -> Path:
    """The files make reads, without any .venv."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(REPOSITORY / name, checkout / name)
    return checkout


def test_run_and_test_create_the_venv_install_torch_first_then_run_the_readme_commands(tmp_path: Path) -> None:
    checkout = bare_checkout(tmp_path)
    for target, last in (("run", ".venv/bin/elfes submit examples/quickstart/job.yaml --follow"),
                         ("test", ".venv/bin/python -m pytest -q")):
        plan = make("-n", target, cwd=checkout)
        assert plan.returncode == 0, plan.stderr
        lines = plan.stdout.splitlines()
        venv = next(index for index, line in enumerate(lines) if "python3 -m venv .venv" in line)
        torch = next(index for index, line in enumerate(lines) if '"torch==2.13.0"' in line)
        project = lines.index('.venv/bin/python -m pip install --quiet -e ".[test]"')
        assert venv < torch < project < lines.index(last) == len(lines) - 1
        if target == "test":  # the checks first: a finding fails `make test` before the suite starts
            assert lines[-3:] == [".venv/bin/python -m ruff check .", ".venv/bin/python -m mypy", last]
    assert not (checkout / ".venv").exists()


def test_a_python_older_than_3_10_is_refused_by_name_and_nothing_is_created(tmp_path: Path) -> None:
    checkout = bare_checkout(tmp_path)
    fake = tmp_path / "python3.8"
    fake.write_text("#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'Python 3.8.10'; exit 0; fi\nexit 1\n")
    fake.chmod(0o755)
    completed = make("test", f"PYTHON={fake}", cwd=checkout)
    assert completed.returncode != 0
    assert f"ELFES needs Python 3.10 or newer; '{fake}' is Python 3.8.10" in completed.stdout
    assert "make test PYTHON=python3.12" in completed.stdout
    assert not (checkout / ".venv").exists()
