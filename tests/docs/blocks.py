"""The code blocks of the README and the guides, each named by the `<!-- doc-test: NAME -->` comment
above it, so that a test can run exactly what a reader copies."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
DOCUMENTS = (REPOSITORY / "README.md", *sorted((REPOSITORY / "docs").glob("*.md")),
             REPOSITORY / "examples" / "charlm" / "README.md", REPOSITORY / "examples" / "vision" / "README.md")
_BLOCK = re.compile(r"(?:<!-- doc-test: (?P<name>[\w./-]+) -->\n)?```(?P<language>[\w-]*)\n(?P<text>.*?)```", re.S)


@dataclass(frozen=True)
class Block:
    name: str | None  # None: no doc-test comment above it
    language: str
    text: str
    document: Path

    def commands(self) -> list[str]:
        """A shell block's commands, comments removed."""
        return [line.split("  #", 1)[0].strip() for line in self.text.splitlines()
                if line.strip() and not line.lstrip().startswith("#")]


def all_blocks() -> list[Block]:
    found = []
    for document in DOCUMENTS:
        for match in _BLOCK.finditer(document.read_text(encoding="utf-8")):
            found.append(Block(match["name"], match["language"], match["text"], document))
    return found


def block(name: str) -> Block:
    (found,) = [candidate for candidate in all_blocks() if candidate.name == name]
    return found
