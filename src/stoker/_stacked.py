"""``StackedSamples``: a batch of samples that is already stored column-wise.

A dataset's ``__getitems__`` may return one of these instead of a list of samples.
It behaves like the list of per-sample tuples it stands for (so ``torch.utils.data``'s
collate still works on it), while stoker's :func:`~stoker.collate.default_collate`
recognises it and copies each column in one vectorised step instead of stacking
sample by sample.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["StackedSamples"]


class StackedSamples(Sequence):
    """A read-only sequence of ``len(columns[0])`` samples stored as columns.

    Args:
        columns: arrays (numpy or torch) that share their first dimension; sample
            ``i`` is ``tuple(column[i] for column in columns)``.

    Example:
        >>> import numpy as np
        >>> s = StackedSamples((np.arange(6).reshape(3, 2), np.array([7, 8, 9])))
        >>> len(s), s[1][1]
        (3, np.int64(8))
    """

    __slots__ = ("columns",)

    def __init__(self, columns: tuple[Any, ...]) -> None:
        if not columns:
            raise ValueError("StackedSamples needs at least one column, got none")
        n = len(columns[0])
        for k, column in enumerate(columns):
            if len(column) != n:
                msg = (
                    f"StackedSamples columns must share their first dimension: column 0 has "
                    f"{n} rows, column {k} has {len(column)}"
                )
                raise ValueError(msg)
        self.columns = tuple(columns)

    def __len__(self) -> int:
        return len(self.columns[0])

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return tuple(column[i] for column in self.columns)

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        for i in range(len(self)):
            yield self[i]

    def __repr__(self) -> str:
        return f"StackedSamples(len={len(self)}, columns={len(self.columns)})"
