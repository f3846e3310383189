"""A folder of downloaded shards with a size limit, shared safely by processes.

Each object lives under a name derived from its URL and its *version*: whatever the file
system says identifies what the object holds (an ETag, a version id, a modification time
with the size; see :func:`stoker.storage.remote.version_of`). An object overwritten with
other bytes has another version, so its old copy is never served for it: the new one is
downloaded, and the old one deleted as soon as nobody holds it.

A reader holds an entry while it reads it (a shared ``flock`` on the entry's lock file); a
download holds the entry's download lock exclusively, writes to a new temporary file of
unpredictable name (``mkstemp``) and renames it into place, so no reader ever sees half a
file and two processes never download the same object at once. When a new file would
take the folder past ``max_bytes``, the least recently used entries are deleted first,
except those somebody holds (an exclusive, non-blocking ``flock`` tells): a file in use is
never evicted, so the folder can exceed the limit by the files in use.

The folder may be shared by the processes of one user, never with other users: it is
refused when another user owns it, or when others may write it and it is not sticky (in a
sticky folder such as ``/tmp`` nobody can remove or rename another's files). Within it,
stoker uses only regular files of its own (owned by the user, one name each): it never
follows a symbolic link, opens its files with ``O_NOFOLLOW``, and removes anything else
found at one of its names, with a warning naming it (or, when it cannot be removed,
raises a :class:`PermissionError` naming it). Nothing else in the folder is read or
deleted.

A partial download whose process died (killed, out of memory) is removed by the next
download into the folder: a download's temporary file belongs to the object's download
lock, and a partial file whose download lock nobody holds has no live writer. Partial
files count in :meth:`ShardCache.usage` and in the room a download makes.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import re
import stat
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stoker._validate import check_optional_int

__all__ = ["CachedFile", "ShardCache"]

logger = logging.getLogger("stoker")

# The names in the folder: ENTRY (the object), ENTRY~lock, ENTRY~download and the
# downloads' ENTRY~partial-<pid>-<random>. An entry's name never holds a "~".
_LOCK = "~lock"
_DOWNLOAD_LOCK = "~download"
_PARTIAL = "~partial-"
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")
_ENTRY_NAME = re.compile(r"[0-9a-f]{24}-[0-9a-f]{12}-[A-Za-z0-9._-]*")
_PARTIAL_NAME = re.compile(r"(?P<entry>[0-9a-f]{24}-[0-9a-f]{12}-[A-Za-z0-9._-]*)~partial-\d+-\w+")
_URL_DIGITS = 24
# A lock file is opened read-only (nothing is ever written to it), never through a link,
# without blocking on a FIFO planted at its name, and not inherited by exec'd programs.
_LOCK_FLAGS = os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_OPEN_ATTEMPTS = 3


class CachedFile:
    """A cached object held for reading: the file at :attr:`path` stays until :meth:`close`.

    Attributes:
        path: the local copy.
        url: the object's URL.
        hit: True when the copy was already in the cache (not downloaded now).
        version: what identified the object's version (``'ETag="..."'``, ...), or None
            when the file system gave nothing but the size.
    """

    def __init__(
        self, path: str, url: str, lock_fd: int, hit: bool, version: str | None = None
    ) -> None:
        self.path = path
        self.url = url
        self.hit = hit
        self.version = version
        self._fd: int | None = lock_fd

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # drops the shared lock

    def __enter__(self) -> CachedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"CachedFile({self.url!r} -> {self.path!r})"


@dataclass(frozen=True, slots=True)
class _Found:
    """One of the cache's own files in the folder: an entry or a partial download."""

    path: str
    size: int
    used: float  # st_mtime: when it was last used (entries) or written (partials)
    entry: str  # the entry's name (a partial download's: the entry it becomes)


class ShardCache:
    """A local folder caching downloaded objects, least recently used evicted first.

    Args:
        folder: where the files go (created, readable by its owner only, if missing);
            the processes of one user may share it. It must not be writable by other
            users unless it is sticky (as ``/tmp``); see the module docs.
        max_bytes: the size the folder is kept under, files in use aside; ``None`` for
            no limit, ``0`` to keep only the files in use.

    Raises:
        PermissionError: the folder belongs to another user, or others may write it and
            it is not sticky; the message names it and says how to fix it.

    Example:
        >>> import tempfile
        >>> cache = ShardCache(tempfile.mkdtemp(), max_bytes=10)
        >>> def fetch(dest):
        ...     with open(dest, "wb") as f:
        ...         _ = f.write(b"12345678")
        >>> with cache.get("s3://b/a", 8, fetch, version='ETag="1"') as held:
        ...     with open(held.path, "rb") as f:
        ...         f.read()
        b'12345678'
        >>> cache.get("s3://b/a", 8, fetch, version='ETag="1"').hit
        True
        >>> cache.get("s3://b/a", 8, fetch, version='ETag="2"').hit  # the object changed
        False
    """

    def __init__(self, folder: str | os.PathLike[str], max_bytes: int | None = None) -> None:
        max_bytes = check_optional_int("max_bytes", max_bytes)
        self.folder = os.path.abspath(os.fspath(folder))
        self.max_bytes = max_bytes
        os.makedirs(self.folder, mode=0o700, exist_ok=True)
        _check_folder(self.folder)
        self._evicting = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"folder": self.folder, "max_bytes": self.max_bytes}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["folder"], state["max_bytes"])  # type: ignore[misc]

    def path_for(self, url: str, version: str | None = None) -> str:
        """Where version ``version`` of ``url``'s object lives in the cache."""
        key = f"{os.geteuid()}\0{url}"  # each user's entries apart, in a shared sticky folder
        digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:_URL_DIGITS]
        tag = hashlib.sha256((version or "").encode("utf-8")).hexdigest()[:12]
        tail = _SAFE.sub("_", url.rstrip("/").rpartition("/")[2])[-80:]
        return os.path.join(self.folder, f"{digest}-{tag}-{tail}")

    def contains(self, url: str, version: str | None = None) -> bool:
        """Whether version ``version`` of ``url`` is in the cache."""
        try:
            return _is_own(os.lstat(self.path_for(url, version)))
        except FileNotFoundError:
            return False

    def get(
        self,
        url: str,
        size: int | None,
        fetch: Callable[[str], None],
        *,
        version: str | None = None,
        refresh: bool = False,
    ) -> CachedFile:
        """``url``'s file, held for reading; ``fetch(dest)`` downloads it on a miss.

        A cached copy is used when it is of ``version`` (the object's ETag, version id or
        modification time: what :func:`~stoker.storage.remote.version_of` returns; None
        when the file system gives none) and ``size`` (when known). Otherwise it is
        downloaded, and the copies of the object's other versions nobody holds are
        deleted. ``refresh``: download it even when a copy is cached (its version could
        not be found out).

        Raises:
            PermissionError: something that is not the user's own regular file (a link,
                another user's file) sits at one of the entry's names and cannot be
                removed; the message names it.
        """
        path = self.path_for(url, version)
        # Held shared from here to CachedFile.close(): eviction (an exclusive, non-blocking
        # lock) passes the file by. A shared lock is never upgraded: two readers that missed
        # together would each wait for the other's shared lock to go. The download takes a
        # lock of its own instead, so one process or thread fetches, the others wait for it.
        fd = _open_lock(path + _LOCK)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            if not refresh and _has(path, size):
                os.utime(path, follow_symlinks=False)  # most recently used
                return CachedFile(path, url, fd, hit=True, version=version)
            downloading = _open_lock(path + _DOWNLOAD_LOCK)
            try:
                fcntl.flock(downloading, fcntl.LOCK_EX)  # one download per object
                hit = not refresh and _has(path, size)  # fetched while we waited
                if not hit:
                    self._sweep(size or 0, keep=path)
                    self._download(path, fetch)
            finally:
                os.close(downloading)
            return CachedFile(path, url, fd, hit=hit, version=version)
        except BaseException:
            os.close(fd)
            raise

    def usage(self) -> int:
        """Bytes of the cache's files in the folder: entries and partial downloads."""
        entries, partials = self._scan()
        return sum(found.size for found in entries + partials)

    def _download(self, path: str, fetch: Callable[[str], None]) -> None:
        """``fetch`` into a new temporary file (only ours, its name unpredictable), renamed
        to ``path`` when it succeeded and removed when it did not."""
        prefix = f"{os.path.basename(path)}{_PARTIAL}{os.getpid()}-"
        fd, partial = tempfile.mkstemp(prefix=prefix, dir=self.folder)  # O_EXCL, mode 0600
        os.close(fd)
        try:
            fetch(partial)
            written = os.lstat(partial)
            if not _is_own(written):
                msg = (
                    f"the download {partial} was replaced by {_describe(written)} while it "
                    "was written; it is not used"
                )
                raise PermissionError(msg)
            os.replace(partial, path)  # replaces whatever sits at path, never follows it
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.remove(partial)
            raise

    def _scan(self) -> tuple[list[_Found], list[_Found]]:
        """The cache's own files in the folder: its entries and its partial downloads.
        Anything else (another's file, a link, a name stoker does not make) is left out."""
        entries, partials = [], []
        with os.scandir(self.folder) as found:
            for item in found:
                partial = _PARTIAL_NAME.fullmatch(item.name)
                if partial is None and not _ENTRY_NAME.fullmatch(item.name):
                    continue
                try:
                    info = item.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if not _is_own(info):
                    continue
                if partial is not None:
                    partials.append(
                        _Found(item.path, info.st_size, info.st_mtime, partial["entry"])
                    )
                else:
                    entries.append(_Found(item.path, info.st_size, info.st_mtime, item.name))
        return entries, partials

    def _sweep(self, incoming: int, keep: str) -> None:
        """Before the download of ``keep``: removes the partial downloads whose process died
        and the copies of ``keep``'s other versions nobody holds, then evicts unheld files,
        least recently used first, until ``incoming`` bytes fit under ``max_bytes``."""
        keep_name = os.path.basename(keep)
        with self._evicting:
            entries, partials = self._scan()
            live = 0
            for entry in sorted({p.entry for p in partials}):
                mine = [p for p in partials if p.entry == entry]
                # keep's download lock is ours: any partial of keep is a dead process's
                if entry == keep_name or _nobody_downloading(os.path.join(self.folder, entry)):
                    for found in mine:
                        with contextlib.suppress(FileNotFoundError):
                            os.remove(found.path)
                        logger.info(
                            "removed %s from the shard cache: a partial download whose "
                            "process is gone",
                            found.path,
                        )
                else:
                    live += sum(found.size for found in mine)
            kept = []
            for found in entries:
                stale = found.entry != keep_name and _same_object(found.entry, keep_name)
                if not (stale and _evict(found.path)):
                    kept.append(found)
            if self.max_bytes is None:
                return
            total = live + sum(found.size for found in kept)
            for found in sorted(kept, key=lambda f: f.used):
                if total + incoming <= self.max_bytes:
                    return
                if found.path != keep and _evict(found.path):
                    total -= found.size


def _check_folder(folder: str) -> None:
    """Refuses a cache folder another user could tamper with (see the module docs)."""
    uid = os.geteuid()
    link = os.lstat(folder)
    if stat.S_ISLNK(link.st_mode) and link.st_uid not in (uid, 0):
        msg = (
            f"the cache folder {folder} is a symbolic link owned by uid {link.st_uid}, "
            "another user, who could point it anywhere. Pass a folder of your own."
        )
        raise PermissionError(msg)
    info = os.stat(folder)
    if info.st_uid not in (uid, 0):
        msg = (
            f"the cache folder {folder} is owned by uid {info.st_uid}, another user, who "
            "could replace the files stoker reads there. Pass a folder of your own (it is "
            "created if missing)."
        )
        raise PermissionError(msg)
    mode = stat.S_IMODE(info.st_mode)
    if mode & (stat.S_IWGRP | stat.S_IWOTH) and not mode & stat.S_ISVTX:
        msg = (
            f"the cache folder {folder} (mode 0o{mode:03o}) can be written by other users "
            "and is not sticky: they could replace its files or plant links in it. Remove "
            f"their write permission (chmod go-w {folder}), make it sticky as /tmp is "
            f"(chmod +t {folder}), or pass a folder of your own."
        )
        raise PermissionError(msg)


def _is_own(info: os.stat_result) -> bool:
    """Whether ``info`` (an ``lstat``) is a regular file of ours with one name."""
    return stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid() and info.st_nlink == 1


def _describe(info: os.stat_result) -> str:
    if stat.S_ISLNK(info.st_mode):
        return "a symbolic link"
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file"
    if info.st_uid != os.geteuid():
        return f"a file owned by uid {info.st_uid}, not by you (uid {os.geteuid()})"
    return f"a file with {info.st_nlink} names (hard links)"


def _clear(path: str) -> None:
    """Removes what is at ``path`` unless it is our own regular file (a link planted there,
    another's file, ...), with a warning naming it.

    Raises:
        PermissionError: naming ``path``, when it cannot be removed (it is another user's,
            in a sticky folder).
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if _is_own(info):
        return
    what = _describe(info)
    try:
        os.remove(path)  # the link itself, never what it points to
    except FileNotFoundError:
        return
    except OSError as exc:
        msg = (
            f"{path} in the shard cache is {what}: stoker neither follows nor uses it, and "
            f"cannot remove it ({exc.strerror}). Remove it, or use a cache folder only you "
            "can write."
        )
        raise PermissionError(msg) from None
    logger.warning(
        "removed %s from the shard cache: it was %s, which stoker neither follows nor uses",
        path,
        what,
    )


def _open_lock(path: str) -> int:
    """The descriptor of lock file ``path``, created if missing, never through a link."""
    for _ in range(_OPEN_ATTEMPTS):
        _clear(path)
        try:
            fd = os.open(path, _LOCK_FLAGS, 0o600)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                continue  # a link planted since _clear: removed on the next round
            raise
        if _is_own(os.fstat(fd)):
            return fd
        os.close(fd)
    msg = (
        f"cannot open the lock file {path} of the shard cache: something else keeps "
        "appearing at its name. Use a cache folder only you can write."
    )
    raise PermissionError(msg)


def _has(path: str, size: int | None) -> bool:
    _clear(path)
    try:
        actual = os.lstat(path).st_size
    except FileNotFoundError:
        return False
    return size is None or actual == size


def _same_object(name: str, other: str) -> bool:
    """Whether entries ``name`` and ``other`` are copies of one URL (of two versions)."""
    return name[:_URL_DIGITS] == other[:_URL_DIGITS]


def _nobody_downloading(entry: str) -> bool:
    """Whether no process holds ``entry``'s download lock (so none writes its partials)."""
    try:
        fd = _open_lock(entry + _DOWNLOAD_LOCK)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False
        raise
    finally:
        os.close(fd)
    return True


def _evict(path: str) -> bool:
    """Deletes ``path`` unless someone holds it; True when it was deleted."""
    try:
        fd = _open_lock(path + _LOCK)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return False  # in use
            raise
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
        logger.debug("evicted %s from the shard cache", path)
        return True
    finally:
        os.close(fd)
