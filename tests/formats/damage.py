"""Damaging real files on purpose: single flipped bits and truncations, undone afterwards."""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

__all__ = ["bits_to_try", "flipped", "silent_deflate_flips", "truncated"]

_GZIP_HEADER_BYTES = 10  # gzip.compress writes no optional fields
_GZIP_TRAILER_BYTES = 8


def bits_to_try(nbits: int, most: int, seed: int = 0) -> list[int]:
    """Every bit when there are at most ``most``, else a fixed random sample of ``most``."""
    if nbits <= most:
        return list(range(nbits))
    return sorted(np.random.default_rng(seed).choice(nbits, most, replace=False).tolist())


@contextmanager
def flipped(path: str | os.PathLike[str], bit: int) -> Iterator[None]:
    """Flips bit ``bit`` of the file (bit 0 is the lowest bit of byte 0) until the block ends."""
    with open(path, "r+b") as f:
        f.seek(bit // 8)
        byte = f.read(1)[0]
        f.seek(bit // 8)
        f.write(bytes([byte ^ (1 << (bit % 8))]))
    try:
        yield
    finally:
        with open(path, "r+b") as f:
            f.seek(bit // 8)
            f.write(bytes([byte]))


@contextmanager
def truncated(path: str | os.PathLike[str], size: int) -> Iterator[None]:
    """Cuts the file to ``size`` bytes until the block ends."""
    with open(path, "rb") as f:
        whole = f.read()
    with open(path, "r+b") as f:
        f.truncate(size)
    try:
        yield
    finally:
        with open(path, "wb") as f:
            f.write(whole)


def silent_deflate_flips(compressed: bytes) -> list[int]:
    """Bits of a one-member gzip file whose flip still inflates cleanly, to other data.

    These are the flips that only the gzip trailer (CRC-32 and length) can reveal.
    """
    body = compressed[_GZIP_HEADER_BYTES:-_GZIP_TRAILER_BYTES]
    original = zlib.decompress(body, -15)
    found = []
    for bit in range(len(body) * 8):
        damaged = bytearray(body)
        damaged[bit // 8] ^= 1 << (bit % 8)
        inflater = zlib.decompressobj(-15)
        try:
            data = inflater.decompress(bytes(damaged))
        except zlib.error:
            continue
        if inflater.eof and not inflater.unused_data and data != original:
            found.append(bit + _GZIP_HEADER_BYTES * 8)
    return found
