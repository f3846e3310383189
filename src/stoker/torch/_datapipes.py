"""torch ``IterDataPipe`` graphs on stoker's engine, handled as torch's loader handles them.

* ``shuffle=`` switches the graph's shufflers on or off (torch's ``apply_shuffle_settings``).
* Every epoch seeds the graph's random datapipes from one shared seed, drawn when the
  epoch starts from the loader's ``generator`` (torch's global one for ``None``) and
  broadcast from rank 0 where ``torch.distributed`` is initialised, as torch's loader
  draws it: all workers and ranks shuffle alike before ``sharding_filter()`` splits the
  stream, different epochs differ, and ``torch.manual_seed(s)`` before an epoch repeats it.
* ``sharding_filter()`` is applied per rank, and per rank and worker inside workers, with
  torch's own ``_sharding_worker_init_fn``, so each element arrives once.

The shared seed is the epoch's seed of the loader, so workers (persistent ones too) learn
it from the epoch's start message: it is their ``get_worker_info().seed`` minus their id.
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

from stoker._worker_info import get_worker_info

__all__ = ["SeededDataPipe", "is_datapipe", "prepare", "worker_init"]


def is_datapipe(dataset: Any) -> bool:
    return isinstance(dataset, IterDataPipe)


class SeededDataPipe(_IterDataPipeSerializationWrapper):
    """torch's serialisation wrapper of a datapipe, reseeded by ``set_epoch``."""

    def __init__(self, datapipe: IterDataPipe) -> None:
        super().__init__(datapipe)
        self.epoch_seed: int | None = None  # the main process's: set by the loader each epoch

    def set_epoch(self, epoch: int) -> None:
        info = get_worker_info()
        seed = info.seed - info.id if info is not None else self.epoch_seed
        if seed is None:
            raise AssertionError(
                "the loader sets the datapipe's epoch seed before the epoch starts"
            )
        graph_settings.apply_random_seed(self._datapipe, torch.Generator().manual_seed(seed))


def prepare(datapipe: IterDataPipe, shuffle: bool | None) -> SeededDataPipe:
    """What the loader keeps as its dataset: the graph with torch's shuffle setting applied."""
    if shuffle is not None:
        datapipe = graph_settings.apply_shuffle_settings(datapipe, shuffle=shuffle)
    return SeededDataPipe(datapipe)


def draw_epoch_seed(generator: Any) -> int:
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
