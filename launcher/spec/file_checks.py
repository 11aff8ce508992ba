"""A spec's paths checked against this machine's files, without importing or creating anything:
is the entrypoint's module found (and does it define the function), can the run directory be made.

Torch-free. ``JobSpec`` runs these checks when a spec is loaded with ``check_files`` (the default).
"""

from __future__ import annotations

import ast
import os
import sys
from collections.abc import Sequence
from importlib.machinery import PathFinder
from pathlib import Path


def find_module(module: str, search_path: Sequence[str]) -> str | None:
    """Where ``module`` (dotted) would be imported from, searching ``search_path`` and no parent
    package's ``__init__``: nothing is imported or executed. Returns the file (or folder of a
    namespace package), or None when it is not found."""
    locations: Sequence[str] | None = list(search_path)
    spec = None
    for part in module.split("."):
        if locations is None:
            return None  # the parent is a plain module, not a package
        spec = PathFinder.find_spec(part, list(locations))
        if spec is None:
            return None
        locations = spec.submodule_search_locations
    if spec is None:
        return None
    if spec.origin not in (None, "namespace"):
        return spec.origin
    return next(iter(spec.submodule_search_locations or ()), None)


def _defines(source_file: str, name: str) -> bool | None:
    """Whether the module file binds ``name`` at top level (None: cannot tell without running it)."""
    if not source_file.endswith(".py"):
        return None
    try:
        tree = ast.parse(Path(source_file).read_text(encoding="utf-8"), source_file)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None  # the import in the job reports it with a traceback of its own
    for node in tree.body:
        targets: list[str] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            targets = [node.name]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                targets += [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any(alias.name == "*" for alias in node.names):
                return None
            targets = [(alias.asname or alias.name).split(".")[0] for alias in node.names]
        elif not isinstance(node, (ast.Expr, ast.Pass)):
            return None  # conditional or looped definitions: let the job decide
        if name in targets:
            return True
    return False


def entrypoint_problem(entrypoint: str, workdir: Path) -> str | None:
    """What is wrong with ``entrypoint`` seen from ``workdir`` (None: it looks importable). Nothing
    is imported: the module is found on ``[workdir, *sys.path]`` and its source parsed."""
    module, _, function = entrypoint.partition(":")
    origin = find_module(module, [str(workdir), *[p for p in sys.path if p]])
    if origin is None:
        return (f"module {module} is not found in workdir {workdir} or the installed packages; check the "
                f"module path (dots, no .py) or set workdir to the folder that holds {module.split('.')[0]}")
    if _defines(origin, function) is False:
        return f"module {module} ({origin}) defines no top-level {function}; name the function to call"
    return None


def run_dir_problem(run_dir: Path) -> str | None:
    """Why ``run_dir`` could not be created or written (None: it can). Creates nothing."""
    if run_dir.exists():
        if not run_dir.is_dir():
            return "is a file, not a folder; give a folder path (it is created if missing)"
        if not os.access(run_dir, os.W_OK | os.X_OK):
            return "cannot be written by this user; fix its permissions or give another folder"
        return None
    ancestor = run_dir.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"cannot be created: {ancestor} is a file; give a path below a folder"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"cannot be created: {ancestor} is not writable by this user; give a folder you can write"
    return None
