"""WebDataset-style tar shards: a streaming reader and a writer.

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
counts it and moves on to the next shard.

Example:
    >>> import os, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> samples = [{"__key__": f"{i:04d}", "cls": i % 2, "txt": f"sample {i}"} for i in range(5)]
    >>> paths = write_tar_shards(samples, os.path.join(folder, "shard-%03d.tar"), max_samples_per_shard=2)
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
import tarfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, BinaryIO

import numpy as np

from stoker._errors import DatasetError
from stoker.compact import StringArray
from stoker.datasets import IterableDataset
from stoker.formats.text import _check_epoch, _check_seed, _file_order, _resolve_files
from stoker.sharding import shard_records

__all__ = ["TarShards", "default_decoders", "write_tar_shards"]

logger = logging.getLogger("stoker")

_TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz")
_URL_SCHEMES = ("http://", "https://", "file://")
_URL_TIMEOUT_S = 60
_BRACES = re.compile(r"\{(\d+)\.\.(\d+)\}")
_IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "ppm", "pgm", "pbm", "bmp", "gif", "tif", "tiff", "webp")
_SKIPPED = object()

Decoder = Callable[[bytes], Any]


# -- decoding ------------------------------------------------------------------------
def _decode_int(data: bytes) -> int:
    return int(data.decode("utf-8").strip())


def _decode_text(data: bytes) -> str:
    return data.decode("utf-8")


def _decode_npy(data: bytes) -> np.ndarray:
    return np.load(io.BytesIO(data), allow_pickle=False)


def _decode_npz(data: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


def _decode_image(data: bytes) -> np.ndarray:
    """An ``H x W x 3`` uint8 RGB array (simplejpeg for JPEG when present, else Pillow)."""
    if data[:3] == b"\xff\xd8\xff" and importlib.util.find_spec("simplejpeg") is not None:
        import simplejpeg

        try:
            return simplejpeg.decode_jpeg(data, colorspace="RGB")
        except ValueError:
            pass  # a JPEG simplejpeg does not support (CMYK, ...): Pillow decides
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("RGB"))


def default_decoders() -> dict[str, Decoder]:
    """The decoders ``decode=True`` uses, by extension; extend or override a copy.

    ``cls`` / ``cls2`` / ``index`` / ``id`` become ``int``, ``txt`` / ``text`` ``str``,
    ``json`` the parsed value, ``npy`` an array, ``npz`` a dict of arrays, and images
    (``jpg``, ``png``, ``webp``, ...) an ``H x W x 3`` uint8 RGB array when Pillow is
    installed (without it they stay bytes). Other extensions stay bytes.

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
        decoders.update(dict.fromkeys(_IMAGE_EXTENSIONS, _decode_image))
    return decoders


def _check_decode(decode: Any) -> Callable[[dict[str, Any]], Any] | dict[str, Decoder] | None:
    if decode is None or decode is False:
        return None
    if decode is True:
        return default_decoders()
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
class _CheckedTarInfo(tarfile.TarInfo):
    """Remembers why ``tarfile`` stopped, so a shard that simply stops is caught.

    ``tarfile`` ends an archive without complaint at a missing, truncated or garbled
    header after the first; only a zero block is a proper end.
    """

    @classmethod
    def fromtarfile(cls, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        try:
            return super().fromtarfile(tarfile_)
        except tarfile.HeaderError as exc:
            tarfile_._stoker_stop = exc  # type: ignore[attr-defined]
            raise


def _split_name(name: str) -> tuple[str, str] | None:
    """``(key, extension)`` of a member name (extension lower-cased, as webdataset does),
    or None for a name to ignore."""
    folder, _, base = name.rpartition("/")
    key, dot, ext = base.partition(".")
    if not dot or not key or not ext:  # no extension, or a hidden file such as ._000.jpg
        return None
    return (f"{folder}/{key}" if folder else key), ext.lower()


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


def _is_url(spec: str) -> bool:
    return spec.startswith(_URL_SCHEMES)


def _resolve_shards(urls_or_paths: Any) -> StringArray:
    if isinstance(urls_or_paths, str) and (_BRACES.search(urls_or_paths) or _is_url(urls_or_paths)):
        urls_or_paths = _expand_braces(urls_or_paths)
    return _resolve_files(
        urls_or_paths,
        owner="TarShards",
        suffixes=_TAR_SUFFIXES,
        must_exist=lambda s: not _is_url(s),
    )


def _open_stream(url: str) -> BinaryIO:
    import urllib.parse
    import urllib.request

    if url.startswith("file://"):
        return open(urllib.request.url2pathname(urllib.parse.urlparse(url).path), "rb")
    if _is_url(url):
        return urllib.request.urlopen(url, timeout=_URL_TIMEOUT_S)  # type: ignore[no-any-return]
    return open(url, "rb")


def _raw_samples(url: str) -> Iterator[dict[str, Any]]:
    """The samples of one shard, as bytes, in tar order; raises DatasetError if it is bad."""
    stream = None
    try:
        stream = _open_stream(url)
        with tarfile.open(fileobj=stream, mode="r|*", tarinfo=_CheckedTarInfo) as archive:
            sample: dict[str, Any] | None = None
            for member in archive:
                if not member.isfile():
                    continue
                split = _split_name(member.name)
                if split is None:
                    continue
                key, ext = split
                extracted = archive.extractfile(member)
                if extracted is None:
                    raise AssertionError(
                        f"tarfile returned no data for the file member {member.name!r}"
                    )
                data = extracted.read()
                if sample is None or sample["__key__"] != key:
                    if sample is not None:
                        yield sample
                    sample = {"__key__": key, "__url__": url}
                elif ext in sample:
                    msg = (
                        f"tar shard {url!r} holds {member.name!r} twice in one sample; every "
                        "file of a sample needs its own extension"
                    )
                    raise DatasetError(msg)
                sample[ext] = data
            stop = getattr(archive, "_stoker_stop", None)
            if not isinstance(stop, tarfile.EOFHeaderError):
                detail = (
                    f"{type(stop).__name__}: {stop}"
                    if stop is not None
                    else "no end-of-archive marker"
                )
                raise tarfile.ReadError(f"the archive stops without its end marker ({detail})")
            if sample is not None:
                yield sample
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        msg = (
            f"tar shard {url!r} is truncated or corrupt: {type(exc).__name__}: {exc}. "
            "Rewrite or remove the shard, or pass on_error='skip' to skip what is left of it."
        )
        raise DatasetError(msg) from exc
    finally:
        if stream is not None:
            stream.close()


class TarShards(IterableDataset[dict[str, Any]]):
    """Samples from WebDataset-style tar shards, streamed and split over ranks and workers.

    Args:
        urls_or_paths: a list of shard paths or URLs, a glob pattern, a directory (its
            ``.tar``, ``.tar.gz`` and ``.tgz`` files, sorted) or a brace pattern such
            as ``"shards/train-{000000..000127}.tar"``. URLs may be ``file://``,
            ``http://`` or ``https://``.
        decode: ``None`` keeps every file as bytes; ``True`` decodes by extension with
            :func:`default_decoders`; a dict maps extensions to functions of the
            bytes (the others stay bytes; an extension like ``seg.png`` uses the
            ``png`` entry); a function receives the whole sample dict and returns the
            sample.
        on_error: ``"raise"`` (default), ``"skip"``, or a handler ``f(exc) -> bool``
            (webdataset's convention: return True to skip and go on, False to raise).
            It covers truncated or corrupt shards (the rest of the shard is skipped)
            and samples that fail to decode. Skips are logged on the ``stoker`` logger
            and counted in :attr:`skipped`.
        shuffle_shards: shuffle the shard order every epoch from ``(seed, epoch)``;
            :class:`stoker.DataLoader` calls :meth:`set_epoch` itself.
        seed: seeds that shuffle.
        rank, world_size: fix the distributed topology instead of finding it when
            iteration starts.

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
        shuffle_shards: bool = False,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        if not (on_error in ("raise", "skip") or callable(on_error)):
            msg = f"on_error must be 'raise', 'skip' or a handler f(exc) -> bool, got {on_error!r}"
            raise ValueError(msg)
        self.shards = _resolve_shards(urls_or_paths)
        self.decode = _check_decode(decode)
        self.on_error = on_error
        self.shuffle_shards = bool(shuffle_shards)
        self.seed = _check_seed(seed)
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self.skipped = 0

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch whose shard order the next iteration uses (with ``shuffle_shards``)."""
        self.epoch = _check_epoch(epoch)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        order = _file_order(len(self.shards), self.shuffle_shards, self.seed, self.epoch)
        for sample in shard_records(
            order, self._read_shard, rank=self.rank, world_size=self.world_size
        ):
            decoded = self._decode(sample)
            if decoded is not _SKIPPED:
                yield decoded

    def _read_shard(self, shard_index: int) -> Iterator[dict[str, Any]]:
        try:
            yield from _raw_samples(self.shards[shard_index])
        except DatasetError as exc:
            self._handle(exc, "skipped the rest of a tar shard")

    def _handle(self, exc: Exception, what: str) -> None:
        """Raises ``exc`` or counts and logs it, as ``on_error`` says."""
        if self.on_error == "raise":
            raise exc
        if callable(self.on_error) and not self.on_error(exc):
            raise exc
        self.skipped += 1
        logger.warning("%s: %s", what, exc)

    def _decode(self, sample: dict[str, Any]) -> Any:
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
            return _SKIPPED

    def __repr__(self) -> str:
        head = ", ".join(repr(self.shards[i]) for i in range(min(2, len(self.shards))))
        more = ", ..." if len(self.shards) > 2 else ""
        noun = "shard" if len(self.shards) == 1 else "shards"
        return f"TarShards({len(self.shards)} {noun}: [{head}{more}])"


# -- writing -------------------------------------------------------------------------
def _shard_name(pattern: str, number: int) -> str:
    if "%" in pattern:
        return pattern % number
    return pattern.format(number)


def _encode(key: str, ext: str, value: Any) -> bytes:
    kind = ext.lower().rpartition(".")[2]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if kind in ("json", "jsn"):
        return json.dumps(value).encode("utf-8")
    if isinstance(value, np.ndarray) and kind == "npy":
        buffer = io.BytesIO()
        np.save(buffer, value, allow_pickle=False)
        return buffer.getvalue()
    if isinstance(value, np.ndarray) and kind in _IMAGE_EXTENSIONS:
        from PIL import Image

        buffer = io.BytesIO()
        Image.fromarray(value).save(buffer, format=Image.registered_extensions()[f".{kind}"])
        return buffer.getvalue()
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        return str(value).encode("utf-8")
    msg = (
        f"sample {key!r}: cannot write {type(value).__name__} as {ext!r}. Pass bytes or str, a "
        "number, a JSON value under 'json', or a numpy array under 'npy' or an image extension."
    )
    raise TypeError(msg)


def _sample_members(
    sample: Mapping[str, Any], position: int
) -> tuple[str, list[tuple[str, bytes]]]:
    if not isinstance(sample, Mapping):
        msg = f"sample {position} is a {type(sample).__name__}; write_tar_shards takes dicts of extension to data"
        raise TypeError(msg)
    key = str(sample.get("__key__", f"{position:09d}"))
    if not key or "." in key.rpartition("/")[2] or key.startswith("/"):
        msg = f"sample {position} has the key {key!r}; a key must be non-empty, relative and have no '.' in its name"
        raise ValueError(msg)
    members = []
    for ext, value in sample.items():
        if ext.startswith("__"):
            continue
        if not isinstance(ext, str) or not ext or "/" in ext:
            msg = f"sample {key!r} has the extension {ext!r}; extensions are non-empty names like 'jpg'"
            raise ValueError(msg)
        members.append((f"{key}.{ext}", _encode(key, ext, value)))
    if not members:
        msg = f"sample {key!r} has no files (only '__' entries); give it at least one extension"
        raise ValueError(msg)
    return key, members


def write_tar_shards(
    samples: Iterable[Mapping[str, Any]],
    dst_pattern: str | os.PathLike[str],
    *,
    max_samples_per_shard: int = 1000,
    max_bytes_per_shard: int | None = None,
) -> list[str]:
    """Writes samples into WebDataset-style tar shards; returns the shard paths.

    Each shard is written to ``<path>.partial`` and renamed into place once complete,
    so an interrupted run never leaves a shard that looks whole. Member metadata is
    fixed (mtime 0, uid 0), so the same samples give byte-identical shards.

    Args:
        samples: dicts of extension to data, with an optional ``"__key__"`` (default:
            the sample's position, zero-padded). Values: bytes, str, numbers, JSON
            values under ``json``, arrays under ``npy`` (or an image extension, encoded
            with Pillow).
        dst_pattern: the shard path with a number placeholder: ``"out/train-%06d.tar"``
            or ``"out/train-{:06d}.tar"``; a ``.gz`` / ``.tgz`` name is gzipped.
        max_samples_per_shard: start a new shard after this many samples.
        max_bytes_per_shard: also start one once a shard holds this many bytes of data.

    Example:
        >>> import os, tempfile
        >>> pattern = os.path.join(tempfile.mkdtemp(), "part-{:02d}.tar")
        >>> [os.path.basename(p) for p in write_tar_shards([{"txt": "hi"}] * 3, pattern, max_samples_per_shard=2)]
        ['part-00.tar', 'part-01.tar']
    """
    pattern = os.fspath(dst_pattern)
    if not re.search(r"%[-0 #+]*\d*d|\{[^}]*\}", pattern):
        msg = f"dst_pattern must hold a shard number placeholder like '%06d' or '{{:06d}}', got {pattern!r}"
        raise ValueError(msg)
    if (
        isinstance(max_samples_per_shard, bool)
        or not isinstance(max_samples_per_shard, int)
        or max_samples_per_shard < 1
    ):
        msg = f"max_samples_per_shard must be a positive integer, got {max_samples_per_shard!r}"
        raise ValueError(msg)
    if max_bytes_per_shard is not None and (
        isinstance(max_bytes_per_shard, bool)
        or not isinstance(max_bytes_per_shard, int)
        or max_bytes_per_shard < 1
    ):
        msg = f"max_bytes_per_shard must be a positive integer or None, got {max_bytes_per_shard!r}"
        raise ValueError(msg)
    written: list[str] = []
    archive: tarfile.TarFile | None = None
    partial = path = previous = ""
    count = size = 0
    try:
        for position, sample in enumerate(samples):
            key, members = _sample_members(sample, position)
            if key == previous:
                msg = (
                    f"samples {position - 1} and {position} share the key {key!r}; a reader would "
                    "merge them into one sample. Give every sample its own __key__."
                )
                raise ValueError(msg)
            previous = key
            full = archive is not None and (
                count >= max_samples_per_shard
                or (max_bytes_per_shard is not None and size >= max_bytes_per_shard)
            )
            if full:
                archive.close()  # type: ignore[union-attr]
                os.replace(partial, path)
                written.append(path)
                archive = None
            if archive is None:
                path = _shard_name(pattern, len(written))
                partial = path + ".partial"
                os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
                gz = path.lower().endswith((".gz", ".tgz"))
                # closed when the shard is full, at the end, or in the finally below
                archive = tarfile.open(partial, "w:gz" if gz else "w", format=tarfile.PAX_FORMAT)  # noqa: SIM115
                count = size = 0
            for name, data in members:
                info = tarfile.TarInfo(name)
                info.size, info.mtime, info.mode = len(data), 0, 0o444
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                archive.addfile(info, io.BytesIO(data))
                size += len(data)
            count += 1
        if archive is not None:
            archive.close()
            os.replace(partial, path)
            written.append(path)
            archive = None
    finally:
        if archive is not None:
            archive.close()
            os.remove(partial)
    return written
