"""The import graph of `elfes/` and `launcher/`, read with `ast`: no circle anywhere (imports inside
functions count, those under `if TYPE_CHECKING:` do not), none in the engine even counting those,
imports run one way between the launcher's floors, the engine never imports the launcher, and no
module a login-node command loads at import time reaches torch or numpy."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]
# The launcher's floors, lowest first: a module may import its own floor and the floors below it. The error
# family (errors.py, one module: every floor raises its errors) is the lowest; then the SLURM adapter: every floor
# that asks SLURM (rundir's liveness and up) may import it; the backends (what differs between SLURM and a local
# run) sit below the run directory, whose liveness asks them.
FLOORS = ("errors", "slurm", "spec", "backends", "rundir", "submit", "job", "commands", "cli")
FLAT_FLOORS = ("errors",)  # floors that are one module, not a package
# What `elfes --help`, `status`, `validate`, `logs` and `submit --dry-run` load (the CLI imports each
# verb's module when the verb runs).
LOGIN_NODE_MODULES = (
    "elfes.launcher.cli.main", "elfes.launcher.commands.status", "elfes.launcher.commands.authoring",
    "elfes.launcher.commands.logs", "elfes.launcher.commands.submission", "elfes.launcher.commands.status_wait",
    "elfes.launcher.cli.status", "elfes.launcher.cli.follow",
)
HEAVY = ("torch", "numpy")


def module_files() -> dict[str, Path]:
    """Module name -> file, for every module of the two packages (launcher/ is installed as elfes.launcher)."""
    modules = {}
    for root, prefix in ((REPOSITORY / "elfes", "elfes"), (REPOSITORY / "launcher", "elfes.launcher")):
        for file in root.rglob("*.py"):
            parts = file.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((prefix, *parts))] = file
    return modules


MODULES = module_files()


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


@functools.cache  # every test reads the same graph: each module is parsed once a session, not once a test
def imports(module: str, *, top_level_only: bool = False, type_checking: bool = False) -> frozenset[str]:
    """Names ``module`` imports (resolved to absolute names; a `from X import y` also names X.y), with
    those under `if TYPE_CHECKING:` when ``type_checking``."""
    file = MODULES[module]
    package = module if file.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and _is_type_checking(node) and not type_checking:
                continue
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in node.names)
            if top_level_only and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            for field in ("body", "orelse", "finalbody", "handlers"):
                children = getattr(node, field, None)
                if isinstance(children, list):
                    visit([child for child in children if isinstance(child, ast.AST)])

    visit(ast.parse(file.read_text(encoding="utf-8")).body)
    return frozenset(found)


def project_edges(*, top_level_only: bool = False, type_checking: bool = False) -> dict[str, set[str]]:
    return {module: {name for name in imports(module, top_level_only=top_level_only, type_checking=type_checking)
                     if name in MODULES} - {module}
            for module in MODULES}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges[node]):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(edges):
        if module not in index:
            connect(module)
    return found


def floor(module: str) -> int | None:
    parts = module.split(".")
    if parts[:2] != ["elfes", "launcher"] or len(parts) < 3 or parts[2] not in FLOORS:
        return None
    return FLOORS.index(parts[2])


def test_there_is_no_import_circle():
    assert cycles(project_edges()) == []


def test_the_engine_has_no_circle_even_through_type_annotations():
    # An import under TYPE_CHECKING hides a circle from the interpreter, not from the reader. The trainer
    # is the engine's top: it hands its session the parts it drives, and only the package imports it.
    engine = {module: {target for target in targets if target.startswith("elfes.engine")}
              for module, targets in project_edges(type_checking=True).items() if module.startswith("elfes.engine")}
    assert cycles(engine) == []
    importers_of_the_trainer = sorted(module for module, targets in engine.items() if "elfes.engine.trainer" in targets)
    assert importers_of_the_trainer == ["elfes.engine"]


def test_the_launcher_has_its_floors_and_no_flat_module():
    flat = sorted(p.name for p in (REPOSITORY / "launcher").glob("*.py") if p.name != "__init__.py")
    assert flat == sorted(f"{name}.py" for name in FLAT_FLOORS)
    assert sorted(p.name for p in (REPOSITORY / "launcher").iterdir() if p.is_dir() and p.name != "__pycache__") == \
        sorted(set(FLOORS) - set(FLAT_FLOORS))


@pytest.mark.parametrize("module", sorted(m for m in MODULES if floor(m) is not None))
def test_imports_run_down_the_floors(module):
    upward = sorted(target for target in project_edges()[module]
                    if floor(target) is not None and floor(target) > floor(module))
    assert upward == [], f"{module} (floor {FLOORS[floor(module)]}) imports a higher floor: {upward}"


def test_the_engine_never_imports_the_launcher():
    # `python -m elfes` (elfes/__main__.py) is the command line's second door, not part of the library.
    reverse = sorted((module, target) for module, targets in project_edges().items()
                     if not module.startswith("elfes.launcher") and module != "elfes.__main__" for target in targets
                     if target.startswith("elfes.launcher"))
    assert reverse == []


def test_no_login_node_module_reaches_torch_at_import_time():
    edges = project_edges(top_level_only=True)
    reached, queue = set(), list(LOGIN_NODE_MODULES)
    while queue:
        module = queue.pop()
        if module not in reached:
            reached.add(module)
            parents = [".".join(module.split(".")[:i]) for i in range(2, len(module.split(".")))]
            queue += [*edges[module], *(p for p in parents if p in MODULES)]
    heavy = sorted((module, name) for module in reached for name in imports(module, top_level_only=True)
                   if name.split(".")[0] in HEAVY)
    assert heavy == [], f"login-node modules import {heavy} at import time"


def test_the_graph_reader_sees_real_edges():
    edges = project_edges()
    assert "elfes.launcher.rundir.state" in edges["elfes.launcher.rundir.liveness"]
    assert cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
    assert "torch" in imports("elfes.engine.trainer", top_level_only=True)
    # metrics.py imports accelerate only for its annotations.
    assert "accelerate" in imports("elfes.engine.metrics", type_checking=True)
    assert "accelerate" not in imports("elfes.engine.metrics")


def test_every_relative_import_names_a_module_of_the_project():
    unresolved = []
    for module, file in MODULES.items():
        package = module if file.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*anchor, *([node.module] if node.module else [])])
                if target not in MODULES:
                    unresolved.append(f"{module}:{node.lineno} imports {target}")
    assert unresolved == []


def test_no_test_module_imports_a_test_module_or_a_conftest():
    """Shared test helpers live in plain modules (tests/launching.py, tests/launcher/local_runs.py, ...): several
    folders hold a conftest.py, and whichever pytest imported last would own the name "conftest"; a test module
    imported by another runs its module-level code twice and ties the two files' fates."""
    offending = []
    for file in sorted((REPOSITORY / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] if node.module else [alias.name for alias in node.names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            last = [name.rsplit(".", 1)[-1] for name in names]
            if any(name.startswith("test_") or name == "conftest" for name in last):
                offending.append(f"{file.relative_to(REPOSITORY)}:{node.lineno}")
    assert not offending, offending


def test_no_module_of_the_library_or_the_launcher_is_over_400_lines():
    lengths = {str(file.relative_to(REPOSITORY)): len(file.read_text().splitlines()) for file in module_files().values()}
    assert len(lengths) > 50, "the walk found the modules"
    assert {name: length for name, length in lengths.items() if length > 400} == {}
