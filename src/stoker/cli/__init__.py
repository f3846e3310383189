"""The ``stoker`` command line: one module per command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import stoker

__all__ = ["main"]


def _build_parser() -> argparse.ArgumentParser:
    from stoker.cli import demo

    parser = argparse.ArgumentParser(
        prog="stoker",
        description="stoker keeps accelerators fed: fast, predictable, observable data loading.",
    )
    parser.add_argument("--version", action="version", version=f"stoker {stoker.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the process exit status."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    return int(args.run(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
