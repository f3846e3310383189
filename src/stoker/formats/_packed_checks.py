"""What the packed reader checks in a shard's files before it trusts them.

Every file a manifest names is a regular file whose size is checked before it is read. An
index or keys file must match the size and crc32 the manifest gives, and its ``.npy``
header must describe exactly the array the schema implies; headers are parsed with
``numpy.lib.format`` and compared, never loaded blindly, so a damaged header is reported as
damage (naming the file) and never ends in numpy's advice about pickles. A data file's header
must describe the ``uint8`` payload of the size the manifest gives.

Then each index entry's extents are checked against its shard, vectorised over the whole
index: a record lies inside the payload, starts on the alignment, does not overlap the one
before; each field lies inside its own record; an array field's shape times its item size
is its byte count; a key lies inside the keys file. So an index rewritten with a matching
crc32 still cannot point a field into another record, or a view past the mapping.
"""

from __future__ import annotations

import io
import os
import stat
import zlib
from collections.abc import Mapping
from typing import Any, BinaryIO

import numpy as np

from stoker.formats._npy import read_npy_header
from stoker.formats._packed_manifest import read_regular_file, regular_file_size
from stoker.formats._packed_spec import ALIGN, BLOB_KINDS, PackedFormatError, Schema

__all__ = ["check_data_file", "check_index", "load_npy", "map_payload"]

_UINT8 = np.dtype(np.uint8)
_REWRITE = "write the dataset again (stoker pack / PackedWriter)"


def _npy_header(stream: BinaryIO, path: str, what: str) -> tuple[np.dtype, tuple[int, ...], int]:
    """``(dtype, shape, data offset)`` of a C-ordered ``.npy`` file, or PackedFormatError."""
    try:
        header = read_npy_header(stream)
    except ValueError as exc:
        msg = f"{what} {path!r} has a damaged .npy header ({exc}): {_REWRITE}"
        raise PackedFormatError(msg) from None
    if header.fortran_order:
        msg = f"{what} {path!r} has a damaged .npy header (it claims Fortran order): {_REWRITE}"
        raise PackedFormatError(msg)
    return header.dtype, header.shape, header.offset


def _wrong_array(
    path: str, what: str, got: tuple[Any, Any], expected: tuple[Any, Any]
) -> PackedFormatError:
    msg = (
        f"{what} {path!r} holds {got[0]} of shape {got[1]}, but the manifest describes "
        f"{expected[0]} of shape {expected[1]}: it is damaged; {_REWRITE}"
    )
    return PackedFormatError(msg)


def load_npy(
    path: str, size: int, crc: int, what: str, dtype: np.dtype, shape: tuple[int, ...] | None
) -> np.ndarray:
    """The array in an index or keys file, checked against the manifest's size and crc32
    and the dtype and shape the schema gives (``None``: 1-D, any length); a read-only view
    of the file's bytes."""
    raw = read_regular_file(path, what, size)
    actual = zlib.crc32(raw)
    if actual != crc:
        msg = (
            f"{what} {path!r} fails its checksum (crc32 0x{actual:08x}, manifest 0x{crc:08x}): "
            f"it is damaged; {_REWRITE}"
        )
        raise PackedFormatError(msg)
    got_dtype, got_shape, offset = _npy_header(io.BytesIO(raw), path, what)
    if shape is None and len(got_shape) != 1:
        raise _wrong_array(path, what, (got_dtype, got_shape), (dtype, "(n,)"))
    shape = got_shape if shape is None else shape
    if (
        got_dtype != dtype
        or got_shape != shape
        or offset + dtype.itemsize * int(np.prod(shape)) != len(raw)
    ):
        raise _wrong_array(path, what, (got_dtype, got_shape), (dtype, shape))
    return np.frombuffer(raw, dtype=dtype, count=int(np.prod(shape)), offset=offset).reshape(shape)


def _data_offset(path: str, shard: Mapping[str, Any]) -> int:
    """Where the payload starts in a data file, after checking its header."""
    with open(path, "rb") as f:
        dtype, shape, offset = _npy_header(f, path, "shard data file")
    if dtype != _UINT8 or shape != (shard["data_bytes"],):
        raise _wrong_array(
            path, "shard data file", (dtype, shape), (_UINT8, (shard["data_bytes"],))
        )
    if offset + shard["data_bytes"] != shard["data_file_bytes"]:
        msg = (
            f"shard data file {path!r} has a {offset}-byte header, so its {shard['data_bytes']} "
            f"bytes of data do not make the {shard['data_file_bytes']} bytes the manifest gives: "
            f"it is damaged; {_REWRITE}"
        )
        raise PackedFormatError(msg)
    return offset


def check_data_file(path: str, shard: Mapping[str, Any], index: np.ndarray, first: int) -> None:
    """A data file is a regular file of the size the manifest gives, with the right header."""
    size = regular_file_size(path, "shard data file", f"({shard['records']} records)")
    expected = shard["data_file_bytes"]
    if size < expected:
        payload = size - (expected - shard["data_bytes"])
        ends = index["offset"] + index["length"]
        cut = np.flatnonzero(ends > payload)
        local = int(cut[0]) if cut.size else len(ends)
        msg = (
            f"shard {path!r} is truncated: {size} bytes on disk, the manifest says {expected}. "
            f"Record {local} of this shard (dataset index {first + local}) and the "
            f"{max(0, len(ends) - local - 1)} after it are cut off. Copy the file again or "
            "re-create the dataset."
        )
        raise PackedFormatError(msg)
    if size > expected:
        msg = (
            f"shard {path!r} is {size} bytes but the manifest says {expected}: it was modified "
            "after the dataset was written; re-create the dataset"
        )
        raise PackedFormatError(msg)
    _data_offset(path, shard)


def map_payload(path: str, shard: Mapping[str, Any]) -> np.ndarray:
    """A shard's payload as a read-only uint8 array over a memory mapping of its data file."""
    expected = shard["data_bytes"]
    if expected == 0:  # mmap cannot map an empty payload
        array = np.zeros(0, dtype=np.uint8)
        array.flags.writeable = False
        return array
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode) or info.st_size != shard["data_file_bytes"]:
            raise ValueError(f"it is now {info.st_size} bytes, not {shard['data_file_bytes']}")
        offset = _data_offset(path, shard)
        mapped = np.memmap(path, dtype=np.uint8, mode="r", offset=offset, shape=(expected,))
    except (OSError, ValueError, PackedFormatError) as exc:
        msg = (
            f"cannot memory-map shard {path!r}: {exc}. The file changed since the dataset was "
            "opened."
        )
        raise PackedFormatError(msg) from exc
    return mapped.view(np.ndarray)


class _Extents:
    """Reports the first index entry that a mask marks as wrong, naming its record."""

    def __init__(self, path: str, first: int) -> None:
        self.path, self.first = path, first

    def check(self, bad: np.ndarray, problem: str, *values: np.ndarray) -> None:
        where = np.flatnonzero(bad)
        if where.size == 0:
            return
        j = int(where[0])
        shown = ", ".join(str(v[j].tolist()) for v in values)
        msg = (
            f"the index of {self.path!r} is damaged: record {j} of this shard (dataset index "
            f"{self.first + j}) {problem} ({shown}); {_REWRITE}"
        )
        raise PackedFormatError(msg)


def _outside(start: np.ndarray, size: np.ndarray, end: Any) -> np.ndarray:
    """Where ``[start, start + size)`` is not inside ``[0, end)`` (no int64 overflow)."""
    return (start < 0) | (size < 0) | (start > end) | (size > end - start)


def check_index(
    index: np.ndarray, schema: Schema, data_bytes: int, keys_bytes: int, path: str, first: int
) -> None:
    """Every entry's extents lie where the format puts them (see the module docstring)."""
    if len(index) == 0:
        return
    extents = _Extents(path, first)
    offset, length = index["offset"], index["length"]
    extents.check(
        _outside(offset, length, data_bytes),
        f"does not lie inside the shard's {data_bytes}-byte payload (offset, length)",
        offset,
        length,
    )
    extents.check(offset % ALIGN != 0, f"does not start on a multiple of {ALIGN} (offset)", offset)
    ends = offset + length
    overlap = np.zeros(len(index), dtype=bool)
    overlap[1:] = offset[1:] < ends[:-1]
    extents.check(overlap, "starts before the record before it ends (offset)", offset)
    key_offset, key_length = index["key_offset"], index["key_length"]
    extents.check(
        _outside(key_offset, key_length, keys_bytes),
        f"has a key outside the {keys_bytes}-byte keys file (key_offset, key_length)",
        key_offset,
        key_length,
    )
    blob_end = np.zeros(len(index), dtype=np.int64)
    for k, field in enumerate(schema.fields):
        if field.kind not in BLOB_KINDS:
            continue
        start, nbytes = index[f"start{k}"], index[f"nbytes{k}"]
        extents.check(
            _outside(start, nbytes, length),
            f"has field {field.name!r} outside the record (start, nbytes, length)",
            start,
            nbytes,
            length,
        )
        blob_end = start + nbytes
        if field.kind == "array":
            _check_array_field(
                extents, index, k, field.name, np.dtype(field.dtype), field.ndim or 0, data_bytes
            )
    extents.check(
        blob_end != length, "has a length that is not where its last field ends (length)", length
    )


def _check_array_field(
    extents: _Extents,
    index: np.ndarray,
    k: int,
    name: Any,
    dtype: np.dtype,
    ndim: int,
    data_bytes: int,
) -> None:
    start, nbytes = index[f"start{k}"], index[f"nbytes{k}"]
    extents.check(
        start % ALIGN != 0,
        f"has array field {name!r} off the {ALIGN}-byte alignment (start)",
        start,
    )
    if ndim:
        shape = index[f"shape{k}"].reshape(len(index), ndim)
        negative = (shape < 0).any(axis=1)
        extents.check(
            negative, f"has array field {name!r} with a negative dimension (shape)", shape
        )
        # dims beyond the payload cannot multiply to a real size; clipping keeps floats exact
        items = np.minimum(shape, data_bytes + 1).astype(np.float64).prod(axis=1)
    else:
        shape, items = nbytes, np.ones(len(index))
    extents.check(
        items * dtype.itemsize != nbytes,
        f"has array field {name!r} whose shape times the item size ({dtype.itemsize}) is not its "
        "byte count (shape, nbytes)",
        shape,
        nbytes,
    )
