"""Datasets: what a loader reads samples from.

Two kinds, as in ``torch.utils.data``:

* **map-style**: anything with ``__getitem__(index)`` and ``__len__()`` (the
  :class:`MapDataset` protocol). Subclassing :class:`Dataset` is optional; plain
  objects and ``torch.utils.data.Dataset`` instances work everywhere. A map-style
  dataset may also define ``__getitems__(indices)`` to fetch a whole batch at once.
* **iterable-style**: a subclass of :class:`IterableDataset` (stoker's or torch's)
  that yields samples from ``__iter__``. Use :func:`is_iterable_dataset` to tell the
  two kinds apart.

Building blocks: :class:`ArrayDataset` (numpy / torch arrays sharing their first
dimension), :class:`ConcatDataset`, :class:`ChainDataset`, :class:`Subset` and
:func:`random_split`. This module never imports torch at import time.
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
import sys
import warnings
from abc import abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

import numpy as np

from stoker._errors import DatasetError
from stoker._index import normalize_index, normalize_indices
from stoker._stacked import StackedSamples
from stoker._thread_safety import is_thread_safe
from stoker.seeding import _derive_rng, _is_torch_generator

__all__ = [
    "ArrayDataset",
    "ChainDataset",
    "ConcatDataset",
    "Dataset",
    "IterableDataset",
    "MapDataset",
    "Subset",
    "is_iterable_dataset",
    "random_split",
]

_T = TypeVar("_T")
_T_co = TypeVar("_T_co", covariant=True)


@runtime_checkable
class MapDataset(Protocol[_T_co]):
    """The map-style dataset protocol: ``__getitem__`` and ``__len__``.

    A dataset may also define ``__getitems__(indices: list[int])`` returning either
    a list of samples (one per index, in order) or a
    :class:`~stoker._stacked.StackedSamples` holding them column-wise. The loader
    then fetches a whole batch with one call instead of one call per index.

    Note that an :class:`IterableDataset` that defines ``__len__`` also satisfies
    this protocol; check :func:`is_iterable_dataset` first.

    Example:
        >>> class Squares:
        ...     def __getitem__(self, i):
        ...         return i * i
        ...     def __len__(self):
        ...         return 4
        >>> isinstance(Squares(), MapDataset)
        True
    """

    def __getitem__(self, index: int) -> _T_co: ...

    def __len__(self) -> int: ...


class Dataset(Generic[_T_co]):
    """Optional base class for map-style datasets (torch's ``Dataset``).

    Subclasses implement ``__getitem__`` and usually ``__len__``; they may add
    ``__getitems__`` for batched fetching (see :class:`MapDataset`). ``a + b``
    concatenates two datasets into a :class:`ConcatDataset`.

    Example:
        >>> class Squares(Dataset):
        ...     def __getitem__(self, i):
        ...         return i * i
        ...     def __len__(self):
        ...         return 3
        >>> both = Squares() + Squares()
        >>> len(both), both[4]
        (6, 1)
    """

    def __getitem__(self, index: Any) -> _T_co:
        msg = (
            f"{type(self).__name__} subclasses Dataset but does not implement "
            f"__getitem__(index); define it to return the sample at index "
            f"(or subclass IterableDataset and define __iter__ for a stream of samples)"
        )
        raise NotImplementedError(msg)

    # No __getitems__ here: the loader uses its presence as the sign that a dataset
    # fetches batches natively. No __len__ either, like torch.

    def __add__(self, other: Any) -> ConcatDataset[Any]:
        return ConcatDataset([self, other])


class IterableDataset(Dataset[_T_co], Iterable[_T_co]):
    """Base class for iterable-style datasets: a stream of samples from ``__iter__``.

    Subclasses must define ``__iter__`` (instantiating one that does not raises
    ``TypeError``). With several workers every worker iterates its own copy of the
    dataset; use :func:`stoker.get_worker_info` inside ``__iter__`` to split the
    stream. ``a + b`` chains two streams into a :class:`ChainDataset`.

    Example:
        >>> class Count(IterableDataset):
        ...     def __init__(self, n):
        ...         self.n = n
        ...     def __iter__(self):
        ...         return iter(range(self.n))
        >>> list(Count(2) + Count(3))
        [0, 1, 0, 1, 2]
    """

    @abstractmethod
    def __iter__(self) -> Iterator[_T_co]:
        """Yields the samples of this dataset."""

    def __add__(self, other: Any) -> ChainDataset:  # type: ignore[override]
        return ChainDataset([self, other])


def is_iterable_dataset(obj: object) -> bool:
    """True for instances of stoker's or torch's ``IterableDataset``.

    Never imports torch: torch's class is only looked up when torch is loaded.

    Example:
        >>> is_iterable_dataset(ArrayDataset(np.zeros(3)))
        False
    """
    if isinstance(obj, IterableDataset):
        return True
    torch_data = sys.modules.get("torch.utils.data")
    torch_cls = getattr(torch_data, "IterableDataset", None)
    return torch_cls is not None and isinstance(obj, torch_cls)


def _is_torch_tensor(obj: object) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


# What to do instead of passing a list or a slice to __getitem__.
_SEVERAL = "to fetch several samples call __getitems__(indices) or use Subset"


class ArrayDataset(Dataset[tuple[Any, ...]]):
    """Samples are rows of arrays that share their first dimension (torch's TensorDataset).

    Args:
        *arrays: numpy arrays or torch tensors (they may be mixed), each with at
            least one dimension and the same length along it.

    Sample ``i`` is ``tuple(a[i] for a in arrays)``; negative indices count from the
    end. ``__getitems__`` fetches a batch with one fancy-index per array and returns
    a :class:`~stoker._stacked.StackedSamples`.

    Example:
        >>> ds = ArrayDataset(np.arange(6).reshape(3, 2), np.array([10, 11, 12]))
        >>> len(ds), ds[-1][1]
        (3, np.int64(12))
        >>> ds.__getitems__([2, 0]).columns[1]
        array([12, 10])
    """

    def __init__(self, *arrays: Any) -> None:
        if not arrays:
            raise ValueError("ArrayDataset needs at least one array, got none")
        for k, a in enumerate(arrays):
            if not isinstance(a, np.ndarray) and not _is_torch_tensor(a):
                msg = (
                    f"ArrayDataset arguments must be numpy arrays or torch tensors; argument "
                    f"{k} is {type(a).__name__}; convert it with numpy.asarray(...) first"
                )
                raise TypeError(msg)
            if a.ndim == 0:
                msg = (
                    f"ArrayDataset arguments need at least one dimension to index samples "
                    f"along; argument {k} is 0-dimensional"
                )
                raise ValueError(msg)
        n = int(arrays[0].shape[0])
        for k, a in enumerate(arrays[1:], start=1):
            if int(a.shape[0]) != n:
                msg = (
                    f"ArrayDataset arrays must share their first dimension: argument 0 has "
                    f"length {n} but argument {k} has length {int(a.shape[0])}"
                )
                raise DatasetError(msg)
        self.arrays: tuple[Any, ...] = arrays

    @property
    def thread_safe(self) -> bool:
        """Rows are read, never written: threads may fetch at once (see worker_mode)."""
        return _fetches_as(self, ArrayDataset)

    def __len__(self) -> int:
        return int(self.arrays[0].shape[0])

    def __getitem__(self, index: Any) -> tuple[Any, ...]:
        i = normalize_index(index, len(self), "ArrayDataset", hint=_SEVERAL)
        return tuple(a[i] for a in self.arrays)

    def __getitems__(self, indices: Sequence[int]) -> StackedSamples:
        idx = normalize_indices(indices, len(self), "ArrayDataset")
        columns = []
        torch_idx = None
        for a in self.arrays:
            if isinstance(a, np.ndarray):
                columns.append(a[idx])
                continue
            if torch_idx is None:
                import torch

                torch_idx = torch.from_numpy(idx)
            columns.append(a[torch_idx.to(a.device)])
        return StackedSamples(tuple(columns))

    def __repr__(self) -> str:
        shapes = ", ".join(str(tuple(a.shape)) for a in self.arrays)
        return f"ArrayDataset(len={len(self)}, shapes=[{shapes}])"


def _fetches_as(dataset: Any, base: type) -> bool:
    """Whether ``dataset`` fetches with ``base``'s own methods (a subclass may add state)."""
    kind = type(dataset)
    return all(
        getattr(kind, name, None) is getattr(base, name, None)
        for name in ("__getitem__", "__getitems__")
    )


def _sized_len(dataset: Any, what: str) -> int:
    try:
        return len(dataset)
    except TypeError:
        msg = f"{what} ({type(dataset).__name__}) has no __len__; a sized dataset is needed"
        raise TypeError(msg) from None


def _fetch_many(dataset: Any, indices: list[int]) -> Sequence[Any]:
    """Fetches ``indices`` from ``dataset``, through ``__getitems__`` when it has one."""
    getitems = getattr(dataset, "__getitems__", None)
    if not callable(getitems):
        return [dataset[i] for i in indices]
    items = getitems(indices)
    if len(items) != len(indices):
        msg = (
            f"{type(dataset).__name__}.__getitems__ returned {len(items)} samples for "
            f"{len(indices)} indices; it must return one sample per index"
        )
        raise DatasetError(msg)
    return items


class ConcatDataset(Dataset[_T_co]):
    """Map-style datasets laid end to end.

    Args:
        datasets: a non-empty iterable of sized map-style datasets (stoker, torch or
            plain objects). Iterable-style datasets belong in :class:`ChainDataset`.

    Attributes:
        datasets: the member datasets, as a list.
        cumulative_sizes: ``cumulative_sizes[k]`` is the total length of members
            ``0..k``.

    Example:
        >>> ds = ConcatDataset([ArrayDataset(np.arange(3)), ArrayDataset(np.arange(5))])
        >>> len(ds), ds.cumulative_sizes, ds[4]
        (8, [3, 8], (np.int64(1),))
    """

    datasets: list[Any]
    cumulative_sizes: list[int]

    def __init__(self, datasets: Iterable[Any]) -> None:
        if isinstance(datasets, Dataset) or _is_torch_dataset(datasets):
            msg = (
                f"ConcatDataset takes a list of datasets, got a single "
                f"{type(datasets).__name__}; pass ConcatDataset([dataset, ...])"
            )
            raise TypeError(msg)
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("ConcatDataset needs at least one dataset, got an empty iterable")
        total = 0
        self.cumulative_sizes = []
        for k, d in enumerate(self.datasets):
            if is_iterable_dataset(d):
                msg = (
                    f"ConcatDataset only takes map-style datasets, but datasets[{k}] is the "
                    f"iterable-style {type(d).__name__}; use ChainDataset to chain streams"
                )
                raise TypeError(msg)
            total += _sized_len(d, f"ConcatDataset member datasets[{k}]")
            self.cumulative_sizes.append(total)

    def __len__(self) -> int:
        return self.cumulative_sizes[-1]

    @property
    def thread_safe(self) -> bool:
        """Thread-safe when every member declares it (see worker_mode)."""
        return _fetches_as(self, ConcatDataset) and all(map(is_thread_safe, self.datasets))

    def _locate(self, i: int) -> tuple[int, int]:
        k = bisect.bisect_right(self.cumulative_sizes, i)
        return k, i - (self.cumulative_sizes[k - 1] if k else 0)

    def __getitem__(self, index: Any) -> _T_co:
        k, local = self._locate(normalize_index(index, len(self), "ConcatDataset", hint=_SEVERAL))
        return self.datasets[k][local]

    def __getitems__(self, indices: Sequence[int]) -> Sequence[Any]:
        """Fetches ``indices`` in order, with one batched call per member when it can."""
        idx = normalize_indices(indices, len(self), "ConcatDataset")
        sizes = np.asarray(self.cumulative_sizes, dtype=np.int64)
        member = np.searchsorted(sizes, idx, side="right")
        starts = np.concatenate(([0], sizes[:-1]))
        present = np.unique(member)
        if present.size == 1:  # one member: keep whatever it returns (e.g. StackedSamples)
            k = int(present[0])
            return _fetch_many(self.datasets[k], (idx - starts[k]).tolist())
        out: list[Any] = [None] * idx.size
        for k in present.tolist():
            positions = np.flatnonzero(member == k)
            items = _fetch_many(self.datasets[k], (idx[positions] - starts[k]).tolist())
            for p, item in zip(positions.tolist(), items, strict=True):
                out[p] = item
        return out

    def __repr__(self) -> str:
        return f"ConcatDataset(len={len(self)}, members={len(self.datasets)})"


def _is_torch_dataset(obj: object) -> bool:
    torch_data = sys.modules.get("torch.utils.data")
    torch_cls = getattr(torch_data, "Dataset", None)
    return torch_cls is not None and isinstance(obj, torch_cls)


class ChainDataset(IterableDataset[Any]):
    """Iterable datasets streamed one after the other.

    Args:
        datasets: the datasets to chain; each must be iterable (define
            ``__iter__``). Map-style datasets belong in :class:`ConcatDataset`.

    ``len()`` works when every member has a length, and is their sum.

    Example:
        >>> class Count(IterableDataset):
        ...     def __init__(self, n):
        ...         self.n = n
        ...     def __iter__(self):
        ...         return iter(range(self.n))
        ...     def __len__(self):
        ...         return self.n
        >>> chain = ChainDataset([Count(2), Count(1)])
        >>> list(chain), len(chain)
        ([0, 1, 0], 3)
    """

    datasets: list[Any]

    def __init__(self, datasets: Iterable[Any]) -> None:
        if is_iterable_dataset(datasets):
            msg = (
                f"ChainDataset takes a list of datasets, got a single "
                f"{type(datasets).__name__}; pass ChainDataset([dataset, ...])"
            )
            raise TypeError(msg)
        self.datasets = list(datasets)
        for k, d in enumerate(self.datasets):
            if not callable(getattr(type(d), "__iter__", None)):
                msg = (
                    f"ChainDataset members must be iterable datasets, but datasets[{k}] "
                    f"({type(d).__name__}) has no __iter__; use ConcatDataset for "
                    f"map-style datasets"
                )
                raise TypeError(msg)

    def __iter__(self) -> Iterator[Any]:
        for d in self.datasets:
            yield from d

    def __len__(self) -> int:
        return sum(
            _sized_len(d, f"ChainDataset member datasets[{k}]") for k, d in enumerate(self.datasets)
        )

    def __repr__(self) -> str:
        return f"ChainDataset(members={len(self.datasets)})"


class Subset(Dataset[_T_co]):
    """The samples of ``dataset`` at ``indices``, in that order.

    Args:
        dataset: any map-style dataset (stoker, torch or a plain object).
        indices: positions in ``dataset``; ``subset[i]`` is
            ``dataset[indices[i]]``.

    ``__getitems__`` maps the indices and delegates to ``dataset.__getitems__`` when
    the dataset has one, so batched fetching survives subsetting. A subclass that
    overrides ``__getitem__`` must also override ``__getitems__`` (as in torch).

    Example:
        >>> sub = Subset(ArrayDataset(np.arange(10) * 10), [7, 2])
        >>> len(sub), sub[0], sub.__getitems__([1, 0]).columns[0]
        (2, (np.int64(70),), array([20, 70]))
    """

    dataset: Any
    indices: Sequence[int]

    def __init__(self, dataset: Any, indices: Sequence[int]) -> None:
        if (
            type(self).__getitem__ is not Subset.__getitem__
            and type(self).__getitems__ is Subset.__getitems__
        ):
            msg = (
                f"{type(self).__name__} overrides __getitem__ but not __getitems__, so batched "
                f"fetching would bypass your __getitem__; also define "
                f"`def __getitems__(self, indices): return [self[i] for i in indices]`"
            )
            raise NotImplementedError(msg)
        self.dataset = dataset
        self.indices = indices

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, list):
            return self.dataset[[self.indices[i] for i in index]]
        return self.dataset[self.indices[index]]

    def __getitems__(self, indices: Sequence[int]) -> Sequence[Any]:
        return _fetch_many(self.dataset, [self.indices[i] for i in indices])

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def thread_safe(self) -> bool:
        """Thread-safe when the dataset it selects from declares it (see worker_mode)."""
        return _fetches_as(self, Subset) and is_thread_safe(self.dataset)

    def __repr__(self) -> str:
        return f"Subset(len={len(self)}, dataset={type(self.dataset).__name__})"


def _split_lengths(lengths: Sequence[float], n: int) -> list[int]:
    """Torch's rule: fractions summing to 1 become floors plus a round-robin remainder."""
    total = sum(lengths)
    if math.isclose(total, 1) and total <= 1:
        split: list[int] = []
        for i, frac in enumerate(lengths):
            if not 0 <= frac <= 1:
                msg = f"lengths[{i}] must be a fraction between 0 and 1, got {frac!r}"
                raise ValueError(msg)
            split.append(math.floor(n * frac))
        for i in range(n - sum(split)):
            split[i % len(split)] += 1
        for i, size in enumerate(split):
            if size == 0:
                warnings.warn(
                    f"random_split: split {i} is empty (fraction {lengths[i]!r} of "
                    f"{n} samples rounds to 0); the returned Subset will have no samples",
                    UserWarning,
                    stacklevel=3,
                )
        return split
    ints: list[int] = []
    for i, length in enumerate(lengths):
        if isinstance(length, (bool, np.bool_)):
            msg = f"lengths[{i}] must be an int or a fraction, got the bool {length!r}"
            raise TypeError(msg)
        try:
            value = operator.index(length)  # type: ignore[arg-type]
        except TypeError:
            msg = (
                f"lengths must be ints that sum to len(dataset) ({n}) or fractions that sum "
                f"to 1, but lengths[{i}] is {length!r} and they sum to {total!r}"
            )
            raise TypeError(msg) from None
        if value < 0:
            msg = f"lengths[{i}] must be non-negative, got {value}"
            raise ValueError(msg)
        ints.append(value)
    if sum(ints) != n:
        msg = (
            f"lengths sum to {sum(ints)} but the dataset has {n} samples; pass lengths that "
            f"sum to {n}, or fractions that sum to 1"
        )
        raise ValueError(msg)
    return ints


def random_split(
    dataset: Any, lengths: Sequence[float], generator: Any = None
) -> list[Subset[Any]]:
    """Splits ``dataset`` at random into non-overlapping :class:`Subset` s.

    Args:
        dataset: any sized map-style dataset.
        lengths: the split sizes as ints summing to ``len(dataset)``, or fractions
            summing to 1 (each becomes ``floor(fraction * len(dataset))``, and the
            remainder is handed out one by one, round robin, from the first split).
            An empty split from fractions triggers a ``UserWarning``.
        generator: ``None``, an int seed or a ``numpy.random.Generator`` (the
            permutation is drawn as :mod:`stoker.seeding` describes); or a
            ``torch.Generator``, in which case the splits equal those of
            ``torch.utils.data.random_split`` with the same generator state.

    Returns:
        One :class:`Subset` per length, in order.

    Example:
        >>> train, val = random_split(range(10), [0.8, 0.2], generator=0)
        >>> len(train), len(val), sorted([*train.indices, *val.indices]) == list(range(10))
        (8, 2, True)
    """
    n = _sized_len(dataset, "random_split's dataset")
    sizes = _split_lengths(lengths, n)
    if _is_torch_generator(generator):
        import torch

        order: list[int] = torch.randperm(n, generator=generator).tolist()
    else:
        order = _derive_rng(generator).permutation(n).tolist()
    return [
        Subset(dataset, order[end - size : end])
        for end, size in zip(itertools.accumulate(sizes), sizes, strict=True)
    ]
