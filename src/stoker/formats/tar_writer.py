"""Writing WebDataset-style tar shards (read them with :class:`stoker.formats.tar.TarShards`).

A shard is a plain (or gzipped) tar file; a sample's files are consecutive members named
``<key>.<extension>``. Every shard is written under ``<path>.partial`` and renamed when it is
complete, and member metadata is fixed, so the same samples give byte-identical shards.
"""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from stoker._validate import check_int, check_optional_int

__all__ = ["IMAGE_EXTENSIONS", "write_tar_shards"]

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "ppm", "pgm", "pbm", "bmp", "gif", "tif", "tiff", "webp")


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
    if isinstance(value, np.ndarray) and kind in IMAGE_EXTENSIONS:
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
        msg = (
            f"sample {position} is a {type(sample).__name__}; write_tar_shards takes dicts of "
            "extension to data"
        )
        raise TypeError(msg)
    key = str(sample.get("__key__", f"{position:09d}"))
    if not key or "." in key.rpartition("/")[2] or key.startswith("/"):
        msg = (
            f"sample {position} has the key {key!r}; a key must be non-empty, relative and "
            "have no '.' in its name"
        )
        raise ValueError(msg)
    members = []
    for ext, value in sample.items():
        if ext.startswith("__"):
            continue
        if not isinstance(ext, str) or not ext or "/" in ext:
            msg = (
                f"sample {key!r} has the extension {ext!r}; extensions are non-empty names "
                "like 'jpg'"
            )
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
        >>> paths = write_tar_shards([{"txt": "hi"}] * 3, pattern, max_samples_per_shard=2)
        >>> [os.path.basename(p) for p in paths]
        ['part-00.tar', 'part-01.tar']
    """
    pattern = os.fspath(dst_pattern)
    if not re.search(r"%[-0 #+]*\d*d|\{[^}]*\}", pattern):
        msg = (
            "dst_pattern must hold a shard number placeholder like '%06d' or '{:06d}', got "
            f"{pattern!r}"
        )
        raise ValueError(msg)
    max_samples_per_shard = check_int("max_samples_per_shard", max_samples_per_shard, minimum=1)
    max_bytes_per_shard = check_optional_int("max_bytes_per_shard", max_bytes_per_shard, minimum=1)
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
                # open across samples until the shard is full: no with-block can hold it
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
