"""What every command prints through: error lines, progress bars, plots.

* :func:`usage_error`: ``stoker COMMAND: message`` on stderr, and exit status 2;
* :func:`say`: a line with its control characters escaped (:mod:`stoker._printable`: a
  file name can hold a sequence that clears the screen), which survives characters the
  terminal cannot encode;
* :func:`silence_stdout`: what a command does once the reader of its output went away;
* :func:`progress_bar`: a tqdm bar on stderr when stderr is a terminal, else None (a log
  file or a pipe, or no tqdm: the ``cli`` extra), for the command to fall back to a few
  plain lines;
* :func:`pyplot`: matplotlib on its file-only backend, or None without it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

from stoker._extras import install_hint
from stoker._printable import printable_lines

__all__ = [
    "EXIT_BROKEN_PIPE",
    "EXIT_INTERRUPTED",
    "PLOT_INSTALL",
    "progress_bar",
    "pyplot",
    "say",
    "silence_stdout",
    "usage_error",
]

PLOT_INSTALL = install_hint("matplotlib")  # what a missing plot asks for
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a command ended by Ctrl-C
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as shells report a command whose reader went away


def usage_error(command: str, message: str) -> int:
    """Prints ``stoker COMMAND: message`` on stderr; returns 2, the status for bad usage."""
    say(f"stoker {command}: {message}", sys.stderr)
    return 2


def say(text: str, stream: Any = None, *, flush: bool = True) -> None:
    """print() of lines that hold user data: every character that is not printable (an
    escape sequence in a file name, a newline inside a name) is shown escaped, each line
    break of ``text`` kept; file names the terminal cannot encode survive too."""
    stream = stream or sys.stdout
    text = printable_lines(str(text))
    try:
        print(text, file=stream, flush=flush)
    except UnicodeEncodeError:
        encoding = getattr(stream, "encoding", None) or "ascii"
        print(text.encode(encoding, "backslashreplace").decode(encoding), file=stream, flush=flush)


def silence_stdout() -> None:
    """Points stdout at /dev/null, so later lines and the interpreter's last flush raise no
    second error once the reader of the output went away (``stoker ... | head -1``)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        with contextlib.suppress(OSError, ValueError):  # a stdout without a descriptor
            os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


def progress_bar(total: int, unit: str, desc: str | None = None) -> Any:
    """A tqdm bar on stderr counting ``total`` ``unit``\\ s, or None.

    None when stderr is not a terminal (a bar redraws its line with carriage returns,
    which a log file keeps every one of) or when tqdm is missing.
    """
    isatty = getattr(sys.stderr, "isatty", None)
    if not (callable(isatty) and isatty()):
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit=unit, desc=desc, file=sys.stderr, dynamic_ncols=True)


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend, or None when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
