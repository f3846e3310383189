"""WebDataset-style tar shards: a streaming reader (and :func:`write_tar_shards`).

A shard is a plain tar file whose members are grouped into samples by their key, the
member name up to the first dot of its base name: ``000123.jpg``, ``000123.cls`` and
``000123.json`` are one sample ``{"__key__": "000123", "__url__": shard, "jpg": b"...",
"cls": b"...", "json": b"..."}``. A sample's files must be next to each other in the
tar, as :func:`write_tar_shards` and ``webdataset.TarWriter`` write them.

:class:`TarShards` reads shards front to back (``tarfile`` in ``"r|*"`` mode: no
seeking, so a pipe or an HTTP response works as well as a local file; ``.tar.gz``
too). Shards are split over ``(rank, worker)`` with :mod:`stoker.sharding`: whole
shards while there are at least as many as readers, every ``k``-th sample of a shared
shard otherwise. A truncated or corrupt shard raises :class:`~stoker.DatasetError`
naming it (``tarfile`` alone ends such a shard silently); ``on_error="skip"`` logs it,
counts it and moves on to the next shard. A sample that cannot be delivered as stored (a
member that is a link or a device file, or one larger than ``max_member_bytes``) raises
naming the shard, the sample and the member, or is skipped alone. A gzipped shard's
CRC-32 and length are checked when it ends, or before its first sample with
``verify="open"``; a plain tar checksums its headers but not its members' data.

Example:
    >>> import os, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> samples = [{"__key__": f"{i:04d}", "cls": i % 2, "txt": f"sample {i}"} for i in range(5)]
    >>> paths = write_tar_shards(
    ...     samples, os.path.join(folder, "shard-%03d.tar"), max_samples_per_shard=2
    ... )
    >>> [os.path.basename(p) for p in paths]
    ['shard-000.tar', 'shard-001.tar', 'shard-002.tar']
    >>> [(s["__key__"], s["cls"], s["txt"]) for s in TarShards(paths, decode=True)][:2]
    [('0000', 0, 'sample 0'), ('0001', 1, 'sample 1')]
"""

from __future__ import annotations

import importlib.util
import io
import json
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from stoker._errors import DatasetError
from stoker._skipped import SKIPPED
from stoker._validate import check_int, check_optional_int
from stoker.compact import StringArray
from stoker.datasets import IterableDataset
from stoker.formats._npy import read_npy_header
from stoker.formats._tar_stream import BadSample, check_shard, is_url, read_samples
from stoker.formats.tar_writer import IMAGE_EXTENSIONS, write_tar_shards
from stoker.formats.text import (
    _check_verify,
    _file_order,
    _resolve_files,
)
from stoker.storage.remote import Storage, is_remote, open_files
from stoker.streams._records import RecordStream
from stoker.vision.decode import PILLOW_LIMIT, MaxPixels, check_max_pixels, decode_image

__all__ = ["DEFAULT_MAX_MEMBER_BYTES", "TarShards", "default_decoders", "write_tar_shards"]

logger = logging.getLogger("stoker")

_TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz")
_BRACES = re.compile(r"\{(\d+)\.\.(\d+)\}")
# A member is read into memory whole; a header can claim any size, and a small gzipped
# shard can inflate to far more than it holds.
DEFAULT_MAX_MEMBER_BYTES = 2**30

Decoder = Callable[[bytes], Any]


# -- decoding ------------------------------------------------------------------------
def _decode_int(data: bytes) -> int:
    return int(data.decode("utf-8").strip())


def _decode_text(data: bytes) -> str:
    return data.decode("utf-8")


def _decode_npy(data: bytes) -> np.ndarray:
    """The array of a ``.npy`` member, after checking its header against the member's bytes."""
    header = read_npy_header(io.BytesIO(data))  # ValueError, reported with the sample
    if header.dtype.hasobject:
        msg = (
            f"it holds Python objects ({header.dtype}), which are stored as pickles; stoker does "
            "not unpickle data it reads (unpickling can run any code). Store numbers, bools or "
            "strings"
        )
        raise ValueError(msg)
    if header.offset + header.data_bytes != len(data):
        msg = (
            f"its header declares {header.shape} of {header.dtype} ({header.data_bytes:,} bytes of "
            f"data), but {len(data) - header.offset:,} bytes follow it: the member is damaged"
        )
        raise ValueError(msg)
    return np.load(io.BytesIO(data), allow_pickle=False)


def _decode_npz(data: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


def default_decoders(max_pixels: MaxPixels = PILLOW_LIMIT) -> dict[str, Decoder]:
    """The decoders ``decode=True`` uses, by extension; extend or override a copy.

    ``cls`` / ``cls2`` / ``index`` / ``id`` become ``int``, ``txt`` / ``text`` ``str``,
    ``json`` the parsed value, ``npy`` an array, ``npz`` a dict of arrays, and images
    (``jpg``, ``png``, ``webp``, ...) an ``H x W x 3`` uint8 RGB array when Pillow is
    installed (without it they stay bytes), decoded by :func:`stoker.vision.decode_image`,
    which refuses an image declaring more than ``max_pixels`` pixels before decoding it.
    Other extensions stay bytes.

    Example:
        >>> decoders = {**default_decoders(), "cls": lambda b: int(b) - 1}
        >>> decoders["cls"](b"3"), decoders["json"](b'{"a": 1}')
        (2, {'a': 1})
    """
    decoders: dict[str, Decoder] = {
        "cls": _decode_int,
        "cls2": _decode_int,
        "index": _decode_int,
        "id": _decode_int,
        "txt": _decode_text,
        "text": _decode_text,
        "json": json.loads,
        "jsn": json.loads,
        "npy": _decode_npy,
        "npz": _decode_npz,
    }
    if importlib.util.find_spec("PIL") is not None:
        limit = check_max_pixels(max_pixels)

        def decode_rgb(data: bytes) -> np.ndarray:
            return decode_image(data, rgb=True, max_pixels=limit)  # type: ignore[no-any-return]

        decoders.update(dict.fromkeys(IMAGE_EXTENSIONS, decode_rgb))
    return decoders


def _check_decode(
    decode: Any, max_pixels: MaxPixels
) -> Callable[[dict[str, Any]], Any] | dict[str, Decoder] | None:
    if decode is None or decode is False:
        return None
    if decode is True:
        return default_decoders(max_pixels)
    if isinstance(decode, Mapping):
        for ext, fn in decode.items():
            if not isinstance(ext, str) or not callable(fn):
                msg = (
                    "decode as a dict maps an extension (str, like 'jpg') to a function of the "
                    f"file's bytes; got {ext!r}: {fn!r}"
                )
                raise TypeError(msg)
        return {ext.lower().lstrip("."): fn for ext, fn in decode.items()}
    if callable(decode):
        return decode
    msg = (
        "decode must be None (bytes), True (the default decoders), a dict of extension to "
        f"function, or a function of the whole sample; got {decode!r}"
    )
    raise TypeError(msg)


# -- reading -------------------------------------------------------------------------
def _expand_braces(spec: str) -> list[str]:
    """``"shard-{00..02}.tar"`` -> three names, zero padding kept (webdataset's notation)."""
    match = _BRACES.search(spec)
    if match is None:
        return [spec]
    first, last = match.group(1), match.group(2)
    width = len(first) if first.startswith("0") or len(first) == len(last) else 0
    head, tail = spec[: match.start()], spec[match.end() :]
    return [
        name
        for i in range(int(first), int(last) + 1)
        for name in _expand_braces(f"{head}{i:0{width}d}{tail}")
    ]


def _resolve_shards(urls_or_paths: Any, storage: Storage | None = None) -> StringArray:
    if isinstance(urls_or_paths, str) and (_BRACES.search(urls_or_paths) or is_url(urls_or_paths)):
        urls_or_paths = _expand_braces(urls_or_paths)
    return _resolve_files(
        urls_or_paths,
        owner="TarShards",
        suffixes=_TAR_SUFFIXES,
        must_exist=lambda s: not is_url(s),
        storage=storage,
    )


class TarShards(RecordStream, IterableDataset[dict[str, Any]]):
    """Samples from WebDataset-style tar shards, streamed and split over ranks and workers.

    Args:
        urls_or_paths: a list of shard paths or URLs, a glob pattern, a directory (its
            ``.tar``, ``.tar.gz`` and ``.tgz`` files, sorted) or a brace pattern such
            as ``"shards/train-{000000..000127}.tar"``. URLs may be ``file://``,
            ``http://``, ``https://``, or ``s3://``, ``gs://``, ``az://`` and any other
            protocol fsspec knows (a prefix is listed and sorted).
        decode: ``None`` keeps every file as bytes; ``True`` decodes by extension with
            :func:`default_decoders`; a dict maps extensions to functions of the
            bytes (the others stay bytes; an extension like ``seg.png`` uses the
            ``png`` entry); a function receives the whole sample dict and returns the
            sample.
        on_error: ``"raise"`` (default), ``"skip"``, or a handler ``f(exc) -> bool``
            (webdataset's convention: return True to skip and go on, False to raise).
            It covers truncated or corrupt shards (the rest of the shard is skipped),
            samples that cannot be delivered as stored (a member that is a link or a
            device file, or larger than ``max_member_bytes``) and samples that fail to
            decode (each such sample alone is skipped). Skips are logged on the
            ``stoker`` logger, naming the shard and the sample, and counted in
            :attr:`skipped`.
        verify: ``False`` (default) or ``"open"``. A gzipped shard's CRC-32 and length
            are checked when the shard ends, after its samples were delivered; with
            ``"open"`` each gzipped shard is read in full and checked before its first
            sample is delivered (it is read and decompressed twice). Plain tar checksums
            its headers only: a flipped bit in a member's data cannot be detected.
        max_member_bytes: refuse (report, or skip with ``on_error``) a sample with a
            member larger than this many bytes (decompressed) instead of reading it into
            memory; default 1 GiB, ``None`` for no limit.
        max_pixels: with ``decode=True``, refuse an image declaring more pixels than
            this before decoding it (see :func:`default_decoders`).
        shuffle_shards: shuffle the shard order every epoch from ``(seed, epoch)``;
            :class:`stoker.DataLoader` calls :meth:`set_epoch` itself.
        seed: seeds that shuffle.
        rank, world_size: fix the distributed topology instead of finding it when
            iteration starts.
        shuffle_buffer: shuffle the samples through a buffer of this many (see
            :mod:`stoker.streams`): seeded from the loader's epoch seed (from ``seed``
            outside a loader), resumable with :meth:`state_dict`.
        storage_options, cache, prefetch, retries: for object storage URLs (``s3://``,
            ``gs://``, ``az://``, ...; see :class:`stoker.TextLines`). ``http(s)://`` and
            ``file://`` shards are streamed without them, or go through the cache when
            ``storage_options`` or ``cache`` is given.

    Attributes:
        shards: the shard paths or URLs, as a :class:`~stoker.compact.StringArray`.
        skipped: shards and samples skipped so far by this object (each worker process
            counts its own).

    Example:
        >>> import os, tempfile
        >>> pattern = os.path.join(tempfile.mkdtemp(), "s-%02d.tar")
        >>> _ = write_tar_shards([{"__key__": "a", "cls": 3}], pattern)
        >>> next(iter(TarShards(pattern.replace("%02d", "*"))))["cls"]
        b'3'
    """

    def __init__(
        self,
        urls_or_paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
        *,
        decode: bool | dict[str, Decoder] | Callable[[dict[str, Any]], Any] | None = None,
        on_error: str | Callable[[Exception], bool] = "raise",
        verify: bool | str = False,
        max_member_bytes: int | None = DEFAULT_MAX_MEMBER_BYTES,
        max_pixels: MaxPixels = PILLOW_LIMIT,
        shuffle_shards: bool = False,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        shuffle_buffer: int | None = None,
        storage_options: dict[str, Any] | None = None,
        cache: Any = None,
        prefetch: int = 2,
        retries: Any = 5,
    ) -> None:
        if not (on_error in ("raise", "skip") or callable(on_error)):
            msg = f"on_error must be 'raise', 'skip' or a handler f(exc) -> bool, got {on_error!r}"
            raise ValueError(msg)
        max_member_bytes = check_optional_int("max_member_bytes", max_member_bytes, minimum=1)
        self.storage = Storage(storage_options, cache, prefetch, retries)
        self.shards = _resolve_shards(urls_or_paths, self.storage)
        self.decode = _check_decode(decode, max_pixels)
        self.on_error = on_error
        self.verify = _check_verify(verify)
        self.max_member_bytes = max_member_bytes
        self.shuffle_shards = bool(shuffle_shards)
        self.seed = check_int("seed", seed)
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self.skipped = 0
        self._init_stream(shuffle_buffer)

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch whose shard order the next iteration uses (with ``shuffle_shards``)."""
        self.epoch = check_int("epoch", epoch)

    # record positions, state_dict and shuffle_buffer: stoker.streams._records.RecordStream
    _skip_marker = SKIPPED

    def _record_order(self) -> list[int]:
        return _file_order(len(self.shards), self.shuffle_shards, self.seed, self.epoch)

    def _opened_files(self, order: list[int], first: int = 0) -> Any:
        return open_files(
            self.shards, order, self.storage, remote=self._remote, rank=self.rank,
            world_size=self.world_size, first=first,
        )  # fmt: skip

    def _open_records(
        self, shard_index: int, local: Any = None
    ) -> Iterator[dict[str, Any] | BadSample]:
        return self._read_shard(shard_index, local=local)

    def _finish_record(self, raw: dict[str, Any] | BadSample) -> Any:
        return self._decode(raw)

    def _remote(self, url: str) -> bool:
        """Whether ``url`` is downloaded through the cache (not streamed by urllib)."""
        return is_remote(url) and (not is_url(url) or self.storage.configured)

    def _read_shard(
        self, shard_index: int, local: Callable[[int], str] | None = None
    ) -> Iterator[dict[str, Any] | BadSample]:
        url = self.shards[shard_index]
        try:
            source = local(shard_index) if local is not None and self._remote(url) else None
            retry = self.storage.retry
            if self.verify == "open":
                check_shard(url, source, retry)
            yield from read_samples(
                url, max_member_bytes=self.max_member_bytes, source=source, retry=retry
            )
        except DatasetError as exc:
            self._handle(exc, "skipped the rest of a tar shard")

    def _handle(self, exc: Exception, what: str) -> None:
        """Raises ``exc`` or counts and logs it, as ``on_error`` says."""
        if self.on_error == "raise":
            raise exc
        if callable(self.on_error) and not self.on_error(exc):
            raise exc
        self.skipped += 1
        logger.warning("%s: %s", what, str(exc))  # a string: a record keeps no traceback alive

    def _decode(self, sample: dict[str, Any] | BadSample) -> Any:
        if isinstance(sample, BadSample):
            self._handle(sample.error(), "skipped a sample")
            return SKIPPED
        decode = self.decode
        if decode is None:
            return sample
        ext = "<sample>"
        try:
            if not isinstance(decode, dict):
                return decode(sample)
            out = {}
            for ext, value in sample.items():
                fn = (
                    None
                    if ext.startswith("__")
                    else decode.get(ext, decode.get(ext.rpartition(".")[2]))
                )
                out[ext] = value if fn is None else fn(value)
            return out
        except Exception as exc:
            what = f"the sample's {ext!r} file" if ext != "<sample>" else "the sample"
            msg = (
                f"tar shard {sample['__url__']!r}, sample {sample['__key__']!r}: cannot decode "
                f"{what}: {type(exc).__name__}: {exc}. Fix the sample, or pass on_error='skip' "
                "to skip samples that fail to decode."
            )
            error = DatasetError(msg)
            error.__cause__ = exc
            self._handle(error, "skipped a sample")
            return SKIPPED

    def __repr__(self) -> str:
        head = ", ".join(repr(self.shards[i]) for i in range(min(2, len(self.shards))))
        more = ", ..." if len(self.shards) > 2 else ""
        noun = "shard" if len(self.shards) == 1 else "shards"
        return f"TarShards({len(self.shards)} {noun}: [{head}{more}])"
