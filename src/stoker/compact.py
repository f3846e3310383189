"""Compact, copy-on-read-free containers for dataset metadata.

Why: a forked worker shares its parent's memory until it writes to a page. Reading a
Python object writes to it (its reference count), so a dataset that keeps one million
file paths in a ``list`` slowly gets a private copy of every page of them in every
worker: memory climbs through the epoch (torch issue 13246). Numpy arrays of plain
numbers have one object header and a buffer that reads never touch, so they stay shared.

:class:`StringArray` stores strings (or paths, or bytes) as one byte buffer plus int64
offsets; :class:`RecordArray` stores small records column by column. Both behave like the
list they replace (``len``, indexing, slicing, iteration, ``==``), pickle as a few arrays,
and cost a fraction of the list's memory::

    paths = StringArray(paths)                 # instead of a list of str
    items = RecordArray(items)                 # instead of a list of (path, label) tuples
    items = compact(items)                     # picks the right one

Example:
    >>> names = StringArray(["cat.jpg", "dog.jpg", "émeu.png"])
    >>> names[2], len(names), names[-1:].tolist()
    ('émeu.png', 3, ['émeu.png'])
    >>> rows = RecordArray([("a.jpg", 0), ("b.jpg", 1)])
    >>> rows[1]
    ('b.jpg', 1)
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, overload

import numpy as np

from stoker._index import normalize_index

__all__ = ["RecordArray", "StringArray", "compact"]

_OR_SLICE = "a slice selects several"


class StringArray(Sequence[Any]):
    """An immutable sequence of ``str`` (or ``bytes``) in one buffer with int64 offsets.

    Args:
        items: strings, ``os.PathLike`` objects (stored as their ``os.fspath``) or bytes.
            All must be text, or all bytes.
        encoding: how text is stored (default UTF-8; any name is kept exactly).

    Example:
        >>> s = StringArray(["a", "bb"]); s[1], s.nbytes
        ('bb', 27)
    """

    __slots__ = ("_data", "_encoding", "_offsets")

    def __init__(self, items: Iterable[Any] = (), *, encoding: str | None = "utf-8") -> None:
        if isinstance(items, StringArray):
            self._data, self._offsets, self._encoding = items._data, items._offsets, items._encoding
            return
        encoded: list[bytes] = []
        text: bool | None = None
        for position, item in enumerate(items):
            if isinstance(item, (str, os.PathLike)):
                value = os.fspath(item)
                is_text = isinstance(value, str)
            elif isinstance(item, (bytes, bytearray, memoryview)):
                value, is_text = bytes(item), False
            else:
                msg = (
                    f"StringArray holds str, os.PathLike or bytes items; item {position} is a "
                    f"{type(item).__name__}: {item!r}. Convert it with str() first, or use "
                    "RecordArray for records."
                )
                raise TypeError(msg)
            if text is None:
                text = is_text
            elif text != is_text:
                msg = (
                    f"StringArray items must be all text or all bytes; item {position} is "
                    f"{'text' if is_text else 'bytes'} but item 0 is {'text' if text else 'bytes'}"
                )
                raise TypeError(msg)
            encoded.append(
                value.encode(encoding or "utf-8", "surrogateescape") if is_text else value
            )  # type: ignore[union-attr]
        lengths = np.fromiter((len(b) for b in encoded), dtype=np.int64, count=len(encoded))
        self._offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum(lengths, out=self._offsets[1:])
        self._data = np.frombuffer(b"".join(encoded), dtype=np.uint8).copy()
        self._encoding = (encoding or "utf-8") if (text or text is None) else None

    @classmethod
    def from_arrays(
        cls, data: np.ndarray, offsets: np.ndarray, *, encoding: str | None = "utf-8"
    ) -> StringArray:
        """Builds one over an existing byte buffer and ``len + 1`` offsets (no copy)."""
        offsets = np.asarray(offsets, dtype=np.int64)
        if (
            offsets.ndim != 1
            or len(offsets) == 0
            or offsets[0] != 0
            or np.any(np.diff(offsets) < 0)
        ):
            msg = "offsets must be a 1-D, non-decreasing int64 array starting at 0"
            raise ValueError(msg)
        if offsets[-1] > len(data):
            msg = f"offsets end at {int(offsets[-1])} but the buffer holds {len(data)} bytes"
            raise ValueError(msg)
        self = cls.__new__(cls)
        self._data = np.asarray(data, dtype=np.uint8)
        self._offsets = offsets
        self._encoding = encoding
        return self

    @property
    def nbytes(self) -> int:
        """Bytes held: the buffer plus the offsets."""
        return int(self._data.nbytes + self._offsets.nbytes)

    @property
    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """``(data, offsets)``: the two arrays behind the sequence."""
        return self._data, self._offsets

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def _item(self, i: int) -> Any:
        raw = self._data[self._offsets[i] : self._offsets[i + 1]].tobytes()
        return raw.decode(self._encoding, "surrogateescape") if self._encoding else raw

    @overload
    def __getitem__(self, index: int) -> Any: ...
    @overload
    def __getitem__(self, index: slice) -> StringArray: ...
    def __getitem__(self, index: Any) -> Any:
        n = len(self)
        if isinstance(index, slice):
            return StringArray(
                [self._item(i) for i in range(*index.indices(n))], encoding=self._encoding
            )
        return self._item(normalize_index(index, n, "StringArray", hint=_OR_SLICE))

    def __iter__(self) -> Iterator[Any]:
        for i in range(len(self)):
            yield self._item(i)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StringArray):
            return (
                self._encoding == other._encoding
                and np.array_equal(self._offsets, other._offsets)
                and np.array_equal(
                    self._data[: self._offsets[-1]], other._data[: other._offsets[-1]]
                )
            )
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def tolist(self) -> list[Any]:
        return list(self)

    def __repr__(self) -> str:
        head = ", ".join(repr(self._item(i)) for i in range(min(3, len(self))))
        more = ", ..." if len(self) > 3 else ""
        return f"StringArray([{head}{more}], len={len(self)}, nbytes={self.nbytes})"

    def __reduce__(self) -> Any:
        return (_rebuild_strings, (self._data, self._offsets, self._encoding))


def _rebuild_strings(data: np.ndarray, offsets: np.ndarray, encoding: str | None) -> StringArray:
    return StringArray.from_arrays(data, offsets, encoding=encoding)


class RecordArray(Sequence[Any]):
    """An immutable sequence of small records stored column by column.

    Each record is a tuple (or a dict, given ``dict`` records) of numbers, bools, strings
    or paths, with the same fields in every record. Numeric columns become numpy arrays,
    text columns :class:`StringArray`. Indexing rebuilds the record the list held (numbers
    come back as Python ``int`` / ``float`` / ``bool``, paths as ``str``).

    Args:
        records: the records.

    Example:
        >>> r = RecordArray([{"path": "a.jpg", "label": 3}])
        >>> r[0]
        {'path': 'a.jpg', 'label': 3}
    """

    __slots__ = ("_columns", "_keys", "_length")

    def __init__(self, records: Iterable[Any]) -> None:
        rows = list(records)
        self._length = len(rows)
        if not rows:
            self._keys: tuple[Any, ...] | None = ()
            self._columns: tuple[Any, ...] = ()
            return
        first = rows[0]
        if isinstance(first, Mapping):
            self._keys = tuple(first)
            get = lambda row, k: row[k]
        elif isinstance(first, tuple):
            self._keys = None
            get = lambda row, k: row[k]
        else:
            msg = (
                "RecordArray records must be tuples or dicts; record 0 is a "
                f"{type(first).__name__}. Use StringArray for a list of strings or paths."
            )
            raise TypeError(msg)
        width = len(first)
        fields = self._keys if self._keys is not None else range(width)
        for position, row in enumerate(rows):
            if (
                type(row) is not type(first)
                or len(row) != width
                or (self._keys is not None and tuple(row) != self._keys)
            ):
                msg = (
                    f"RecordArray records must all have record 0's fields; record {position} "
                    f"is {row!r} but record 0 is {first!r}"
                )
                raise ValueError(msg)
        self._columns = tuple(_column([get(row, k) for row in rows], k) for k in fields)

    def __len__(self) -> int:
        return self._length

    @property
    def nbytes(self) -> int:
        return int(sum(c.nbytes for c in self._columns))

    def _record(self, i: int) -> Any:
        values = tuple(c[i] if isinstance(c, StringArray) else c[i].item() for c in self._columns)
        return dict(zip(self._keys, values, strict=True)) if self._keys is not None else values

    def __getitem__(self, index: Any) -> Any:
        n = len(self)
        if isinstance(index, slice):
            return [self._record(i) for i in range(*index.indices(n))]
        return self._record(normalize_index(index, n, "RecordArray", hint=_OR_SLICE))

    def __iter__(self) -> Iterator[Any]:
        for i in range(len(self)):
            yield self._record(i)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def column(self, field: Any) -> Any:
        """One field of every record: a numpy array or a StringArray."""
        index = self._keys.index(field) if self._keys is not None else field
        return self._columns[index]

    def __repr__(self) -> str:
        return (
            f"RecordArray(len={len(self)}, fields={self._keys or len(self._columns)}, "
            f"nbytes={self.nbytes})"
        )


def _column(values: list[Any], field: Any) -> Any:
    first = values[0]
    if isinstance(first, (str, os.PathLike, bytes)):
        return StringArray(values, encoding=None if isinstance(first, bytes) else "utf-8")
    if isinstance(first, (bool, np.bool_)):
        kinds = (bool, np.bool_)
    elif isinstance(first, (int, np.integer)):
        kinds = (int, np.integer)  # type: ignore[assignment]
    elif isinstance(first, (float, np.floating)):
        kinds = (int, float, np.integer, np.floating)  # type: ignore[assignment]
    else:
        msg = (
            f"RecordArray fields hold numbers, bools, strings or paths; field {field!r} of "
            f"record 0 is a {type(first).__name__}: {first!r}"
        )
        raise TypeError(msg)
    for position, value in enumerate(values):
        if not isinstance(value, kinds) or (
            kinds[0] is not bool and isinstance(value, (bool, np.bool_))
        ):
            msg = (
                f"RecordArray field {field!r} must have one type in every record; record "
                f"{position} holds {value!r} ({type(value).__name__}) but record 0 holds "
                f"{first!r}"
            )
            raise TypeError(msg)
    return np.asarray(values)


def compact(items: Iterable[Any]) -> StringArray | RecordArray:
    """The compact form of a list: :class:`StringArray` for strings / paths / bytes,
    :class:`RecordArray` for tuples or dicts.

    Example:
        >>> compact(["a", "b"])
        StringArray(['a', 'b'], len=2, nbytes=26)
    """
    rows = items if isinstance(items, (list, tuple)) else list(items)
    if rows and isinstance(rows[0], (tuple, Mapping)):
        return RecordArray(rows)
    return StringArray(rows)
