"""``DistributedSampler``: each of ``num_replicas`` processes reads its own share."""

from __future__ import annotations

import os
import sys
from collections.abc import Sized
from typing import Any, Literal

import numpy as np

from stoker._errors import DatasetError
from stoker._validate import check_bool, check_choice, check_int, is_int
from stoker.samplers._base import IndexSampler

__all__ = ["DistributedSampler"]

_MODES = ("pad", "drop", "uneven")


def _from_environment(name: str, variable: str) -> int | None:
    raw = os.environ.get(variable)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        msg = (
            f"{name} was not given, and the environment variable {variable} that would "
            f"supply it is not an integer: {variable}={raw!r}; pass {name}= explicitly"
        )
        raise ValueError(msg) from None


def _resolve_topology(num_replicas: Any, rank: Any) -> tuple[int, int]:
    """Fills a ``None`` num_replicas / rank from torch.distributed, else RANK / WORLD_SIZE."""
    if num_replicas is None or rank is None:
        dist = sys.modules.get("torch.distributed")
        if (
            dist is not None
            and dist.is_available()
            and getattr(dist, "is_initialized", lambda: False)()
        ):
            if num_replicas is None:
                num_replicas = dist.get_world_size()
            if rank is None:
                rank = dist.get_rank()
        else:
            if num_replicas is None:
                num_replicas = _from_environment("num_replicas", "WORLD_SIZE")
            if rank is None:
                rank = _from_environment("rank", "RANK")
            if num_replicas is None or rank is None:
                missing = " and ".join(
                    name
                    for name, value in (("num_replicas", num_replicas), ("rank", rank))
                    if value is None
                )
                msg = (
                    f"DistributedSampler could not find {missing}: torch.distributed is not "
                    "initialized and the WORLD_SIZE / RANK environment variables are not set. "
                    "Pass num_replicas= and rank= explicitly, or launch with torchrun, "
                    "which sets them."
                )
                raise ValueError(msg)
    num_replicas = check_int("num_replicas", num_replicas, minimum=1)
    if not is_int(rank) or not 0 <= rank < num_replicas:
        msg = (
            f"Invalid rank {rank!r}: with num_replicas={num_replicas}, rank must be an integer "
            f"in [0, {num_replicas - 1}] (ranks count from 0)"
        )
        raise ValueError(msg)
    return num_replicas, int(rank)


class DistributedSampler(IndexSampler):
    """The share of the dataset that rank ``rank`` of ``num_replicas`` reads each epoch.

    The full order (shuffled with ``seed`` and the epoch, or ``0..n-1``) is dealt out
    round-robin: rank ``r`` takes positions ``r, r + R, r + 2R, ...``. How a length
    that ``R`` does not divide is handled depends on ``mode``:

    * ``"pad"`` (torch's default, ``drop_last=False``): the order is extended
      cyclically from its start until every rank has ``ceil(n / R)`` indices. The
      duplicates sit at the end of each rank's order; :meth:`padding_mask` and
      :attr:`num_padded` tell evaluation code which ones to ignore.
    * ``"drop"`` (torch's ``drop_last=True``): the tail is cut so every rank has
      ``n // R`` indices.
    * ``"uneven"``: no padding and no dropping; ranks get ``n // R`` or ``n // R + 1``
      indices and every index is read exactly once overall. Collective operations
      must then tolerate ranks with one batch fewer.

    With ``shuffle=False`` the order equals ``torch.utils.data.DistributedSampler``'s.
    With ``shuffle=True`` every rank built with the same ``seed`` shuffles the same
    way in the same epoch (the permutation is a pure function of ``seed`` and the
    epoch, computed with numpy; it is not torch's permutation). As with every stoker
    sampler, ``iter()`` advances the epoch, and ``set_epoch(e)`` picks the next one.

    Args:
        dataset: anything with ``__len__``; its length must not change afterwards.
        num_replicas: number of processes; default from ``torch.distributed`` when it
            is imported and initialized, else from the ``WORLD_SIZE`` variable.
        rank: this process's rank in ``[0, num_replicas)``; default from
            ``torch.distributed``, else from the ``RANK`` variable.
        shuffle: shuffle the order every epoch.
        seed: non-negative int, the same on every rank.
        drop_last: torch's switch between ``"pad"`` (False) and ``"drop"`` (True).
        mode: ``"pad"``, ``"drop"`` or ``"uneven"``; overrides ``drop_last`` (passing
            both in contradiction is an error).

    Example:
        >>> s = DistributedSampler(range(10), num_replicas=4, rank=3, shuffle=False)
        >>> list(s), s.padding_mask().tolist()
        ([3, 7, 1], [False, False, True])
    """

    def __init__(
        self,
        dataset: Sized,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        *,
        mode: Literal["pad", "drop", "uneven"] | None = None,
    ) -> None:
        self.num_replicas, self.rank = _resolve_topology(num_replicas, rank)
        self.shuffle = check_bool("shuffle", shuffle)
        check_bool("drop_last", drop_last)
        if mode is None:
            mode = "drop" if drop_last else "pad"
        elif check_choice("mode", mode, _MODES) != "drop" and drop_last:
            msg = (
                f"drop_last=True asks for mode 'drop' but mode={mode!r} was passed; "
                "pass only one of them"
            )
            raise ValueError(msg)
        self.mode = mode
        self.drop_last = mode == "drop"  # torch's attribute, kept consistent with mode
        self._init_epoch_state(None, seeded=False)
        self.seed = seed
        self.dataset = dataset
        n = len(dataset)
        self._dataset_len = n
        replicas = self.num_replicas
        if mode == "pad":
            self.num_samples = -(-n // replicas)
            self.total_size = self.num_samples * replicas
        elif mode == "drop":
            self.num_samples = n // replicas
            self.total_size = self.num_samples * replicas
        else:
            self.num_samples = len(range(self.rank, n, replicas))
            self.total_size = n

    @property
    def seed(self) -> int:
        """The shuffle seed, the same on every rank (``load_state_dict`` replaces it)."""
        return self._base_seed  # type: ignore[return-value]

    @seed.setter
    def seed(self, seed: int) -> None:
        if not is_int(seed):
            msg = f"seed must be a non-negative int, got {type(seed).__name__}: {seed!r}"
            raise TypeError(msg)
        if seed < 0:
            msg = f"seed must be a non-negative int, got {seed}; pick a seed >= 0"
            raise ValueError(msg)
        self._base_seed = int(seed)

    @property
    def num_padded(self) -> int:
        """How many of this rank's indices per epoch are padding duplicates."""
        return int(self.padding_mask().sum())

    def padding_mask(self) -> np.ndarray:
        """A bool array aligned with this rank's order: True where the index is padding.

        Padding sits at the same positions every epoch (the end of the full order),
        so the mask holds for the current, last and next epoch alike. Always all False
        in the ``"drop"`` and ``"uneven"`` modes.
        """
        if self.mode != "pad":
            return np.zeros(self.num_samples, dtype=bool)
        positions = self.rank + self.num_replicas * np.arange(self.num_samples)
        return positions >= self._dataset_len

    def _indices_for_epoch(self, epoch: int) -> np.ndarray:
        n = len(self.dataset)
        if n != self._dataset_len:
            msg = (
                f"the dataset had {self._dataset_len} samples when the DistributedSampler "
                f"was built and has {n} now; build a new sampler after the dataset changes"
            )
            raise DatasetError(msg)
        order = self._rng(epoch).permutation(n) if self.shuffle else np.arange(n)
        positions = np.arange(self.rank, self.total_size, self.num_replicas)
        if self.mode == "pad" and n:
            positions %= n  # torch pads by repeating the order from its start
        indices = order[positions].astype(np.int64, copy=False)
        if len(indices) != self.num_samples:
            msg = f"rank {self.rank} got {len(indices)} indices, expected {self.num_samples}"
            raise AssertionError(msg)
        return indices

    def __len__(self) -> int:
        return self.num_samples
