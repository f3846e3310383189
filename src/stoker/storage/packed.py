"""A packed dataset at a URL: its metadata downloaded when opened, its data shards on use.

Opening downloads ``manifest.json`` and every shard's index and keys files (small: a few
dozen bytes a record) into a temporary folder, where the usual checks run on them (the
manifest's checksum, each file's size and crc32 from the manifest); they are loaded into
memory and the folder is removed. A data shard is downloaded whole, through the cache,
the first time one of its records is read; its size is checked against the manifest
(and, with ``verify``, its records' crc32), then it is memory-mapped as a local one.

A data shard's cached copy is used for the version of it that opening saw: its ETag (or
what else one listing of the dataset's folder says, see :func:`version_of`) together with
the manifest's digest, so a dataset written again under the same URL is downloaded again
even where the file system gives no version.

Without a cache folder the shards go to a private temporary one that keeps every shard
read (up to a bound, see :meth:`Storage.keep_shards`), so an epoch in any sampler order
downloads each shard once. Prefetching follows the order the shards are read in: a
sampler that knows it (``ShardSampler``) hands it over (:meth:`RemoteShards.plan`), and
the next ``prefetch`` shards of that order download in the background. Otherwise, when a
process moves from shard ``s - 1`` to shard ``s`` (or starts at shard 0), the next
``prefetch`` shards download; when it jumps (a shuffled order), nothing is prefetched and
the downloads still running for the shards it left are dropped. At most ``prefetch``
shards are being prefetched or waiting to be read, and at most ``prefetch + 2`` are held
mapped, whatever the order.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from stoker.formats._packed_spec import MANIFEST_NAME, shard_file_names
from stoker.storage.cache import CachedFile
from stoker.storage.fetch import download
from stoker.storage.remote import Storage, version_of

__all__ = ["RemoteShards", "join_url"]

logger = logging.getLogger("stoker")


def join_url(url: str, name: str) -> str:
    return f"{url.rstrip('/')}/{name}"


class RemoteShards:
    """The data shards of one packed dataset at ``url``, fetched through ``storage``'s cache.

    ``held`` bounds how many shards this process keeps held (mapped) at once; older ones are
    released (left to the cache's eviction) when more are opened.
    """

    def __init__(
        self, url: str, storage: Storage, shard_count: int = 0, held: int | None = None
    ) -> None:
        self.url = url.rstrip("/")
        self.storage = storage
        self.shard_count = shard_count
        self.max_held = held if held is not None else max(2, storage.prefetch + 2)
        self._held: OrderedDict[int, CachedFile] = OrderedDict()
        self._ahead: dict[int, concurrent.futures.Future[CachedFile]] = {}
        self._last: int | None = None  # the shard opened last
        self._sequential = False  # whether it followed the one before it
        self._plan: dict[int, list[int]] = {}  # shard -> the shards read after it, in order
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def for_process(self) -> RemoteShards:
        """A fresh copy for a forked process (no threads, nothing held, the same plan)."""
        copy = RemoteShards(self.url, self.storage, self.shard_count, self.max_held)
        copy._plan = self._plan
        return copy

    def plan(self, shards: list[int] | None) -> None:
        """The order the shards will be read in (from a sampler that knows it), or None:
        prefetching then takes the shards after the current one in that order."""
        plan: dict[int, list[int]] = {}
        if shards:
            depth = self.storage.prefetch
            for k, shard in enumerate(shards):
                plan.setdefault(shard, list(shards[k + 1 : k + 1 + depth]))
        with self._lock:
            self._plan = plan

    def mirror(self) -> str:
        """A new local folder holding the manifest and every index and keys file."""
        folder = tempfile.mkdtemp(prefix="stoker-packed-")
        try:
            self._get(MANIFEST_NAME, folder, None)
            with open(os.path.join(folder, MANIFEST_NAME), "rb") as f:
                raw = f.read()
            manifest = json.loads(raw.decode("utf-8"))
            shards = manifest.get("shards") if isinstance(manifest, dict) else None
            count = len(shards) if isinstance(shards, list) else 0
            self._note_versions(count, hashlib.sha256(raw).hexdigest()[:16])
            wanted: list[tuple[str, int | None]] = []
            for s, shard in enumerate(shards if isinstance(shards, list) else []):
                sizes = shard if isinstance(shard, dict) else {}
                _, index_name, keys_name = shard_file_names(s)  # never a name from the file
                wanted.append((index_name, _int(sizes.get("index_file_bytes"))))
                wanted.append((keys_name, _int(sizes.get("keys_file_bytes"))))
            self.shard_count = len(wanted) // 2
            workers = max(1, min(16, len(wanted)))
            with concurrent.futures.ThreadPoolExecutor(workers, "stoker-metadata") as pool:
                for future in [pool.submit(self._get, name, folder, size) for name, size in wanted]:
                    future.result()
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        return folder

    def _note_versions(self, count: int, manifest_digest: str) -> None:
        """Tells the storage each data shard's version: what one listing of the dataset's
        folder says of it (nothing when it cannot be listed) and the manifest's digest."""
        listed: dict[str, str | None] = {}
        fs = self.storage.filesystem(self.url)
        path = fs._strip_protocol(self.url)
        try:
            fs.invalidate_cache(path)
            found = fs.find(path, maxdepth=1, detail=True)
            listed = {name.rpartition("/")[2]: version_of(info) for name, info in found.items()}
        except Exception as exc:  # listing may be refused where reading is not
            logger.debug("cannot list %s for its shards' versions: %r", self.url, exc)
        for shard in range(count):
            name = shard_file_names(shard)[0]
            parts = (listed.get(name), f"manifest sha256={manifest_digest}")
            self.storage.versions[join_url(self.url, name)] = "; ".join(p for p in parts if p)

    def _get(self, name: str, folder: str, size: int | None) -> None:
        url = join_url(self.url, name)
        download(
            self.storage.filesystem(url),
            url,
            os.path.join(folder, name),
            size=size,
            policy=self.storage.retry,
        )

    @property
    def held(self) -> tuple[int, ...]:
        """The shards this process holds (mapped), least recently used first."""
        with self._lock:
            return tuple(self._held)

    @property
    def prefetching(self) -> tuple[int, ...]:
        """The shards being prefetched, or prefetched and not read yet."""
        with self._lock:
            return tuple(sorted(self._ahead))

    def shard_url(self, shard: int) -> str:
        return join_url(self.url, shard_file_names(shard)[0])

    def open(self, shard: int, size: int) -> tuple[str, list[int]]:
        """The local path of data shard ``shard`` (``size`` bytes), held until released, and
        the shards released to make room (their mappings must be dropped)."""
        with self._lock:
            if shard != self._last:
                self._sequential = shard == (0 if self._last is None else self._last + 1)
                self._last = shard
            held = self._held.get(shard)
            if held is not None:
                self._held.move_to_end(shard)
                return held.path, []
            future = self._ahead.pop(shard, None)
        held = (
            future.result()
            if future is not None
            else self.storage.fetch(self.shard_url(shard), size)
        )
        released = []
        with self._lock:
            self._held[shard] = held
            while len(self._held) > self.max_held:
                old_shard, old = self._held.popitem(last=False)
                old.close()
                released.append(old_shard)
        return held.path, released

    def prefetch_after(self, shard: int, sizes: list[int]) -> None:
        """Starts downloading the ``prefetch`` shards read after ``shard`` in the background:
        the next ones in the plan, else the next in shard order when the reads follow it,
        else none; drops the prefetches the order no longer needs."""
        depth = self.storage.prefetch
        if depth <= 0:
            return
        with self._lock:
            if shard in self._plan:
                wanted: Sequence[int] = self._plan[shard]
            elif self._sequential and shard == self._last:
                wanted = range(shard + 1, min(shard + 1 + depth, len(sizes)))
            else:
                wanted = ()
            for old in [s for s in self._ahead if s not in wanted]:
                _drop(self._ahead.pop(old))
            if not wanted:
                return
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(depth, "stoker-prefetch")
            for nxt in wanted:
                if nxt not in self._held and nxt not in self._ahead:
                    url = self.shard_url(nxt)
                    self._ahead[nxt] = self._pool.submit(self.storage.fetch, url, sizes[nxt])

    def release(self, shard: int) -> None:
        with self._lock:
            held = self._held.pop(shard, None)
        if held is not None:
            held.close()

    def close(self) -> None:
        """Stops prefetching and releases every shard held by this process."""
        with self._lock:
            pool, self._pool = self._pool, None
            ahead, self._ahead = self._ahead, {}
            held, self._held = self._held, OrderedDict()
        for future in ahead.values():
            future.cancel()
        if pool is not None:
            pool.shutdown(wait=True)
        for future in ahead.values():
            if not future.cancelled() and future.exception() is None:
                future.result().close()
        for value in held.values():
            value.close()

    def __del__(self) -> None:
        pool = self._pool
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


def _drop(future: concurrent.futures.Future[CachedFile]) -> None:
    """A prefetch nobody will read: cancelled, or its file released once it has arrived."""
    if not future.cancel():
        future.add_done_callback(_release_result)


def _release_result(future: concurrent.futures.Future[CachedFile]) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result().close()


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
