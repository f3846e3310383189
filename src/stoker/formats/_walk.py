"""Walking a folder tree once: every directory is entered once, by device and inode.

``os.walk(top, followlinks=True)`` enters a directory again through every symbolic link that
reaches it, so a link to an ancestor (``data/sub/loop -> ..``) lists each file once more per
level, until the path grows too long for the kernel. Here a directory is identified by its
``(st_dev, st_ino)``: the directories reached without a link are walked first, then the
directory links in sorted order, each only if its target has not been walked yet. A file is
therefore listed once, under its own path when the tree has one.

A walk can *claim* the directories it enters for an owner (ImageFolder's owners are its
classes): reaching a directory that another owner claimed raises, because its files would be
read twice, under two owners (a link inside one class folder to the dataset root or to
another class would otherwise give their images the wrong label).

Names starting with a dot are skipped, like the hidden files they usually are.

``glob.glob(pattern, recursive=True)`` follows directory links under ``**`` the same way (a
loop makes it run for minutes), so :func:`glob_files` walks the pattern's fixed prefix once
and matches each file against the pattern, segment by segment.
"""

from __future__ import annotations

import fnmatch
import glob
import logging
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from stoker._errors import DatasetError

__all__ = ["Claim", "WalkedFile", "claim_directory", "glob_files", "walk_files"]

logger = logging.getLogger("stoker")

Identity = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Claim:
    """Who first reached a directory (``owner``, described for messages) and by which path."""

    owner: str | None
    path: str


@dataclass(frozen=True, slots=True)
class WalkedFile:
    """A file found by :func:`walk_files`: its folder relative to the walk's top, name and path."""

    folder: str
    name: str
    path: str


def _identity(path: str) -> Identity:
    stat = os.stat(path)
    return stat.st_dev, stat.st_ino


def claim_directory(
    path: str, claims: dict[Identity, Claim], owner: str | None, identity: Identity | None = None
) -> bool:
    """Claims ``path`` for ``owner``; False if it was walked already (by this owner).

    Raises:
        DatasetError: another owner claimed the directory: its files would be read twice.
    """
    identity = _identity(path) if identity is None else identity
    claim = claims.get(identity)
    if claim is None:
        claims[identity] = Claim(owner, path)
        return True
    if claim.owner == owner:
        return False
    msg = (
        f"the folder {path!r} is the same folder as {claim.path!r} (reached through a symbolic "
        f"link): it would be read both as {owner} and as {claim.owner}, its files under both. "
        "Remove or replace the link."
    )
    raise DatasetError(msg)


def walk_files(
    top: str,
    *,
    relative: str = "",
    keep: Callable[[str], bool] | None = None,
    claims: dict[Identity, Claim] | None = None,
    owner: str | None = None,
) -> list[WalkedFile]:
    """Every file under ``top`` (following directory links, each directory once), unsorted.

    Args:
        top: the folder to walk.
        relative: the name ``top`` has in :attr:`WalkedFile.folder` (default: ``""``).
        keep: which file names to list (default: all but hidden ones).
        claims: directories claimed so far, shared between walks that must not overlap.
        owner: what this walk reads, as messages name it (for example ``"class 'cat'"``).

    A link to a file, and a link whose target is missing, are listed like files: reading
    them says what is wrong. A FIFO, socket or device is left out, with a warning.
    """
    claims = {} if claims is None else claims
    found: list[WalkedFile] = []
    claim_directory(top, claims, owner)  # the caller may have claimed it already
    real = [(top, relative)]  # directories reached without a link
    links: list[tuple[str, str]] = []  # directory links, walked after the real tree
    while real or links:
        if real:
            directory, folder = real.pop()
        else:
            directory, folder = links.pop(0)
            if not claim_directory(directory, claims, owner):
                continue
        with os.scandir(directory) as scan:
            entries = sorted(scan, key=lambda entry: entry.name)
        for entry in entries:
            if entry.name.startswith("."):
                continue
            child = f"{folder}/{entry.name}" if folder else entry.name
            if entry.is_dir():
                if entry.is_symlink():
                    links.append((entry.path, child))
                    continue
                identity = (entry.stat(follow_symlinks=False).st_dev, entry.inode())
                if claim_directory(entry.path, claims, owner, identity):
                    real.append((entry.path, child))
            elif keep is None or keep(entry.name):
                if entry.is_file() or entry.is_symlink():
                    found.append(WalkedFile(folder, entry.name, entry.path))
                else:  # reading a FIFO blocks, a device never ends
                    logger.warning(
                        "left out %r: it is a FIFO, socket or device, not a file", entry.path
                    )
    return found


def glob_files(pattern: str) -> list[str]:
    """The files matching a glob pattern, sorted; ``**`` matches any number of folders, each
    folder walked once whatever its links (see :func:`walk_files`)."""
    parts = pattern.split("/")
    if "**" not in parts:
        return sorted(path for path in glob.glob(pattern) if os.path.isfile(path))
    fixed = 0
    while fixed < len(parts) and not glob.has_magic(parts[fixed]):
        fixed += 1
    root = "/".join(parts[:fixed]) or ("/" if pattern.startswith("/") else ".")
    if not os.path.isdir(root):
        return []
    rest = [None if part == "**" else re.compile(fnmatch.translate(part)) for part in parts[fixed:]]
    found = []
    for walked in walk_files(root):
        segments = [*walked.folder.split("/"), walked.name] if walked.folder else [walked.name]
        if _matches(rest, segments):
            found.append(walked.path if parts[:fixed] else os.path.relpath(walked.path, root))
    return sorted(found)


def _matches(patterns: Sequence[re.Pattern[str] | None], segments: Sequence[str]) -> bool:
    """Whether path ``segments`` match the pattern's (None stands for ``**``: any number)."""
    if not patterns:
        return not segments
    head, tail = patterns[0], patterns[1:]
    if head is None:
        return any(_matches(tail, segments[skip:]) for skip in range(len(segments) + 1))
    return (
        bool(segments) and head.fullmatch(segments[0]) is not None and _matches(tail, segments[1:])
    )
