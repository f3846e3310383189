"""Sequential, random and subset-random samplers (the torch.utils.data ones)."""

from __future__ import annotations

from collections.abc import Sequence, Sized
from typing import Any

import numpy as np

from stoker._validate import check_bool, check_int
from stoker.samplers._base import IndexSampler, Randomized, as_int_array

__all__ = ["RandomSampler", "SequentialSampler", "SubsetRandomSampler"]

# torch's RandomSampler draws with replacement 32 indices per torch.randint call; the
# same chunking is needed for the generator to advance exactly as torch advances it.
_TORCH_RANDINT_CHUNK = 32


class SequentialSampler(IndexSampler):
    """Yields ``0, 1, ..., len(data_source) - 1``, every epoch.

    Args:
        data_source: anything with ``__len__``; its length is read at every ``iter()``.

    Example:
        >>> list(SequentialSampler(range(4)))
        [0, 1, 2, 3]
    """

    def __init__(self, data_source: Sized) -> None:
        self.data_source = data_source
        self._init_epoch_state(None, seeded=False)

    def _indices_for_epoch(self, epoch: int) -> np.ndarray:
        return np.arange(len(self.data_source), dtype=np.int64)

    def __len__(self) -> int:
        return len(self.data_source)


class RandomSampler(Randomized, IndexSampler):
    """Yields the indices of ``data_source`` in a random order.

    Without replacement every index appears once per ``len(data_source)`` samples
    (``num_samples`` larger than the dataset concatenates several permutations, the
    last one cut short); with replacement ``num_samples`` indices are drawn uniformly.

    Args:
        data_source: anything with ``__len__``; its length is read at every ``iter()``.
        replacement: draw with replacement.
        num_samples: how many indices per epoch; default ``len(data_source)``.
        generator: ``None``, an int seed, a ``numpy.random.Generator`` (epoch ``e``'s
            order is then a pure function of the seed and ``e``), or a
            ``torch.Generator`` (then the order equals ``torch.utils.data.RandomSampler``'s
            with that generator, value for value).

    Example:
        >>> s = RandomSampler(range(5), generator=0)
        >>> sorted(s)
        [0, 1, 2, 3, 4]
        >>> s.set_epoch(0); first = list(s); s.set_epoch(0)
        >>> list(s) == first
        True
    """

    def __init__(
        self,
        data_source: Sized,
        replacement: bool = False,
        num_samples: int | None = None,
        generator: Any = None,
    ) -> None:
        self.data_source = data_source
        self.replacement = check_bool("replacement", replacement, error=TypeError)
        if num_samples is not None:
            num_samples = check_int("num_samples", num_samples, minimum=1)
        elif len(data_source) == 0:
            msg = (
                "RandomSampler needs a non-empty data_source (num_samples defaults to its "
                "length, which is 0); pass a dataset with at least one sample"
            )
            raise ValueError(msg)
        self._num_samples = num_samples
        self._init_epoch_state(generator)

    @property
    def num_samples(self) -> int:
        """Indices per epoch (``len(data_source)`` unless given; read at every call)."""
        if self._num_samples is None:
            return len(self.data_source)
        return self._num_samples

    def _indices_for_epoch(self, epoch: int) -> np.ndarray:
        n = len(self.data_source)
        num_samples = self.num_samples
        if n == 0:
            msg = f"RandomSampler cannot draw {num_samples} samples from an empty data_source"
            raise ValueError(msg)
        if self._torch_generator is not None:
            return self._torch_indices(n, num_samples)
        rng = self._rng(epoch)
        if self.replacement:
            return rng.integers(0, n, size=num_samples, dtype=np.int64)
        parts = [rng.permutation(n) for _ in range(num_samples // n)]
        if num_samples % n:
            parts.append(rng.permutation(n)[: num_samples % n])
        return np.concatenate(parts).astype(np.int64, copy=False)

    def _torch_indices(self, n: int, num_samples: int) -> np.ndarray:
        """torch's algorithm, call for call, on the torch.Generator."""
        import torch

        g = self._torch_generator
        if self.replacement:
            chunks = [
                torch.randint(high=n, size=(_TORCH_RANDINT_CHUNK,), dtype=torch.int64, generator=g)
                for _ in range(num_samples // _TORCH_RANDINT_CHUNK)
            ]
            chunks.append(
                torch.randint(
                    high=n,
                    size=(num_samples % _TORCH_RANDINT_CHUNK,),
                    dtype=torch.int64,
                    generator=g,
                )
            )
        else:
            chunks = [torch.randperm(n, generator=g) for _ in range(num_samples // n)]
            # torch draws the last permutation even when it keeps none of it.
            chunks.append(torch.randperm(n, generator=g)[: num_samples % n])
        return torch.cat(chunks).numpy().astype(np.int64, copy=False)

    def __len__(self) -> int:
        return self.num_samples


class SubsetRandomSampler(Randomized, IndexSampler):
    """Yields the given indices in a random order, each once per epoch.

    Args:
        indices: a 1-D sequence (list, range, numpy array, tensor) of ints.
        generator: ``None``, an int seed, a ``numpy.random.Generator``, or a
            ``torch.Generator`` (then the order equals
            ``torch.utils.data.SubsetRandomSampler``'s, value for value).

    Example:
        >>> s = SubsetRandomSampler([10, 20, 30], generator=1)
        >>> sorted(s)
        [10, 20, 30]
    """

    def __init__(self, indices: Sequence[int], generator: Any = None) -> None:
        self.indices = indices
        self._indices = as_int_array("indices", indices, non_negative=False)
        self._init_epoch_state(generator)

    def _indices_for_epoch(self, epoch: int) -> np.ndarray:
        n = len(self._indices)
        if self._torch_generator is not None:
            import torch

            order = torch.randperm(n, generator=self._torch_generator).numpy()
        else:
            order = self._rng(epoch).permutation(n)
        return self._indices[order]

    def __len__(self) -> int:
        return len(self._indices)
