"""What the loader hands the engine for one epoch: a frozen plan and a few callbacks.

The engine never sees the loader. :meth:`stoker.DataLoader._begin_epoch` decides the epoch
(its number, seed, the sampler's order, the batches a resumed epoch skips) and describes
everything else the engine needs in an :class:`EpochPlan`; what the engine reports back
goes through :class:`EpochHooks`. Neither side writes into the other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stoker.engine.pool import Pool

__all__ = ["EpochHooks", "EpochPlan"]


@dataclass(frozen=True, slots=True)
class EpochPlan:
    """How to run one epoch: everything the engine reads, fixed when the epoch starts."""

    iterable: bool  # an IterableDataset: workers read their own streams, no indices
    auto_collation: bool  # indices come in batches (a batch sampler), collated into batches
    in_order: bool  # hand batches out in sampler order (False: as they finish)
    timeout_s: float  # 0: wait forever for a worker's batch
    restart_dead_workers: bool  # on_worker_death="restart"
    copy_batches: bool  # copy each batch out of shared memory before handing it out
    prefetch_factor: int  # batches loaded ahead per worker (torch's bound)
    memory_budget: int  # bytes batches in flight and slots may hold
    budget_is_users: bool  # the user gave memory_budget: it binds from the first batch
    dataset_name: str  # for messages
    dataset_has_len: bool  # an IterableDataset with a length is checked against it instead
    batches: int | None = None  # batches in the epoch when the sampler knows (map-style)
    # deliveries a state_dict() may take back (a pinning thread's read-ahead): an iterable
    # dataset's workers keep their streams' states that far back
    take_backs: int = 0


@dataclass(frozen=True, slots=True)
class EpochHooks:
    """What the engine calls back: the only ways it reaches the loader's side."""

    deliver: Callable[[Any], Any]  # the last step before a batch reaches the user (tensors)
    record_bad_samples: Callable[[int, tuple[Any, ...]], None] | None  # on_error="skip"
    workers_changed: Callable[[int, int], None]  # autotuning changed (num_workers, prefetch)
    # worker_mode="auto": a drained pool is swapped for a new one of the kind given ("thread"
    # or "process"); the loader makes it, owns it if persistent, and stops the old one
    replace_pool: Callable[[str], Pool] | None = None
