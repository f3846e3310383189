"""The packed format's layout, shared by the writer and the reader.

docs/packed-format.md is the specification; this module is its executable half: file
names, the manifest's keys, the record schema (which fields a record has and how each
is stored) and the columns of the per-shard index. Nothing here touches a file.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from stoker._errors import PackedFormatError

__all__ = [
    "ALIGN",
    "BLOB_KINDS",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "NPY_HEADER_BYTES",
    "PARTIAL_SUFFIX",
    "FieldSpec",
    "PackedFormatError",
    "Schema",
    "align_up",
    "fspath",
    "npy_header",
    "shard_file_names",
]

FORMAT_NAME = "stoker-packed"
FORMAT_VERSION = 2  # 2: the manifest carries its own checksum; version 1 is still read
MANIFEST_NAME = "manifest.json"
# Every file is first written under its final name plus this suffix and renamed when the
# whole dataset is finished; the manifest is renamed last.
PARTIAL_SUFFIX = ".partial"
# A shard's data file is a 1-D uint8 .npy (format 1.0) with a fixed-size header, so that
# the writer can stream records and fill in the final length when the shard is done.
NPY_HEADER_BYTES = 128
# Records, and array fields inside a record, start at multiples of this many bytes of
# the payload (the payload itself starts at byte 128 of the file, a multiple of 64), so
# an array view of any numpy dtype is aligned.
ALIGN = 16

BLOB_KINDS = frozenset({"bytes", "str", "array"})  # stored in the shard's data file
_SCALAR_DTYPES = {"int": np.dtype("<i8"), "float": np.dtype("<f8")}  # stored in the index
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def align_up(value: int, align: int = ALIGN) -> int:
    return -(-value // align) * align


def shard_file_names(shard: int) -> tuple[str, str, str]:
    """``(data, index, keys)`` file names of shard number ``shard``."""
    stem = f"shard-{shard:05d}"
    return f"{stem}.npy", f"{stem}.index.npy", f"{stem}.keys.npy"


def npy_header(payload_bytes: int) -> bytes:
    """The 128-byte .npy (1.0) header of a 1-D uint8 array of ``payload_bytes`` items."""
    text = f"{{'descr': '|u1', 'fortran_order': False, 'shape': ({payload_bytes},), }}"
    body = NPY_HEADER_BYTES - 10
    header = (
        b"\x93NUMPY\x01\x00"
        + struct.pack("<H", body)
        + (text.ljust(body - 1) + "\n").encode("latin1")
    )
    if len(header) != NPY_HEADER_BYTES:
        raise AssertionError(f"npy header is {len(header)} bytes, expected {NPY_HEADER_BYTES}")
    return header


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One field of a record.

    Attributes:
        name: the dict key (``str``) for dict records, the position (``int``) for tuple
            records, ``None`` for a record that is one bare value.
        kind: ``"bytes"``, ``"str"``, ``"array"``, ``"int"`` or ``"float"``.
        dtype: for arrays, numpy's ``dtype.str`` (byte order included, e.g. ``"<f4"``).
        ndim: for arrays, the number of dimensions (every record's array has this many;
            the shape itself may differ from record to record).
    """

    name: str | int | None
    kind: str
    dtype: str | None = None
    ndim: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "kind": self.kind}
        if self.kind == "array":
            out["dtype"], out["ndim"] = self.dtype, self.ndim
        return out

    @classmethod
    def from_json(cls, entry: Mapping[str, Any]) -> FieldSpec:
        return cls(entry["name"], entry["kind"], entry.get("dtype"), entry.get("ndim"))

    def describe(self) -> str:
        if self.kind == "array":
            return f"array(dtype={self.dtype}, ndim={self.ndim})"
        return self.kind


def _kind_of(value: Any) -> FieldSpec | None:
    """The field spec a value would get (with no name), or None if it cannot be stored."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return FieldSpec(None, "bytes")
    if isinstance(value, str):
        return FieldSpec(None, "str")
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject or value.dtype.fields is not None or value.dtype.kind in "OV":
            return None
        return FieldSpec(None, "array", value.dtype.str, value.ndim)
    if isinstance(value, (bool, np.bool_, int, np.integer)):
        return FieldSpec(None, "int")
    if isinstance(value, (float, np.floating)):
        return FieldSpec(None, "float")
    return None


_STORABLE = (
    "bytes-like (bytes, bytearray, memoryview), str, a numpy array of numbers, bools or "
    "fixed-size strings, int or float"
)


@dataclass(frozen=True, slots=True)
class Schema:
    """The fields of every record of a dataset, fixed by the first record written.

    ``layout`` is ``"single"`` (a record is one bare value), ``"tuple"`` or ``"dict"``.
    """

    layout: str
    fields: tuple[FieldSpec, ...]

    @classmethod
    def infer(cls, record: Any) -> Schema:
        if isinstance(record, Mapping):
            layout, items = "dict", list(record.items())
            for key, _ in items:
                if not isinstance(key, str):
                    msg = f"dict records need str keys (they are stored in JSON), got key {key!r}"
                    raise TypeError(msg)
        elif isinstance(record, tuple):
            layout, items = "tuple", list(enumerate(record))
        else:
            layout, items = "single", [(None, record)]
        fields = []
        for name, value in items:
            spec = _kind_of(value)
            if spec is None:
                where = "the record" if layout == "single" else f"field {name!r}"
                msg = (
                    f"{where} is a {type(value).__name__}, which a packed record cannot hold; "
                    f"each field must be {_STORABLE}. Encode it first (e.g. serialise to bytes)."
                )
                raise TypeError(msg)
            fields.append(FieldSpec(name, spec.kind, spec.dtype, spec.ndim))
        return cls(layout, tuple(fields))

    @classmethod
    def from_json(cls, entry: Mapping[str, Any]) -> Schema:
        return cls(entry["layout"], tuple(FieldSpec.from_json(f) for f in entry["fields"]))

    def to_json(self) -> dict[str, Any]:
        return {"layout": self.layout, "fields": [f.to_json() for f in self.fields]}

    def describe(self) -> str:
        if self.layout == "single":
            return self.fields[0].describe()
        parts = [f"{f.name!r}: {f.describe()}" for f in self.fields]
        return (
            ("{" + ", ".join(parts) + "}")
            if self.layout == "dict"
            else ("(" + ", ".join(parts) + ")")
        )

    def values(self, record: Any, position: int) -> list[Any]:
        """The record's field values in schema order, checked against the schema."""
        if self.layout == "dict":
            ok = (
                isinstance(record, Mapping)
                and len(record) == len(self.fields)
                and all(f.name in record for f in self.fields)
            )
            values = [record[f.name] for f in self.fields] if ok else []
        elif self.layout == "tuple":
            ok = isinstance(record, tuple) and len(record) == len(self.fields)
            values = list(record) if ok else []
        else:
            ok = not isinstance(record, (tuple, Mapping))
            values = [record]
        if not ok:
            msg = (
                f"record {position} does not match the dataset's schema {self.describe()} (fixed "
                f"by record 0): got {_short(record)}. Every record must have the same fields."
            )
            raise ValueError(msg)
        for field, value in zip(self.fields, values, strict=True):
            spec = _kind_of(value)
            same = spec is not None and spec.kind == field.kind
            if same and field.kind == "array":
                same = spec.dtype == field.dtype and spec.ndim == field.ndim  # type: ignore[union-attr]
            if not same:
                where = "the record" if self.layout == "single" else f"field {field.name!r}"
                got = "an unstorable value" if spec is None else spec.describe()
                msg = (
                    f"record {position}: {where} must be {field.describe()} like in record 0, "
                    f"got {got} ({_short(value)}). Convert it (e.g. arr.astype(...)) before "
                    "adding it."
                )
                raise TypeError(msg)
            if field.kind == "int" and not _INT64_MIN <= int(value) <= _INT64_MAX:
                msg = f"record {position}: int field {field.name!r} = {value} does not fit in int64"
                raise OverflowError(msg)
        return values

    def index_dtype(self) -> np.dtype:
        """The structured dtype of a shard's index: one row per record."""
        columns: list[tuple[Any, ...]] = [
            ("offset", "<i8"),
            ("length", "<i8"),
            ("crc32", "<u4"),
            ("key_offset", "<i8"),
            ("key_length", "<i8"),
        ]
        for k, field in enumerate(self.fields):
            if field.kind in BLOB_KINDS:
                columns += [(f"start{k}", "<i8"), (f"nbytes{k}", "<i8")]
                if field.kind == "array" and field.ndim:
                    columns.append((f"shape{k}", "<i8", (field.ndim,)))
            else:
                columns.append((f"value{k}", _SCALAR_DTYPES[field.kind].str))
        return np.dtype(columns)


def _short(value: Any, limit: int = 80) -> str:
    text = (
        repr(value)
        if not isinstance(value, np.ndarray)
        else f"array(shape={value.shape}, dtype={value.dtype})"
    )
    return text if len(text) <= limit else text[: limit - 3] + "..."


def fspath(path: Any, what: str) -> str:
    if isinstance(path, bytes) or not isinstance(path, (str, os.PathLike)):
        msg = f"{what} must be a str or os.PathLike path, got {type(path).__name__} {path!r}"
        raise TypeError(msg)
    return os.fspath(path)
