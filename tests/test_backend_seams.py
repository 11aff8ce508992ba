"""The seam between the launcher and its backends (launcher/backends/): every module that names a backend's word
("slurm", "local", ``Executor.SLURM``) is listed, and none outside a backend's own modules branches on it
(compares an executor to it, keys a table by it, offers it as a choice); the registries list the same
backends; and the guide's walk for a third backend names the files that hold them. Read with `ast`."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from elfes.launcher.backends import BACKENDS, Backend, Executor
from elfes.launcher.submit.executors import SUBMISSIONS

REPOSITORY = Path(__file__).resolve().parents[1]
LAUNCHER = REPOSITORY / "launcher"
WORDS = frozenset(executor.value for executor in BACKENDS)
# A backend's own modules, which may choose by its word; each with why it is one.
OWN = {
    "launcher/backends/": "the backends, their protocol and their registry",
    "launcher/slurm/": "every SLURM command and its parsing",
    "launcher/submit/executors.py": "how a job reaches each backend: one Submission per backend (SUBMISSIONS)",
    "launcher/submit/local_controller.py": "the local backend's controller: submitit's executor word for its tasks",
    "launcher/commands/sweep/slurm.py": "a sweep on SLURM: its job arrays",
    "launcher/commands/sweep/local.py": "a sweep on this machine: its scheduler's hand-overs",
}


def _is_word(node: ast.AST) -> bool:
    """A backend's word: the string ("slurm") or the member (``Executor.SLURM``)."""
    if isinstance(node, ast.Constant):
        return node.value in WORDS
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Executor":
        return node.attr in {executor.name for executor in BACKENDS}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_is_word(element) for element in node.elts)
    return False


def _branches(tree: ast.AST) -> list[int]:
    """The lines where ``tree`` chooses by a backend's word: a comparison with it, a table keyed by it, a case of
    it, a command-line choice of it."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(_is_word(operand) for operand in (node.left, *node.comparators)):
            lines.append(node.lineno)
        elif isinstance(node, ast.Dict) and any(key is not None and _is_word(key) for key in node.keys):
            lines.append(node.lineno)
        elif isinstance(node, ast.MatchValue) and _is_word(node.value):
            lines.append(node.lineno)
        elif isinstance(node, ast.keyword) and node.arg == "choices" and _is_word(node.value):
            lines.append(node.value.lineno)
    return lines


def _names_a_word(tree: ast.AST) -> bool:
    return any(_is_word(node) for node in ast.walk(tree) if not isinstance(node, (ast.Tuple, ast.List, ast.Set)))


def _own(relative: str) -> bool:
    return any(relative == place or (place.endswith("/") and relative.startswith(place)) for place in OWN)


def _modules() -> dict[str, ast.Module]:
    return {str(file.relative_to(REPOSITORY)): ast.parse(file.read_text(encoding="utf-8"))
            for file in sorted(LAUNCHER.rglob("*.py"))}


def test_no_module_outside_a_backend_branches_on_its_word() -> None:
    modules = _modules()
    naming = sorted(name for name, tree in modules.items() if _names_a_word(tree))
    assert any(name.startswith("launcher/backends/") for name in naming), "the reader sees the backends' words"
    branching = {name: _branches(tree) for name, tree in modules.items() if not _own(name) and _branches(tree)}
    assert branching == {}, (f"modules outside a backend's own ({', '.join(OWN)}) choose by a backend's word; ask "
                             f"backend_for(executor) instead (launcher/backends/base.py): {branching}")


def test_only_a_backends_own_modules_name_its_member() -> None:
    """Naming ``Executor.SLURM`` is choosing that backend by hand: only its own modules may."""
    by_hand = sorted(name for name, tree in _modules().items() if not _own(name) and any(
        isinstance(node, ast.Attribute) and _is_word(node) for node in ast.walk(tree)))
    assert by_hand == []


def test_the_reader_finds_a_branch_where_there_is_one() -> None:
    assert _branches(ast.parse('if state.executor == "slurm": pass')) == [1]
    assert _branches(ast.parse("every = {Executor.LOCAL: 1.0}")) == [1]
    assert _branches(ast.parse('parser.add_argument("--executor", choices=("auto", "local"))')) == [1]
    assert _branches(ast.parse('errors.append(field_error(("slurm", "signal_delay_s"), 1))')) == []  # a spec section


def test_every_backend_is_registered_once_with_every_duty_and_its_submission() -> None:
    assert set(BACKENDS) == set(Executor) - {Executor.AUTO}
    assert set(SUBMISSIONS) == set(BACKENDS)
    duties = {name for name in vars(Backend) if not name.startswith("_")} | set(Backend.__annotations__)
    assert {"relaunch_exit_code", "requeue", "restart", "queue_starts", "runs_here"} <= duties
    for executor, backend in BACKENDS.items():
        assert backend.executor == executor
        assert [duty for duty in sorted(duties) if not hasattr(backend, duty)] == [], executor


def _defining(name: str) -> str:
    """The module (a path) that assigns ``name`` at its top level."""
    (found,) = [module for module, tree in _modules().items() for node in tree.body
                if isinstance(node, (ast.Assign, ast.AnnAssign)) and name in
                {target.id for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
                 if isinstance(target, ast.Name)}]
    return found


def test_the_guides_walk_for_a_third_backend_names_the_files_that_list_the_backends() -> None:
    """docs/where-things-live.md says which files a third backend touches: the package of the backends (its own
    module) and each module that lists the backends (the Executor, BACKENDS, SUBMISSIONS); no other."""
    guide = (REPOSITORY / "docs" / "where-things-live.md").read_text(encoding="utf-8")
    (bullet,) = [item for item in guide.split("\n- ") if item.startswith("**A backend**")]
    walk = bullet.partition("The command line")[0]
    named = set(re.findall(r"`(launcher/[^`<]*)`", walk))
    executor_module = "launcher/" + "/".join(Executor.__module__.split(".")[2:]) + ".py"
    assert named == {"launcher/backends/", executor_module, _defining("BACKENDS"), _defining("SUBMISSIONS")}, named
