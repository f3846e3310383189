"""Remote files for the readers: URLs, listing, and local copies through the cache.

:class:`Storage` is what a reader keeps for its URLs: the ``storage_options`` given to
fsspec, the cache, the prefetch depth and the retry policy. It pickles without its
connections, so each worker process opens its own. :func:`open_files` gives a reader the
local copy of each of its remote files, in the order the reader's shard reads them, the
next ``prefetch`` of them downloading in the background.

A local copy is of the object's version a reader saw: the one its listing gave, or, for
an object it did not list (a URL in a list), the one the object's ``info()`` gave when the
reader first opened it. :func:`version_of` tells what identifies a version.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import re
import shutil
import tempfile
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stoker._extras import require
from stoker._validate import check_int
from stoker.sharding import shard_for_worker
from stoker.storage.cache import CachedFile, ShardCache
from stoker.storage.fetch import RetryPolicy, download, retried
from stoker.storage.prefetch import Prefetcher

__all__ = ["Identity", "LocalCopies", "Storage", "is_remote", "open_files", "version_of"]

logger = logging.getLogger("stoker")

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_S3 = ("s3", "s3a")
_HTTP = ("http", "https")
_GLOB_CHARS = frozenset("*?[")
# What the file systems' info() says of an object's version, in the order they are used:
# a tag of the bytes (S3, GCS, Azure, HTTP), an id of the version (a versioned S3 bucket,
# GCS's generation), then the time it was written, taken with its size (a local or network
# file system, an HTTP server without ETag).
_TAG_FIELDS = ("ETag", "etag", "md5Hash", "Content-MD5", "Digest")
_ID_FIELDS = ("VersionId", "version_id", "generation")
_TIME_FIELDS = ("mtime", "LastModified", "last_modified", "Last-Modified", "updated")


def version_of(info: Mapping[str, Any]) -> str | None:
    """What identifies the version of the object an fsspec ``info()`` (or listing) entry
    describes: ``'ETag="..."'``, ``'VersionId=...'``, ``'mtime=...,size=...'``, ...; None
    when it gives nothing but a size.

    Example:
        >>> version_of({"size": 3, "ETag": '"900150983cd24fb0d6963f7d28e17f72"'})
        'ETag="900150983cd24fb0d6963f7d28e17f72"'
        >>> version_of({"size": 3, "mtime": 1700000000.5})
        'mtime=1700000000.5,size=3'
        >>> version_of({"size": 3}) is None
        True
    """
    for field in _TAG_FIELDS + _ID_FIELDS:
        value = info.get(field)
        if value not in (None, ""):
            return f"{field}={value}"
    for field in _TIME_FIELDS:
        value = info.get(field)
        if isinstance(value, datetime.datetime):  # S3 gives it in UTC or local time
            value = value.timestamp()
        if value not in (None, ""):
            return f"{field}={value},size={info.get('size')}"
    return None


@dataclass(frozen=True, slots=True)
class Identity:
    """What a reader knows of one object: its size and version (see :func:`version_of`)
    when known, and whether they could be found out at all (``known``: False when its
    ``info()`` failed, so a cached copy cannot be trusted)."""

    size: int | None
    version: str | None
    known: bool = True


def is_remote(spec: Any) -> bool:
    """Whether ``spec`` is a URL (``s3://``, ``gs://``, ``az://``, ``http(s)://``, ...) that is
    not a plain local ``file://`` path."""
    if not isinstance(spec, str):
        return False
    return ("::" in spec or bool(_SCHEME.match(spec))) and not spec.startswith("file://")


def _remove_tree(path: str, owner_pid: int) -> None:
    """Removes ``path``, in the process that made it only: a process forked from it inherits
    the finalizer, and its garbage or exit must not delete its parent's files."""
    if os.getpid() == owner_pid:
        shutil.rmtree(path, ignore_errors=True)


def _free_bytes(folder: str) -> int:
    try:
        return int(shutil.disk_usage(folder).free)
    except OSError:
        return 0


class Storage:
    """How a reader reaches its remote files.

    Args:
        storage_options: keyword arguments of the fsspec file system (``endpoint_url``,
            credentials, ``anon``, ...); for S3 ``{"endpoint_url": ...}`` is passed as
            ``client_kwargs`` when given at the top level.
        cache: a folder (str or path: no size limit), a :class:`ShardCache` (a size
            limit), or ``None``: a private temporary folder, removed when the reader goes
            away, keeping only the files in use and those prefetched (or, for a packed
            dataset, see :meth:`keep_shards`, every shard read, up to a bound).
        prefetch: how many files to download ahead of the one being read.
        retries: requests per object (an int: the attempts) or a :class:`RetryPolicy`,
            which also sets each request's timeouts. It covers listing and downloads; the
            file system's own retries are turned off (for S3 botocore's and s3fs's, unless
            ``config_kwargs`` sets ``retries``), so the server sees as many requests as the
            policy allows.
    """

    def __init__(
        self,
        storage_options: dict[str, Any] | None = None,
        cache: str | os.PathLike[str] | ShardCache | None = None,
        prefetch: int = 2,
        retries: RetryPolicy | int = 5,
    ) -> None:
        if storage_options is not None and not isinstance(storage_options, dict):
            msg = (
                "storage_options must be a dict of file system options or None, got "
                f"{storage_options!r}"
            )
            raise TypeError(msg)
        prefetch = check_int("prefetch", prefetch, hint="files downloaded ahead")
        if cache is not None and not isinstance(cache, ShardCache):
            cache = ShardCache(cache)
        self.storage_options = dict(storage_options or {})
        self.cache = cache
        self.prefetch = prefetch
        self.retry = RetryPolicy.of(retries)
        self.sizes: dict[str, int] = {}  # listed sizes, checked after each download
        self.versions: dict[str, str | None] = {}  # listed versions (see version_of)
        self.private: ShardCache | None = None  # see keep_shards: shared by the workers
        self._kept = False
        self._local: dict[str, Any] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_local"] = {}
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def configured(self) -> bool:
        """Whether the user asked for anything beyond the defaults (options or a cache)."""
        return bool(self.storage_options) or self.cache is not None

    # -- file systems ----------------------------------------------------------------
    def filesystem(self, url: str) -> Any:
        """The fsspec file system for ``url``'s protocol, one per process."""
        fsspec = require("fsspec", "reading from object storage", f"to read {url}")
        protocol = url.split("://", 1)[0] if "://" in url else "file"
        key = (os.getpid(), protocol)
        with self._lock:
            fs = self._local.get(repr(key))
            if fs is None:
                if protocol in _S3:
                    require("s3fs", "reading from S3", f"to read {url}")
                options = _options_for(protocol, self.storage_options, self.retry)
                if "::" in url:
                    fs = fsspec.core.url_to_fs(url, **options)[0]
                else:
                    fs = fsspec.filesystem(protocol, skip_instance_cache=True, **options)
                if protocol in _S3 and isinstance(getattr(fs, "retries", None), int):
                    fs.retries = 1  # s3fs's own loop (5 tries of each call, of each body read)
                self._local[repr(key)] = fs
        return fs

    def local_cache(self) -> ShardCache:
        """The cache downloads go to (a private temporary one without ``cache``)."""
        if self.cache is not None:
            return self.cache
        if self.private is not None:
            return self.private
        with self._lock:
            key = f"temp-{os.getpid()}"
            cache = self._local.get(key)
            if cache is None:
                folder = tempfile.mkdtemp(prefix="stoker-shards-")
                cache = ShardCache(folder, max_bytes=0)
                weakref.finalize(self, _remove_tree, folder, os.getpid())
                self._local[key] = cache
        return cache  # type: ignore[no-any-return]

    def keep_shards(self, total_bytes: int, owner: str) -> ShardCache:
        """The cache of a reader that reads its shards in any order (a packed dataset).

        Without ``cache``: a private temporary folder, made now (in the process that opens
        the reader) and shared by its worker processes, keeping every shard downloaded,
        up to ``total_bytes`` (the reader's shards) or half the free space of the
        temporary folder's disk, whichever is smaller; so an epoch in any order downloads
        each shard once, and later epochs reuse them. It is removed when the reader goes
        away. When the bound, or a given cache's ``max_bytes``, is smaller than
        ``total_bytes``, a warning names the sizes: shards evicted before the epoch is
        over are downloaded again when they are read again.
        """
        if self.cache is not None:
            limit = self.cache.max_bytes
            if limit is not None and limit < total_bytes and not self._kept:
                _warn_small(owner, total_bytes, limit, f"the cache's max_bytes ({_gib(limit)})")
            self._kept = True  # told once, not again by each worker that reopens the reader
            return self.cache
        if self.private is None:
            folder = tempfile.mkdtemp(prefix="stoker-shards-")
            free = _free_bytes(folder)
            bound = min(total_bytes, free // 2)
            if bound < total_bytes:
                why = f"half the free space of {os.path.dirname(folder)} ({_gib(bound)})"
                _warn_small(owner, total_bytes, bound, why)
            self.private = ShardCache(folder, max_bytes=bound)
            weakref.finalize(self, _remove_tree, folder, os.getpid())
        return self.private

    # -- listing -----------------------------------------------------------------------
    def list_urls(self, spec: str, *, owner: str, suffixes: Sequence[str] | None) -> list[str]:
        """The objects ``spec`` names, sorted: one object, a prefix (directory) or a pattern."""
        fs = self.filesystem(spec)
        path = fs._strip_protocol(spec)

        def ask(call: Callable[[], Any]) -> Any:
            passed_on = (FileNotFoundError,)
            return retried(call, url=spec, verb="list", policy=self.retry, passed_on=passed_on)

        if _GLOB_CHARS & set(path):
            found = ask(lambda: fs.glob(path, detail=True))
        else:
            try:
                info = ask(lambda: fs.info(path))
            except FileNotFoundError:
                msg = f"{owner}: {spec!r} names no object and no prefix holding any (no such file)"
                raise FileNotFoundError(msg) from None
            if info.get("type") == "directory":
                found = ask(lambda: fs.find(path, detail=True))
                if suffixes:
                    lowered = tuple(s.lower() for s in suffixes)
                    found = {k: v for k, v in found.items() if k.lower().endswith(lowered)}
            else:
                found = {path: info}
        urls = []
        for name, info in sorted(found.items()):
            if info.get("type") == "directory" or name.rstrip("/").rpartition("/")[2].startswith(
                "."
            ):
                continue
            url = fs.unstrip_protocol(name) if "://" not in name else name
            self._note(url, info)
            urls.append(url)
        return urls

    def _note(self, url: str, info: Mapping[str, Any]) -> None:
        """Records the size and version a listing or ``info()`` gave of ``url``."""
        if isinstance(info.get("size"), int):
            self.sizes[url] = info["size"]
        self.versions[url] = version_of(info)

    # -- fetching --------------------------------------------------------------------
    def identity(self, url: str, size: int | None = None) -> Identity:
        """``url``'s size (the listed one, else ``size``, else its ``info()``'s) and version:
        the listed one, else its ``info()``'s, asked once (kept for the next times)."""
        if url not in self.versions:
            fs = self.filesystem(url)
            try:
                info = fs.info(fs._strip_protocol(url))
            except Exception as exc:  # the download says why, naming the URL, if it fails too
                logger.debug("cannot find out the version of %s: %r", url, exc)
                return Identity(self.sizes.get(url, size), None, known=False)
            self._note(url, info)
        return Identity(self.sizes.get(url, size), self.versions[url])

    def size(self, url: str) -> int | None:
        """``url``'s size, when the listing or the object's ``info()`` gives it."""
        return self.identity(url).size

    def fetch(self, url: str, size: int | None = None) -> CachedFile:
        """``url``'s local copy, held until closed (downloaded, with retries, on a miss).

        The cache's copy is used when it is of the object's version (see
        :meth:`identity`); otherwise the object is downloaded again.
        """
        cache = self.local_cache()
        known = self.identity(url, size)

        def fetch(dest: str) -> None:
            logger.debug("downloading %s (%s) to %s", url, known.version or "no version", dest)
            download(self.filesystem(url), url, dest, size=known.size, policy=self.retry)

        return cache.get(url, known.size, fetch, version=known.version, refresh=not known.known)

    def prefetcher(self, urls: Sequence[str]) -> Prefetcher[str, CachedFile]:
        return Prefetcher(urls, self.fetch, depth=self.prefetch, release=CachedFile.close)


def _gib(size: int) -> str:
    return f"{size / 2**30:.2f} GiB"


def _warn_small(owner: str, total: int, limit: int, what: str) -> None:
    msg = (
        f"{owner}: its shards take {_gib(total)}, more than {what} can keep: in a shuffled "
        "epoch, shards evicted before the epoch is over are downloaded again. Pass "
        "cache=ShardCache(folder, max_bytes=...) on a disk that holds the dataset to "
        "download each shard once."
    )
    warnings.warn(msg, UserWarning, stacklevel=4)


def _options_for(protocol: str, options: dict[str, Any], policy: RetryPolicy) -> dict[str, Any]:
    """The file system's options: the user's, with the client's own retries off and the
    policy's timeouts on each request (where the user did not set them)."""
    options = dict(options)
    connect, read = policy.timeout("connect_timeout_s"), policy.timeout("read_timeout_s")
    if protocol in _S3:
        if "endpoint_url" in options:
            client = dict(options.get("client_kwargs") or {})
            client.setdefault("endpoint_url", options.pop("endpoint_url"))
            options["client_kwargs"] = client
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("retries", {"total_max_attempts": 1, "mode": "standard"})
        config.setdefault("connect_timeout", connect)
        config.setdefault("read_timeout", read)
        options["config_kwargs"] = config
    elif protocol in _HTTP:
        client = dict(options.get("client_kwargs") or {})
        if "timeout" not in client:
            aiohttp = require("aiohttp", "reading over HTTP(S)", "for fsspec's HTTP file system")
            # sock_read bounds the wait for the answer, then for each piece of its body
            client["timeout"] = aiohttp.ClientTimeout(sock_connect=connect, sock_read=read)
        options["client_kwargs"] = client
    return options


class LocalCopies:
    """The local copy of each remote file one reader's shard reads, in its order.

    Call it with a file's index to get the local path; the copy of the previous file is
    released then (or at :meth:`close`), the next ``prefetch`` download meanwhile.
    """

    def __init__(
        self,
        files: Sequence[str],
        order: Sequence[int],
        storage: Storage,
        remote: Callable[[str], bool],
        rank: int | None,
        world_size: int | None,
        first: int = 0,
    ) -> None:
        shard = shard_for_worker(list(order), rank=rank, world_size=world_size)
        self.files = files
        self.storage = storage
        # the shard's files from ``first`` on (a resumed stream consumed those before)
        self._mine = [i for i in shard.items[first:] if remote(files[i])]
        self._prefetcher = storage.prefetcher([files[i] for i in self._mine])
        self._held: CachedFile | None = None

    def __call__(self, index: int) -> str:
        self._release()
        url = self.files[index]
        if self._mine and self._mine[0] == index:
            self._mine.pop(0)
            held = self._prefetcher.get()
        else:  # not in the expected order: fetch it now
            held = self.storage.fetch(url)
        self._held = held
        return held.path

    def _release(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            held.close()

    def close(self) -> None:
        self._release()
        self._prefetcher.close()


@contextlib.contextmanager
def open_files(
    files: Sequence[str],
    order: Sequence[int],
    storage: Storage | None,
    *,
    remote: Callable[[str], bool] = is_remote,
    rank: int | None = None,
    world_size: int | None = None,
    first: int = 0,
) -> Iterator[LocalCopies | None]:
    """:class:`LocalCopies` for a reader's remote files, or None when it has none.

    ``order`` empty: no file is downloaded ahead, each is fetched when it is opened.
    """
    if storage is None or not any(remote(f) for f in files):
        yield None
        return
    copies = LocalCopies(files, order, storage, remote, rank, world_size, first)
    try:
        yield copies
    finally:
        copies.close()


def list_remote(
    files: Any, *, owner: str, suffixes: Sequence[str] | None, storage: Storage | None
) -> list[str] | None:
    """The URLs a remote ``files`` spec names (sorted), or None when ``files`` is not one."""
    if not is_remote(files):
        return None
    return (storage or Storage()).list_urls(files, owner=owner, suffixes=suffixes)
