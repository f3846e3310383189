"""Turning the index a dataset receives into a position: one rule and one set of messages.

An index is a Python or numpy integer (never a bool, a float or a string); a negative
one counts from the end, as in a list. Out of range raises :class:`~stoker.DatasetIndexError`,
an ``IndexError``, so the old ``__getitem__`` iteration protocol still stops at the end.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from stoker._errors import DatasetIndexError

__all__ = ["normalize_index", "normalize_indices"]


def _out_of_range(index: int, length: int, owner: str, where: str = "") -> DatasetIndexError:
    valid = f"valid indices are {-length} to {length - 1}" if length else "it is empty"
    return DatasetIndexError(
        f"index {index}{where} is out of range for {owner} of length {length}; {valid}"
    )


def normalize_index(index: Any, length: int, owner: str, *, hint: str = "") -> int:
    """``index`` as an int in ``[0, length)``, negative indices counted from the end.

    Args:
        index: what ``__getitem__`` received.
        length: the length of what is indexed.
        owner: its name in messages (``"ArrayDataset"``).
        hint: appended to the message of a non-integer index (what to do instead).

    Raises:
        TypeError: ``index`` is a bool or not an integer.
        DatasetIndexError: ``index`` is out of range.

    Example:
        >>> normalize_index(np.int64(-1), 5, "ArrayDataset")
        4
    """
    if isinstance(index, (bool, np.bool_)):
        msg = f"{owner} index must be an integer, got the bool {index!r}"
        raise TypeError(msg)
    try:
        i = operator.index(index)
    except TypeError:
        msg = f"{owner} index must be an integer, got {type(index).__name__}: {index!r}"
        raise TypeError(f"{msg}; {hint}" if hint else msg) from None
    j = i + length if i < 0 else i
    if not 0 <= j < length:
        raise _out_of_range(i, length, owner)
    return j


def normalize_indices(indices: Any, length: int, owner: str) -> np.ndarray:
    """``indices`` (what ``__getitems__`` received) as a 1-D int64 array in ``[0, length)``.

    Raises:
        ValueError: ``indices`` is not flat.
        TypeError: they are not integers.
        DatasetIndexError: one is out of range; the message names it and its position.

    Example:
        >>> normalize_indices([0, -1], 3, "ArrayDataset").tolist()
        [0, 2]
    """
    raw = np.asarray(indices)
    if raw.size == 0:
        return np.zeros(0, dtype=np.int64)
    if raw.ndim != 1:
        msg = f"{owner}.__getitems__ needs a flat list of indices, got shape {raw.shape}"
        raise ValueError(msg)
    if raw.dtype.kind not in "iu":
        msg = (
            f"{owner}.__getitems__ needs integer indices, got dtype {raw.dtype} (first index "
            f"{raw[0]!r})"
        )
        raise TypeError(msg)
    idx = raw.astype(np.int64, copy=False)
    bad = (idx < -length) | (idx >= length)
    if bad.any():
        pos = int(np.flatnonzero(bad)[0])
        raise _out_of_range(
            int(idx[pos]), length, owner, f" (position {pos} of the {idx.size} requested)"
        )
    return np.where(idx < 0, idx + length, idx)
