"""What a job spec may hold: how big it may be (its file, its nesting, what its YAML aliases expand
to) and which characters a value that reaches a batch script or a shell may have.

Real specs are a few kilobytes and a handful of levels deep; these limits are far above that and far
below what would exhaust a login node. launcher/spec/loading.py enforces them while the YAML is composed,
before any Python object is built, and again on every mapping handed to validation (a spec assembled
in Python or changed by overrides); the spec as recorded in the run directory (``job.yaml``, every
alias expanded and every default written out) must fit the file limit too, so that every later
command can read it back.

Every value that reaches the sbatch script or a shell (paths, SLURM options, setup lines, env values)
must be one line of printable text: :func:`control_character_problem` says why one is not.

Torch-free.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..errors import EXIT_BAD_INPUT, ElfesError

MAX_SPEC_BYTES = 1024 * 1024
"""A spec file, and the spec as recorded in the run directory: at most 1 MiB."""
MAX_SPEC_DEPTH = 64
"""Mappings and lists nested in one another: at most 64 levels (the top-level mapping is level 1)."""
MAX_SPEC_VALUES = 100_000
"""Mappings, lists, keys and values of a spec, every alias (``*name``) expanded: at most 100,000."""
MAX_SPEC_TEXT = MAX_SPEC_BYTES
"""Characters of the spec's keys and values, every alias expanded: at most what a spec file may hold."""

LIMITS_TEXT = (f"a job spec is at most {MAX_SPEC_BYTES // 1024 // 1024} MiB, {MAX_SPEC_DEPTH} levels deep and "
               f"{MAX_SPEC_VALUES:,} values, aliases expanded")


@dataclass(frozen=True)
class Size:
    """What a spec expands to: ``values`` (collections, keys, scalars), ``text`` (characters of its
    scalars) and ``depth`` (levels of nested collections), every shared part counted where it is used."""

    values: int
    text: int
    depth: int


class CyclicSpec(ElfesError, ValueError):
    """A mapping or list (``part``) that contains itself (a YAML alias inside its own anchor)."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, part: Any) -> None:
        super().__init__("a mapping or list contains itself (an alias *name inside its own anchor &name)")
        self.part = part


def measure(root: Any, children: Callable[[Any], Iterable[Any] | None], text: Callable[[Any], int]) -> Size:
    """The expanded :class:`Size` of the graph below ``root``, in time linear in its distinct parts
    (a part reached twice is walked once and counted twice). ``children(part)`` is None for a scalar,
    whose ``text(part)`` counts. No recursion: any depth is measured. Raises :class:`CyclicSpec`."""
    sizes: dict[int, Size] = {}
    open_parts: set[int] = set()  # on the path from the root to the part being walked
    stack: list[tuple[Any, list[Any] | None]] = [(root, None)]
    while stack:
        part, walked = stack.pop()
        key = id(part)
        if walked is not None:  # every child is measured: this part's size is theirs plus one
            below = [sizes[id(child)] for child in walked]
            sizes[key] = Size(1 + sum(size.values for size in below), sum(size.text for size in below),
                              1 + max((size.depth for size in below), default=0))
            open_parts.discard(key)
            continue
        if key in sizes:
            continue
        if key in open_parts:
            raise CyclicSpec(part)
        parts = children(part)
        if parts is None:
            sizes[key] = Size(1, text(part), 0)
            continue
        parts = list(parts)
        open_parts.add(key)
        stack.append((part, parts))
        stack.extend((child, None) for child in parts if id(child) not in sizes)
    return sizes[id(root)]


def size_problem(size: Size) -> str | None:
    """Which limit ``size`` passes, in words (None: it fits)."""
    if size.depth > MAX_SPEC_DEPTH:
        return f"mappings and lists nested {size.depth} levels deep, above the limit of {MAX_SPEC_DEPTH}"
    if size.values > MAX_SPEC_VALUES:
        return f"{size.values:,} values with its aliases expanded, above the limit of {MAX_SPEC_VALUES:,}"
    if size.text > MAX_SPEC_TEXT:
        return (f"{size.text:,} characters of text with its aliases expanded, above the limit of "
                f"{MAX_SPEC_TEXT:,}")
    return None


def _data_children(part: Any) -> Iterable[Any] | None:
    if isinstance(part, dict):
        return [*part.keys(), *part.values()]
    if isinstance(part, (list, tuple, set, frozenset)):
        return part
    return None


def _data_text(part: Any) -> int:
    return len(part) if isinstance(part, (str, bytes)) else 0


def data_size(data: Any) -> Size:
    """The expanded :class:`Size` of plain data (dicts, lists, scalars), shared objects counted each time."""
    return measure(data, _data_children, _data_text)


# C0 and C1 controls, DEL, and the Unicode line and paragraph separators: each would end or garble a line.
_CONTROL_CHARACTER = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_CONTROL_NAMES = {"\n": "a newline (\\n)", "\r": "a carriage return (\\r)", "\t": "a tab (\\t)",
                  "\x00": "a NUL character (\\0)"}


def control_character_problem(text: str) -> str | None:
    """What is wrong with ``text`` if it holds a control character (None: it holds none), in words."""
    found = _CONTROL_CHARACTER.search(text)
    if found is None:
        return None
    character = found.group()
    name = _CONTROL_NAMES.get(character, f"the control character U+{ord(character):04X}")
    where = "at its end" if found.end() == len(text) else f"at character {found.start() + 1}"
    block = " (a YAML block scalar, | or >, ends with one: use |- or >-, or a plain string)" if (
        character == "\n" and text.endswith("\n")) else ""
    return (f"contains {name} {where}{block}; values that reach a batch script or a shell must be one line of "
            "printable text")
