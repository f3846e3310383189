"""Gzip-compressed streams: their CRC-32 and length trailer, checked to the last byte.

A gzip file ends with the CRC-32 and the length of its uncompressed data; only reading it
to the end checks them. ``gzip.GzipFile`` does so when it reaches the end, so a reader
that stops early (``tarfile`` stops at the archive's end marker, before the compressed
stream's end) must drain the rest (:func:`drain`). A streaming reader learns about damage
only at the end, after it has delivered what it read; :func:`check_gzip` reads a whole
file first, for readers that must not deliver anything from a damaged file.
"""

from __future__ import annotations

import gzip
import os
import zlib
from typing import Any, BinaryIO

__all__ = [
    "EMPTY_GZIP",
    "GZIP_DAMAGE",
    "GZIP_ERRORS",
    "GZIP_MAGIC",
    "check_gzip",
    "drain",
    "is_gzip_name",
    "open_gzip",
]

GZIP_MAGIC = b"\x1f\x8b"
# What a damaged gzip stream raises: gzip.BadGzipFile (an OSError) for a bad header or
# trailer, EOFError for a stream that stops early, zlib.error for a garbled deflate block.
GZIP_DAMAGE = (gzip.BadGzipFile, EOFError, zlib.error)
# ... and what reading one can raise besides (a missing file, a failed read).
GZIP_ERRORS = (*GZIP_DAMAGE, OSError)
_CHUNK_BYTES = 1 << 20
# gzip.GzipFile reads an empty file as empty data, but a gzip file holds at least one
# member (a header and a trailer: 18 bytes); an empty one was cut off.
EMPTY_GZIP = "the file is empty, but even a gzip file of no data holds a 20-byte header and trailer"


def is_gzip_name(path: str) -> bool:
    return path.lower().endswith((".gz", ".tgz"))


def drain(stream: BinaryIO) -> int:
    """Reads ``stream`` to its end (where gzip checks its trailer); returns the bytes read."""
    total = 0
    while chunk := stream.read(_CHUNK_BYTES):
        total += len(chunk)
    return total


def open_gzip(path: str, mode: str = "rb", **kwargs: Any) -> Any:
    """``gzip.open(path, mode, **kwargs)``, refusing an empty file (an EOFError)."""
    if os.path.getsize(path) == 0:
        raise EOFError(EMPTY_GZIP)
    return gzip.open(path, mode, **kwargs)


def check_gzip(path: str) -> None:
    """Decompresses the whole gzip file ``path``, discarding the data; raises if it is damaged.

    Raises:
        OSError, EOFError, zlib.error: the file is truncated, its data do not match its
            CRC-32 or length, or it is not gzip data (see :data:`GZIP_ERRORS`).
    """
    with open_gzip(path) as stream:
        drain(stream)
