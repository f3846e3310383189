"""A folder of downloaded shards with a size limit, shared safely by processes.

Each object lives under a name derived from its URL. A reader holds an entry while it
reads it (a shared ``flock`` on the entry's lock file); a download holds it exclusively,
writes to a private temporary name and renames the file into place, so no reader ever
sees half a file and two processes never download the same object at once. When a new
file would take the folder past ``max_bytes``, the least recently used entries are
deleted first, except those somebody holds (an exclusive, non-blocking ``flock`` tells):
a file in use is never evicted, so the folder can exceed the limit by the files in use.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import re
import threading
from collections.abc import Callable
from typing import Any

from stoker._validate import check_optional_int

__all__ = ["CachedFile", "ShardCache"]

logger = logging.getLogger("stoker")

_LOCK = ".lock"
_DOWNLOAD_LOCK = ".download.lock"  # ends like _LOCK: not an entry
_PARTIAL = ".partial"
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


class CachedFile:
    """A cached object held for reading: the file at :attr:`path` stays until :meth:`close`."""

    def __init__(self, path: str, url: str, lock_fd: int, hit: bool) -> None:
        self.path = path
        self.url = url
        self.hit = hit  # True when the file was already in the cache
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


class ShardCache:
    """A local folder caching downloaded objects, least recently used evicted first.

    Args:
        folder: where the files go (created if missing); several processes may share it.
        max_bytes: the size the folder is kept under, files in use aside; ``None`` for
            no limit, ``0`` to keep only the files in use.

    Example:
        >>> import tempfile
        >>> cache = ShardCache(tempfile.mkdtemp(), max_bytes=10)
        >>> def fetch(dest):
        ...     with open(dest, "wb") as f:
        ...         _ = f.write(b"12345678")
        >>> with cache.get("s3://b/a", 8, fetch) as held:
        ...     open(held.path, "rb").read()
        b'12345678'
        >>> cache.get("s3://b/a", 8, fetch).hit
        True
    """

    def __init__(self, folder: str | os.PathLike[str], max_bytes: int | None = None) -> None:
        max_bytes = check_optional_int("max_bytes", max_bytes)
        self.folder = os.path.abspath(os.fspath(folder))
        self.max_bytes = max_bytes
        os.makedirs(self.folder, exist_ok=True)
        self._evicting = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"folder": self.folder, "max_bytes": self.max_bytes}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["folder"], state["max_bytes"])  # type: ignore[misc]

    def path_for(self, url: str) -> str:
        """Where ``url``'s file lives in the cache."""
        digest = hashlib.sha256(url.encode("utf-8")).hexdigest()[:24]
        tail = _SAFE.sub("_", url.rstrip("/").rpartition("/")[2])[-80:]
        return os.path.join(self.folder, f"{digest}-{tail}")

    def contains(self, url: str) -> bool:
        return os.path.isfile(self.path_for(url))

    def get(self, url: str, size: int | None, fetch: Callable[[str], None]) -> CachedFile:
        """``url``'s file, held for reading; ``fetch(dest)`` downloads it on a miss.

        ``size`` (when known) must match a cached file, else it is downloaded again.
        """
        path = self.path_for(url)
        # Held shared from here to CachedFile.close(): eviction (an exclusive, non-blocking
        # lock) passes the file by. A shared lock is never upgraded: two readers that missed
        # together would each wait for the other's shared lock to go. The download takes a
        # lock of its own instead, so one process or thread fetches, the others wait for it.
        fd = os.open(path + _LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            if _has(path, size):
                os.utime(path)  # most recently used
                return CachedFile(path, url, fd, hit=True)
            downloading = os.open(path + _DOWNLOAD_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(downloading, fcntl.LOCK_EX)  # one download per object
                hit = _has(path, size)  # another reader fetched it while we waited
                if not hit:
                    self._make_room(size or 0, keep=path)
                    partial = f"{path}{_PARTIAL}-{os.getpid()}-{threading.get_ident()}"
                    fetch(partial)
                    os.replace(partial, path)
            finally:
                os.close(downloading)
            return CachedFile(path, url, fd, hit=hit)
        except BaseException:
            os.close(fd)
            raise

    def usage(self) -> int:
        """Bytes of cached files in the folder."""
        return sum(size for _, size, _ in self._entries())

    def _entries(self) -> list[tuple[str, int, float]]:
        found = []
        with os.scandir(self.folder) as entries:
            for entry in entries:
                if entry.name.endswith(_LOCK) or _PARTIAL in entry.name:
                    continue
                with contextlib.suppress(FileNotFoundError):
                    info = entry.stat()
                    found.append((entry.path, info.st_size, info.st_mtime))
        return found

    def _make_room(self, incoming: int, keep: str) -> None:
        """Evicts unheld files, least recently used first, until ``incoming`` bytes fit."""
        if self.max_bytes is None:
            return
        with self._evicting:
            entries = sorted(self._entries(), key=lambda e: e[2])
            total = sum(size for _, size, _ in entries)
            for path, size, _ in entries:
                if total + incoming <= self.max_bytes:
                    return
                if path != keep and _evict(path):
                    total -= size


def _has(path: str, size: int | None) -> bool:
    try:
        actual = os.path.getsize(path)
    except FileNotFoundError:
        return False
    return size is None or actual == size


def _evict(path: str) -> bool:
    """Deletes ``path`` unless someone holds it; True when it was deleted."""
    try:
        fd = os.open(path + _LOCK, os.O_RDWR | os.O_CREAT, 0o644)
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
