"""``WeightedRandomSampler``: indices drawn with given probabilities."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from stoker._validate import check_bool, check_int
from stoker.samplers._base import IndexSampler, Randomized

__all__ = ["WeightedRandomSampler"]


def _as_weights(weights: Any) -> np.ndarray:
    try:
        arr = np.asarray(weights, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        msg = f"weights must be a 1-D sequence of numbers, got {type(weights).__name__}: {exc}"
        raise TypeError(msg) from None
    if arr.ndim != 1:
        msg = f"weights must be a 1-D sequence, got weights of shape {arr.shape}"
        raise ValueError(msg)
    bad = np.flatnonzero(~np.isfinite(arr) | (arr < 0))
    if bad.size:
        i = int(bad[0])
        msg = f"weights must be finite and non-negative, but weights[{i}] is {float(arr[i])!r}"
        raise ValueError(msg)
    if arr.size == 0 or not arr.sum() > 0:
        msg = "weights must contain at least one positive weight, got none"
        raise ValueError(msg)
    return arr


class WeightedRandomSampler(Randomized, IndexSampler):
    """Yields ``num_samples`` indices of ``range(len(weights))``, index ``i`` with
    probability proportional to ``weights[i]``.

    Without replacement an index is never drawn twice in an epoch (draws are
    successive: each draw picks among the indices left, in proportion to their weights).

    Args:
        weights: a 1-D sequence of finite, non-negative numbers, not necessarily
            summing to one; at least one must be positive.
        num_samples: indices per epoch; without replacement at most the number of
            positive weights.
        replacement: draw with replacement (the default, as in torch).
        generator: ``None``, an int seed, a ``numpy.random.Generator``, or a
            ``torch.Generator`` (then the draws equal
            ``torch.utils.data.WeightedRandomSampler``'s, via ``torch.multinomial``).

    Example:
        >>> s = WeightedRandomSampler([0.0, 1.0, 3.0], num_samples=6, generator=0)
        >>> len(list(s)), 0 in list(s)
        (6, False)
    """

    def __init__(
        self,
        weights: Sequence[float],
        num_samples: int,
        replacement: bool = True,
        generator: Any = None,
    ) -> None:
        self.num_samples = check_int("num_samples", num_samples, minimum=1)
        self.replacement = check_bool("replacement", replacement, error=ValueError)
        self.weights = _as_weights(weights)
        if not replacement:
            positive = int(np.count_nonzero(self.weights))
            if num_samples > positive:
                msg = (
                    f"without replacement, num_samples must be at most the number of positive "
                    f"weights ({positive}), got num_samples={num_samples}; pass "
                    "replacement=True or a smaller num_samples"
                )
                raise ValueError(msg)
        self._init_epoch_state(generator)
        self._weights_tensor: Any = None

    def _indices_for_epoch(self, epoch: int) -> np.ndarray:
        if self._torch_generator is not None:
            import torch

            if self._weights_tensor is None:
                self._weights_tensor = torch.as_tensor(self.weights, dtype=torch.double)
            drawn = torch.multinomial(
                self._weights_tensor,
                self.num_samples,
                self.replacement,
                generator=self._torch_generator,
            )
            return drawn.numpy().astype(np.int64, copy=False)
        rng = self._rng(epoch)
        n = len(self.weights)
        if self.replacement:
            drawn = rng.choice(n, size=self.num_samples, p=self.weights / self.weights.sum())
            return drawn.astype(np.int64, copy=False)
        # Successive sampling without replacement: the order of keys E_i / w_i, with
        # E_i ~ Exp(1), is the order of a draw-one-then-renormalise process. Compared in
        # logs so that tiny (subnormal) weights cannot overflow to the zero weights' inf.
        keys = np.full(n, np.inf)
        positive = self.weights > 0
        with np.errstate(divide="ignore"):  # log(0.0) = -inf only ranks an index first
            log_e = np.log(rng.standard_exponential(int(positive.sum())))
        keys[positive] = log_e - np.log(self.weights[positive])
        k = self.num_samples
        if k < n:
            chosen = np.argpartition(keys, k - 1)[:k]
            return chosen[np.argsort(keys[chosen], kind="stable")].astype(np.int64, copy=False)
        return np.argsort(keys, kind="stable").astype(np.int64, copy=False)

    def __len__(self) -> int:
        return self.num_samples
