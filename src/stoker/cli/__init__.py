"""The ``stoker`` command line: one module (or package) per command.

``doctor.py``, ``pack.py``, ``bench/`` and ``demo/`` are the commands; ``_target.py``
finds the dataset TARGET names (doctor, bench), ``_args.py`` holds the option types they
share and ``_output.py`` is what they print through (error lines, progress bars, plots).

Every command exits with the same status for the same outcome:

* 0: done (``stoker doctor``: no check failed; warnings alone are fine); ``stoker`` alone
  prints the help and exits 0, as ``pip`` does;
* 1: the command ran and found a problem (a failed doctor check, nothing ``stoker pack``
  could read, an error while loading the dataset);
* 2: the command could not run as asked, and did nothing: an unknown option, a value out
  of range, a TARGET or SRC that does not exist, or a missing optional package (the line
  names the extra to install, like ``pip install 'stoker[image]'``);
* 130: interrupted with Ctrl-C (``stoker: interrupted`` on stderr, workers stopped);
* 141: the reader of the output went away (``stoker ... | head -1``), as for a command
  ended by SIGPIPE; nothing more is printed (``stoker pack`` still finishes and keeps
  the pack).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import stoker
from stoker.cli._output import EXIT_BROKEN_PIPE, EXIT_INTERRUPTED, say, silence_stdout

__all__ = ["main"]


# One module or package per command, each with add_parser(commands) and run(args) -> int.
COMMANDS = ("demo", "pack", "doctor", "bench")


class _Parser(argparse.ArgumentParser):
    """argparse's parser, except that a closed stdout (``stoker --help | head -0``) raises
    BrokenPipeError for :func:`main` to handle, where argparse would hide it."""

    def _print_message(self, message: str, file: Any = None) -> None:
        if message:
            (file or sys.stderr).write(message)


def _build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = _Parser(
        prog="stoker",
        description="stoker keeps accelerators fed: fast, predictable, observable data loading.",
    )
    parser.add_argument("--version", action="version", version=f"stoker {stoker.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"stoker.cli.{name}").add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the process exit status (see the module's docstring)."""
    from stoker._extras import MissingExtraError

    try:
        try:
            parser = _build_parser()
            args = parser.parse_args(argv)
        except SystemExit:  # argparse's --help, --version and usage errors
            sys.stdout.flush()  # a closed pipe shows here, inside the handler below
            raise
        if args.command is None:
            parser.print_help()
            status = 0
        else:
            status = int(args.run(args) or 0)
        sys.stdout.flush()
        return status
    except MissingExtraError as exc:
        say(str(exc), sys.stderr)
        return 2
    except KeyboardInterrupt:
        # the command's loaders closed their workers on the way out (finally blocks)
        print("stoker: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        silence_stdout()
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
