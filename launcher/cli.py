"""The `elfes` command line. Login-node commands never import torch.

The job verbs (`validate`, `submit`, `status`) arrive with the orchestrator's issues; until then
the command only reports its version and usage.
"""

from __future__ import annotations

import argparse
import sys

import elfes


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="elfes",
        description="ELFES: training jobs that survive preemption bitwise-exactly.",
    )
    parser.add_argument("--version", action="version", version=f"elfes {elfes.__version__}")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    parser.parse_args(sys.argv[1:] if argv is None else argv)
    parser.print_help()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
