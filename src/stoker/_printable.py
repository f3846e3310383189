"""User data made safe to print: file names, keys and URLs come from anybody.

A file may be named ``bad\\x1b[2Jname.jpg``: printed as it is, the ``ESC [ 2 J`` in it
clears the screen of whoever reads the output, and other sequences set the terminal's
title, move the cursor or fake lines of a report. :func:`printable` writes every character
that is not printable as Python's ``repr`` escapes it (``\\x1b``, ``\\n``, ``\\u202e``),
and a byte that was not valid in the file system's encoding (held as a lone surrogate by
Python) as the byte (``\\xff``); every other character, backslashes included, stays as it
is, so ordinary names read as they are. :func:`printable_lines` does the same to each line
of a text whose line breaks are its own (a report, a message of several lines).

Every message that names a user's file, key or URL goes through it, and so does every line
the command line prints.
"""

from __future__ import annotations

import os

__all__ = ["printable", "printable_lines"]

_SURROGATES = range(0xDC80, 0xDD00)  # os.fsdecode's stand-ins for undecodable bytes 0x80-0xff


def _escape(char: str) -> str:
    if ord(char) in _SURROGATES:
        return f"\\x{ord(char) - 0xDC00:02x}"
    return repr(char)[1:-1]


def printable(text: str | os.PathLike[str]) -> str:
    """``text`` with each non-printable character escaped as ``repr`` writes it.

    Example:
        >>> printable("photos/bad\\x1b[2Jname.jpg")
        'photos/bad\\\\x1b[2Jname.jpg'
        >>> printable("chat_été.jpg"), printable("two\\nlines")
        ('chat_été.jpg', 'two\\\\nlines')
    """
    text = os.fspath(text)
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else _escape(char) for char in text)


def printable_lines(text: str) -> str:
    """:func:`printable` of each line of ``text``, its ``\\n`` line breaks kept."""
    return "\n".join(printable(line) for line in text.split("\n"))
