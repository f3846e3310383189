"""Reading a ``.npy`` header without trusting it.

``np.load`` believes the header: it allocates what the shape declares before it reads any
data, and for an object dtype it answers with advice about ``allow_pickle``. Readers of
files they did not write parse the header with ``numpy.lib.format`` first and compare it
with what they expect (and with the bytes actually there) before building the array.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

__all__ = ["NpyHeader", "read_npy_header"]


@dataclass(frozen=True, slots=True)
class NpyHeader:
    """What a ``.npy`` header declares, and where its data start."""

    dtype: np.dtype
    shape: tuple[int, ...]
    fortran_order: bool
    offset: int

    @property
    def data_bytes(self) -> int:
        """How many bytes of data the header declares."""
        return int(np.prod(self.shape, dtype=object)) * self.dtype.itemsize


def read_npy_header(stream: BinaryIO) -> NpyHeader:
    """The header at ``stream``'s position (format 1.0 or 2.0).

    Raises:
        ValueError: the header is damaged or not a ``.npy`` header; the message says how.
    """
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream)
        else:
            raise ValueError(f"unknown .npy format version {version}")
    except Exception as exc:  # numpy raises ValueError, SyntaxError, ... for a damaged header
        raise ValueError(f"{type(exc).__name__}: {exc}") from None
    return NpyHeader(dtype, tuple(shape), bool(fortran), stream.tell())
