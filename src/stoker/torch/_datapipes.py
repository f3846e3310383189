"""torch ``IterDataPipe`` graphs on stoker's engine, handled as torch's loader handles them.

* ``shuffle=`` switches the graph's shufflers on or off (torch's ``apply_shuffle_settings``).
* Every epoch seeds the graph's random datapipes from one shared seed, so all workers
  (and all ranks, where ``torch.distributed`` is initialised) shuffle alike before
  ``sharding_filter()`` splits the stream; different epochs shuffle differently.
* ``sharding_filter()`` is applied per rank, and per rank and worker inside workers, with
  torch's own ``_sharding_worker_init_fn``, so each element arrives once.

The seed of epoch ``e`` is derived from one base seed, drawn (and broadcast from rank 0)
when the first epoch starts, so workers that live across epochs reseed themselves from
the epoch number alone.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import IterDataPipe, graph_settings
from torch.utils.data.dataloader import _get_distributed_settings, _sharding_worker_init_fn
from torch.utils.data.datapipes.datapipe import _IterDataPipeSerializationWrapper

from stoker._seeding import epoch_rng

__all__ = ["SeededDataPipe", "is_datapipe", "prepare", "worker_init"]


def is_datapipe(dataset: Any) -> bool:
    return isinstance(dataset, IterDataPipe)


class SeededDataPipe(_IterDataPipeSerializationWrapper):
    """torch's serialisation wrapper of a datapipe, reseeded by ``set_epoch``."""

    def __init__(self, datapipe: IterDataPipe) -> None:
        super().__init__(datapipe)
        self.base_seed: int | None = None

    def set_epoch(self, epoch: int) -> None:
        if self.base_seed is None:
            raise AssertionError("the datapipe's base seed is drawn before its first epoch")
        seed = int(epoch_rng(self.base_seed, epoch).integers(0, 2**62))
        graph_settings.apply_random_seed(self._datapipe, torch.Generator().manual_seed(seed))

    def __getstate__(self) -> Any:
        return (super().__getstate__(), self.base_seed)

    def __setstate__(self, state: Any) -> None:
        wrapped, self.base_seed = state
        super().__setstate__(wrapped)
        self._datapipe_iter = None


def prepare(datapipe: IterDataPipe, shuffle: bool | None) -> SeededDataPipe:
    """What the loader keeps as its dataset: the graph with torch's shuffle setting applied."""
    if shuffle is not None:
        datapipe = graph_settings.apply_shuffle_settings(datapipe, shuffle=shuffle)
    return SeededDataPipe(datapipe)


def draw_base_seed(generator: Any) -> int:
    """One seed from ``generator`` (torch's global one for None), rank 0's on every rank."""
    seed = torch.empty((), dtype=torch.int64).random_(generator=generator)
    if dist.is_available() and dist.is_initialized():
        group = dist.new_group(backend="gloo")  # a CPU tensor, whatever the default backend
        dist.broadcast(seed, src=0, group=group)
        dist.destroy_process_group(group)
    return int(seed.item())


def shard_in_process(dataset: SeededDataPipe) -> None:
    """``num_workers=0``: one shard per rank, as torch's single-process iterator applies it."""
    world_size, rank = _get_distributed_settings()
    graph_settings.apply_sharding(dataset, world_size, rank)


def worker_init(user_fn: Callable[[int], None] | None) -> Callable[[int], None]:
    """The ``worker_init_fn`` that shards the graph by rank and worker, then calls the user's."""
    world_size, rank = _get_distributed_settings()
    return functools.partial(_sharding_worker_init_fn, user_fn, world_size, rank)
