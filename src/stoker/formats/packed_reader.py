"""``PackedDataset``: a map-style dataset over packed shards, read through ``mmap``.

Opening checks the structure of the whole dataset without reading any payload: the
manifest (its own checksum from version 2, then every key, see ``_packed_manifest``), each
index and keys file against the size and crc32 in the manifest, every file's ``.npy``
header, every data file's size (a truncated shard fails at once with the file and the
first record it cuts) and every index entry's extents (see ``_packed_checks``). Data files
are memory-mapped on first use; a sample's bytes and arrays are views of the mapping, not
copies. With ``verify="read"`` each record's crc32 is checked when it is read, with
``verify="open"`` every record's once when the dataset is opened.

The index lives in flat numpy arrays (one per column, all shards concatenated), never in
per-record Python objects, so forked workers share it without copying. Pickling sends the
path and the options only: a worker started with ``spawn`` reopens the dataset itself,
and a forked one, seeing a new process id, maps the data files afresh.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import os
import shutil
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stoker._index import normalize_index, normalize_indices
from stoker._printable import printable
from stoker._thread_safety import is_thread_safe
from stoker.datasets import Dataset
from stoker.formats._packed_checks import check_data_file, check_index, load_npy, map_payload
from stoker.formats._packed_manifest import read_manifest
from stoker.formats._packed_spec import (
    BLOB_KINDS,
    PackedFormatError,
    Schema,
    fspath,
)
from stoker.storage.packed import RemoteShards, join_url
from stoker.storage.remote import Storage, is_remote

__all__ = ["PackedDataset"]

_VERIFY = (False, "open", "read")
_FINGERPRINT = "__crc32__"
_CORRUPT_HINT = (
    "The shard is corrupted: re-create the dataset (stoker pack / PackedWriter), or let the loader "
    "skip bad samples with DataLoader(on_error='skip')."
)


@dataclass(slots=True)
class _Opened:
    """What one process holds of an open dataset: the index and the shard mappings."""

    manifest: dict[str, Any]
    schema: Schema
    shard_paths: tuple[str, ...]
    starts: np.ndarray  # int64, len(shards) + 1: global index of each shard's first record
    starts_list: list[int]
    columns: dict[str, np.ndarray]
    keys: tuple[np.ndarray, ...]
    maps: list[np.ndarray | None]
    pid: int
    remote: RemoteShards | None = None  # a dataset at a URL: its data shards, fetched on use


class PackedDataset(Dataset[Any]):
    """A map-style dataset over a directory written by ``PackedWriter`` or ``stoker pack``.

    Sample ``i`` is record ``i`` as it was added: a bare value, a tuple or a dict. Bytes
    fields come back as read-only ``memoryview`` objects and array fields as read-only
    numpy arrays, both views of the memory-mapped shard (no copy; pass ``copy=True`` for
    ``bytes`` and writable arrays); ``str``, ``int`` and ``float`` fields as Python values.

    Args:
        path: the dataset directory.
        verify: ``False`` (default: structure only: the manifest, each index and keys
            file against its checksum, every file's header and size, every index entry's
            extents), ``"open"`` (also every record's crc32, once, when opened: reads all
            the data) or ``"read"`` (also each record's crc32 each time it is read; about
            7 us per 30 KB record). See docs/integrity.md for what each mode guarantees.
        transform: called on each record; its result is the sample. With a transform the
            dataset has no ``__getitems__`` (so the loader fetches sample by sample and a
            random transform draws from each sample's own ``stoker.sample_rng()``).
        copy: return ``bytes`` and writable array copies instead of views (pass it with
            ``torch.utils.data.DataLoader``, whose collate warns about read-only arrays).
        storage_options, cache, prefetch, retries: for a dataset at a URL (``s3://...``,
            see docs/object-storage.md): the fsspec options, the cache folder or
            :class:`~stoker.storage.ShardCache`, how many shards after the one being read
            to download ahead, and attempts per download. Opening downloads the manifest
            and the index and keys files; each data shard is downloaded whole on first use.

    Raises:
        PackedFormatError: the directory has no complete manifest (the write did not
            finish), the manifest is damaged or malformed, a shard file is missing, not a
            regular file, truncated or damaged, or, with ``verify="open"``, a record fails
            its checksum. The message names the file and the key or the record.

    Example:
        >>> import tempfile, numpy as np
        >>> from stoker.formats.packed import PackedDataset, PackedWriter
        >>> folder = tempfile.mkdtemp()
        >>> with PackedWriter(folder) as writer:
        ...     for i in range(3):
        ...         _ = writer.add({"x": np.full((2, 2), i, dtype=np.float32), "label": i})
        >>> ds = PackedDataset(folder)
        >>> len(ds), ds[2]["label"], ds[2]["x"].sum()
        (3, 2, np.float32(8.0))
        >>> [s["label"] for s in ds.__getitems__([2, 0])]
        [2, 0]
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        verify: bool | str = False,
        transform: Callable[[Any], Any] | None = None,
        copy: bool = False,
        storage_options: dict[str, Any] | None = None,
        cache: Any = None,
        prefetch: int = 2,
        retries: Any = 5,
    ) -> None:
        remote = is_remote(path)
        self.path = path.rstrip("/") if remote else os.path.abspath(fspath(path, "path"))  # type: ignore[union-attr]
        self.storage = Storage(storage_options, cache, prefetch, retries) if remote else None
        if verify is True:
            verify = "open"
        if verify not in _VERIFY:
            msg = f"verify must be False, 'open' or 'read', got {verify!r}"
            raise ValueError(msg)
        if transform is not None and not callable(transform):
            msg = (
                f"transform must be callable or None, got {type(transform).__name__} {transform!r}"
            )
            raise TypeError(msg)
        self.verify = verify
        self.transform = transform
        self.copy = bool(copy)
        self._opened: _Opened | None = None
        self._shard_order: list[int] | None = None
        self._verified = False
        self._fingerprint: int | None = None
        self._open()

    # -- opening ---------------------------------------------------------------------

    def _open(self) -> _Opened:
        opened = self._opened
        pid = os.getpid()
        if opened is not None and opened.pid == pid:
            return opened
        if opened is not None:  # forked: keep the (shared, read-only) index, map afresh
            remote = opened.remote.for_process() if opened.remote is not None else None
            opened = dataclasses.replace(
                opened, maps=[None] * len(opened.shard_paths), pid=pid, remote=remote
            )
        else:
            opened = _load(self.path, pid, self.storage)
            try:
                self._check_opened(opened)
            except BaseException:
                if opened.remote is not None:  # its prefetch threads and its shards held
                    opened.remote.close()
                raise
            self._verified = True
            self._fingerprint = opened.manifest[_FINGERPRINT]
        self._opened = opened
        return opened

    def _check_opened(self, opened: _Opened) -> None:
        """The checks of a newly loaded dataset: the manifest it was opened with, and
        with ``verify="open"`` (the first time) every record."""
        if opened.remote is not None:
            opened.remote.plan(self._shard_order)
        fingerprint = opened.manifest[_FINGERPRINT]
        if self._fingerprint is not None and fingerprint != self._fingerprint:
            msg = (
                f"the packed dataset {self.path!r} was rewritten after this PackedDataset "
                "was opened (its manifest changed): a worker would read other data than the "
                "main process. Open it again."
            )
            raise PackedFormatError(msg)
        if self.verify == "open" and not self._verified:
            _verify_all(opened, self.path)

    def __getstate__(self) -> dict[str, Any]:
        # The path and the options only: the index is reloaded in the receiving process.
        return {
            "path": self.path,
            "verify": self.verify,
            "transform": self.transform,
            "copy": self.copy,
            "storage": self.storage,
            "verified": self._verified,
            "fingerprint": self._fingerprint,
            "shard_order": self._shard_order,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path = state["path"]
        self.verify = state["verify"]
        self.transform = state["transform"]
        self.copy = state["copy"]
        self.storage = state.get("storage")
        self._verified = state["verified"]
        self._fingerprint = state["fingerprint"]
        self._shard_order = state.get("shard_order")
        self._opened = None

    # -- metadata ----------------------------------------------------------------------

    def __len__(self) -> int:
        return int(self._open().starts[-1])

    @property
    def thread_safe(self) -> bool:
        """Reads are views of read-only maps: thread-safe when the transform is (worker_mode)."""
        kind = type(self)
        return (
            kind.__getitem__ is PackedDataset.__getitem__
            and kind.__getitems__ is PackedDataset.__getitems__
            and (self.transform is None or is_thread_safe(self.transform))
        )

    @property
    def manifest(self) -> dict[str, Any]:
        """The parsed manifest.json (a deep copy)."""
        manifest = json.loads(json.dumps(self._open().manifest))
        del manifest[_FINGERPRINT]
        return manifest

    @property
    def classes(self) -> list[str] | None:
        """Class names (label ``i`` is ``classes[i]``), or None when none were stored."""
        classes = self._open().manifest.get("classes")
        return list(classes) if classes is not None else None

    @property
    def class_to_idx(self) -> dict[str, int] | None:
        """``{class name: label}``, or None when no classes were stored."""
        classes = self.classes
        return None if classes is None else {name: i for i, name in enumerate(classes)}

    @property
    def metadata(self) -> dict[str, Any]:
        """The user metadata stored by the writer (a copy)."""
        return json.loads(json.dumps(self._open().manifest.get("metadata") or {}))

    @property
    def shard_paths(self) -> tuple[str, ...]:
        """Paths of the shard data files, in record order."""
        return self._open().shard_paths

    def column(self, field: str | int | None = None) -> np.ndarray:
        """All values of an ``int`` or ``float`` field (e.g. the labels) as a read-only array.

        Args:
            field: the dict key or tuple position of the field (``None`` or 0 for a
                record that is one bare number).
        """
        opened = self._open()
        for k, spec in enumerate(opened.schema.fields):
            if spec.name == field or (opened.schema.layout == "single" and field in (None, 0)):
                if spec.kind in BLOB_KINDS:
                    msg = (
                        f"column({field!r}): field {field!r} is {spec.kind}; only int and "
                        "float fields are columns"
                    )
                    raise ValueError(msg)
                return opened.columns[f"value{k}"]
        names = [spec.name for spec in opened.schema.fields]
        msg = f"column({field!r}): no such field; the records have fields {names!r}"
        raise KeyError(msg)

    def key(self, index: int) -> str | None:
        """The key (source name) the record was added with, or None."""
        opened = self._open()
        i = self._check_index(opened, index)
        shard = bisect.bisect_right(opened.starts_list, i) - 1
        start = int(opened.columns["key_offset"][i])
        length = int(opened.columns["key_length"][i])
        if length == 0:
            return None
        try:
            return (
                opened.keys[shard][start : start + length]
                .tobytes()
                .decode("utf-8", "surrogatepass")
            )
        except UnicodeDecodeError as exc:
            raise _damaged_text(opened, shard, i, "its key", exc) from None

    def describe_sample(self, index: int) -> str:
        """Where sample ``index`` is stored: the shard file, the record, and its key."""
        opened = self._open()
        i = self._check_index(opened, index)
        shard = bisect.bisect_right(opened.starts_list, i) - 1
        key = self.key(i)
        where = f"{printable(opened.shard_paths[shard])} record {i - opened.starts_list[shard]}"
        return f"{where} (from {printable(key)})" if key else where

    def close(self) -> None:
        """Releases a remote dataset's downloaded shards and stops its prefetching (it
        reopens on the next read); nothing to do for a local one."""
        opened = self._opened
        if opened is not None and opened.remote is not None and opened.pid == os.getpid():
            opened.remote.close()
            opened.maps[:] = [None] * len(opened.maps)

    def set_shard_order(self, shards: Sequence[int] | None) -> None:
        """The order this epoch's reads will visit the shards in, for a dataset at a URL: it
        then prefetches the shards in that order. A sampler that knows it calls this each
        epoch (``ShardSampler``); ``None``: prefetch follows the reads (the next shards
        while they are read in shard order, none while they jump). Worker processes started
        later (each epoch's, unless ``persistent_workers``) take the order with them.
        Nothing to do for a local dataset."""
        self._shard_order = None if shards is None else [int(s) for s in shards]
        opened = self._opened
        if opened is not None and opened.remote is not None:
            opened.remote.plan(self._shard_order)

    def verify_all(self) -> None:
        """Checks every record's crc32; raises PackedFormatError naming the first bad one."""
        _verify_all(self._open(), self.path)

    def __repr__(self) -> str:
        opened = self._opened
        size = (
            f"records={int(opened.starts[-1])}, shards={len(opened.shard_paths)}, "
            if opened
            else ""
        )
        return f"PackedDataset({self.path!r}, {size}verify={self.verify!r})"

    # -- reading -------------------------------------------------------------------------

    def _check_index(self, opened: _Opened, index: Any) -> int:
        return normalize_index(index, opened.starts_list[-1], "PackedDataset")

    def __getitem__(self, index: int) -> Any:
        opened = self._open()
        i = self._check_index(opened, index)
        shard = bisect.bisect_right(opened.starts_list, i) - 1
        columns = opened.columns
        offset = int(columns["offset"][i])
        data = _map(opened, shard)
        if self.verify == "read":
            _check_record(
                opened, shard, i, data, offset, int(columns["length"][i]), int(columns["crc32"][i])
            )
        values = []
        try:
            for k, spec in enumerate(opened.schema.fields):
                if spec.kind in BLOB_KINDS:
                    start = offset + int(columns[f"start{k}"][i])
                    end = start + int(columns[f"nbytes{k}"][i])
                    shape = (
                        tuple(columns[f"shape{k}"][i].tolist())
                        if spec.kind == "array" and spec.ndim
                        else ()
                    )
                    values.append(self._blob(spec.kind, spec.dtype, shape, data[start:end]))
                else:
                    values.append(columns[f"value{k}"][i].item())
        except UnicodeDecodeError as exc:
            raise _damaged_text(opened, shard, i, "a str field", exc) from None
        record = _assemble(opened.schema, values)
        return record if self.transform is None else self.transform(record)

    @property
    def __getitems__(self) -> Callable[[Sequence[int]], list[Any]] | None:  # type: ignore[override]
        """Batch fetch (vectorised index lookups); None when a transform is set."""
        return None if self.transform is not None else self._get_many

    def _get_many(self, indices: Sequence[int]) -> list[Any]:
        opened = self._open()
        idx = normalize_indices(indices, opened.starts_list[-1], "PackedDataset")
        columns = opened.columns
        shards = (np.searchsorted(opened.starts, idx, side="right") - 1).tolist()
        offsets = columns["offset"][idx]
        if self.verify == "read":
            lengths, crcs = columns["length"][idx].tolist(), columns["crc32"][idx].tolist()
            for j, (shard, offset) in enumerate(zip(shards, offsets.tolist(), strict=True)):
                data = _map(opened, shard)
                _check_record(opened, shard, int(idx[j]), data, offset, lengths[j], crcs[j])
        per_field: list[Any] = []
        for k, spec in enumerate(opened.schema.fields):
            if spec.kind in BLOB_KINDS:
                starts = (offsets + columns[f"start{k}"][idx]).tolist()
                ends = (np.asarray(starts, dtype=np.int64) + columns[f"nbytes{k}"][idx]).tolist()
                shapes = (
                    columns[f"shape{k}"][idx].tolist()
                    if spec.kind == "array" and spec.ndim
                    else None
                )
                per_field.append((spec, starts, ends, shapes))
            else:
                per_field.append((spec, columns[f"value{k}"][idx].tolist(), None, None))
        samples = []
        for j, shard in enumerate(shards):
            data = _map(opened, shard)
            values = []
            try:
                for spec, first, ends, shapes in per_field:
                    if ends is None:
                        values.append(first[j])
                    else:
                        shape = tuple(shapes[j]) if shapes is not None else ()
                        values.append(
                            self._blob(spec.kind, spec.dtype, shape, data[first[j] : ends[j]])
                        )
            except UnicodeDecodeError as exc:
                raise _damaged_text(opened, shard, int(idx[j]), "a str field", exc) from None
            samples.append(_assemble(opened.schema, values))
        return samples

    def _blob(self, kind: str, dtype: str | None, shape: tuple[int, ...], raw: np.ndarray) -> Any:
        if kind == "bytes":
            return raw.tobytes() if self.copy else memoryview(raw)
        if kind == "str":
            return raw.tobytes().decode("utf-8", "surrogatepass")
        array = raw.view(dtype).reshape(shape)
        return array.copy() if self.copy else array


def _map(opened: _Opened, shard: int) -> np.ndarray:
    """Shard ``shard``'s payload as a read-only uint8 array over its memory mapping."""
    array = opened.maps[shard]
    if array is None:
        path = opened.shard_paths[shard]
        if opened.remote is not None:
            path = _fetch_shard(opened, shard)
        array = map_payload(path, opened.manifest["shards"][shard])
        opened.maps[shard] = array
    return array


def _fetch_shard(opened: _Opened, shard: int) -> str:
    """The local copy of a remote data shard, downloaded (or found in the cache) and checked."""
    remote = opened.remote
    assert remote is not None
    sizes = [entry["data_file_bytes"] for entry in opened.manifest["shards"]]
    path, released = remote.open(shard, sizes[shard])
    for old in released:  # no longer held: its file may be evicted, so it must not stay mapped
        opened.maps[old] = None
    lo, hi = opened.starts_list[shard], opened.starts_list[shard + 1]
    index = {name: opened.columns[name][lo:hi] for name in ("offset", "length")}
    try:
        check_data_file(path, opened.manifest["shards"][shard], index, lo)  # type: ignore[arg-type]
    except PackedFormatError as exc:  # name the object, not its copy in the cache
        raise PackedFormatError(str(exc).replace(path, opened.shard_paths[shard])) from None
    remote.prefetch_after(shard, sizes)
    return path


def _assemble(schema: Schema, values: list[Any]) -> Any:
    if schema.layout == "single":
        return values[0]
    if schema.layout == "tuple":
        return tuple(values)
    return {spec.name: value for spec, value in zip(schema.fields, values, strict=True)}


def _record_name(opened: _Opened, shard: int, i: int) -> str:
    local = i - opened.starts_list[shard]
    return f"{opened.shard_paths[shard]}: record {local} of this shard (dataset index {i})"


def _check_record(
    opened: _Opened, shard: int, i: int, data: np.ndarray, offset: int, length: int, crc: int
) -> None:
    actual = zlib.crc32(data[offset : offset + length])
    if actual != crc:
        msg = (
            f"{_record_name(opened, shard, i)} fails its checksum: crc32 stored 0x{crc:08x}, "
            f"computed 0x{actual:08x} over bytes {offset}..{offset + length} of the payload. "
            f"{_CORRUPT_HINT}"
        )
        raise PackedFormatError(msg)


def _damaged_text(
    opened: _Opened, shard: int, i: int, what: str, exc: UnicodeDecodeError
) -> PackedFormatError:
    msg = (
        f"{_record_name(opened, shard, i)} has {what} that "
        f"is not valid UTF-8 ({exc.reason} at byte {exc.start}), so the shard is damaged "
        f"(verify='read' would have found it by its checksum). {_CORRUPT_HINT}"
    )
    return PackedFormatError(msg)


def _verify_all(opened: _Opened, path: str) -> None:
    columns = opened.columns
    for shard in range(len(opened.shard_paths)):
        lo, hi = opened.starts_list[shard], opened.starts_list[shard + 1]
        if lo == hi:
            continue
        data = _map(opened, shard)
        offsets = columns["offset"][lo:hi].tolist()
        lengths = columns["length"][lo:hi].tolist()
        crcs = columns["crc32"][lo:hi].tolist()
        for j, (offset, length, crc) in enumerate(zip(offsets, lengths, crcs, strict=True)):
            if zlib.crc32(data[offset : offset + length]) != crc:
                _check_record(opened, shard, lo + j, data, offset, length, crc)


def _load(path: str, pid: int, storage: Storage | None = None) -> _Opened:
    if storage is None:
        return _load_local(path, path, pid)
    remote = RemoteShards(path, storage)
    mirror = remote.mirror()  # the manifest, index and keys files, checked like local ones
    try:
        opened = _load_local(mirror, path, pid)
    except PackedFormatError as exc:  # name the objects, not their downloaded copies
        raise PackedFormatError(str(exc).replace(mirror, path)) from None
    finally:
        shutil.rmtree(mirror, ignore_errors=True)
    total = sum(int(entry["data_file_bytes"]) for entry in opened.manifest["shards"])
    storage.keep_shards(total, f"PackedDataset({path!r})")
    return dataclasses.replace(opened, remote=remote)


def _load_local(path: str, location: str, pid: int) -> _Opened:
    """Loads the dataset in folder ``path``; at ``location`` (a URL) when its files are remote."""
    manifest, schema, fingerprint = read_manifest(path)
    manifest[_FINGERPRINT] = (
        fingerprint  # never written: tells one writing of the dataset from another
    )
    index_dtype = schema.index_dtype()
    shard_paths, indices, keys = [], [], []
    first = 0
    for shard in manifest["shards"]:
        data_path = os.path.join(path, shard["data"])
        index_path = os.path.join(path, shard["index"])
        keys_path = os.path.join(path, shard["keys"])
        records = shard["records"]
        index = load_npy(
            index_path,
            shard["index_file_bytes"],
            shard["index_crc32"],
            "index file",
            index_dtype,
            (records,),
        )
        keys_file = load_npy(
            keys_path,
            shard["keys_file_bytes"],
            shard["keys_crc32"],
            "keys file",
            np.dtype(np.uint8),
            None,
        )
        if location != path:  # remote: the data file is checked when it is downloaded
            data_path = join_url(location, shard["data"])
        check_index(index, schema, shard["data_bytes"], len(keys_file), data_path, first)
        if location == path:
            check_data_file(data_path, shard, index, first)
        shard_paths.append(data_path)
        indices.append(index)
        keys.append(keys_file)
        first += records
    starts = np.zeros(len(indices) + 1, dtype=np.int64)
    np.cumsum([shard["records"] for shard in manifest["shards"]], out=starts[1:])
    columns = {}
    for name in index_dtype.names or ():
        column = (
            np.concatenate([index[name] for index in indices])
            if indices
            else np.zeros((0, *index_dtype[name].shape), dtype=index_dtype[name].base)
        )
        column.flags.writeable = False
        columns[name] = column
    return _Opened(
        manifest=manifest,
        schema=schema,
        shard_paths=tuple(shard_paths),
        starts=starts,
        starts_list=starts.tolist(),
        columns=columns,
        keys=tuple(keys),
        maps=[None] * len(shard_paths),
        pid=pid,
    )
