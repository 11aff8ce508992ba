"""mypy checks the engine and the launcher alike (`make test` runs it as pyproject.toml configures it), and a
`# type: ignore` left in either names its error code and says why on its line."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # mypy, which `make test` installs, brings tomli on Python 3.10
    import tomli as tomllib

REPOSITORY = Path(__file__).resolve().parents[1]
FIRST_PARTY = ("elfes", "launcher")
# `# type: ignore[code]  # why`: one error code or more, then a comment that gives the reason.
EXPLAINED_IGNORE = re.compile(r"# type: ignore\[[a-z-]+(, [a-z-]+)*\]  # \S")


def mypy_settings() -> dict[str, Any]:
    return tomllib.loads((REPOSITORY / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]


def test_mypy_checks_the_engine_and_the_launcher_strictly() -> None:
    settings = mypy_settings()
    assert sorted(settings["files"]) == sorted(FIRST_PARTY)
    assert settings["strict"] is True
    for override in settings.get("overrides", []):
        modules = [override["module"]] if isinstance(override["module"], str) else override["module"]
        first_party = [module for module in modules if module.split(".")[0] in FIRST_PARTY]
        assert not first_party, f"pyproject.toml relaxes mypy for {first_party}: {override}"


def test_each_type_ignore_names_its_error_code_and_says_why() -> None:
    unexplained = [
        f"{path.relative_to(REPOSITORY)}:{number}: {line.strip()}"
        for package in FIRST_PARTY
        for path in sorted((REPOSITORY / package).rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if "# type: ignore" in line and not EXPLAINED_IGNORE.search(line)
    ]
    assert not unexplained, "\n".join(unexplained)
