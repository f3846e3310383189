"""The ``stoker`` command line: one module (or package) per command.

``doctor.py``, ``pack.py``, ``bench/`` and ``demo/`` are the commands; ``_target.py``
finds the dataset TARGET names (doctor, bench) and ``_output.py`` is what they print
through (error lines, progress bars, plots).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import stoker

__all__ = ["main"]


# One module or package per command, each with add_parser(commands) and run(args) -> int.
COMMANDS = ("demo", "pack", "doctor", "bench")


def _build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = argparse.ArgumentParser(
        prog="stoker",
        description="stoker keeps accelerators fed: fast, predictable, observable data loading.",
    )
    parser.add_argument("--version", action="version", version=f"stoker {stoker.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"stoker.cli.{name}").add_parser(commands)
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
