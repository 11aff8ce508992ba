"""A corpus of hostile spec values and a model of how sbatch reads ``#SBATCH`` lines, for the tests of
quoting (tests/launcher/test_hostile_values.py, and against real sbatch tests/slurm/test_hostile_values_on_slurm.py)."""

from __future__ import annotations

# Valid (no control character) but hostile to a shell or to sbatch's directive reader.
HOSTILE = [
    "it's",
    'say "hi"',
    "$(touch pwned-dollar)",
    "`touch pwned-backtick`",
    "#SBATCH --time=1",
    "a # b",
    "back\\slash \\' \\\" \\\\",
    "x; touch pwned-semicolon | cat & wait",
    "' ; touch pwned-quote ; '",
    '" ; touch pwned-double ; "',
    "${HOME} $HOME ~",
    "  leading and trailing  ",
    "--time=1 --mem=1",
    "ünïcødé ✓",
    "*",
]
# Control characters, each refused in every field that reaches a script.
CONTROL = ["x\n touch pwned\n#", "line\r", "tab\there", "nul\x00", "escape\x1b[2J", "delete\x7f", "next\x85line",
           "separator\u2028line"]


def sbatch_arguments(script: str) -> list[str]:
    """The arguments sbatch reads from ``script``'s ``#SBATCH`` lines, by its rules (Slurm 22.05): the
    directives end at the first line that is neither blank nor a comment; in a directive's arguments
    a backslash takes the next character as it is (inside quotes too), single or double quotes group,
    whitespace separates and an unquoted ``#`` starts a comment."""
    arguments: list[str] = []
    for line in script.splitlines()[1:]:
        if line.strip() and not line.startswith("#"):
            break
        if not line.startswith("#SBATCH"):
            continue
        current: str | None = None
        quote, escaped = "", False
        for char in line[len("#SBATCH"):] + " ":
            if escaped:
                current, escaped = (current or "") + char, False
            elif char == "\\":
                current, escaped = current or "", True
            elif quote:
                if char == quote:
                    quote = ""
                else:
                    current += char
            elif char in "'\"":
                current, quote = current or "", char
            elif char == "#" or char.isspace():
                if current is not None:
                    arguments.append(current)
                current = None
                if char == "#":
                    break
            else:
                current = (current or "") + char
        assert not quote, f"sbatch: unmatched {quote} in {line!r}"
    return arguments
