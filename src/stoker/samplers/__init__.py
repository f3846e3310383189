"""Samplers: which dataset indices a loader reads, in which order, in which batches.

The torch ones (:class:`SequentialSampler`, :class:`RandomSampler`,
:class:`SubsetRandomSampler`, :class:`WeightedRandomSampler`, :class:`BatchSampler`,
:class:`DistributedSampler`) keep torch's arguments and semantics; stoker adds
:class:`BucketBatchSampler` (batches of similar length), :class:`BlockShuffleSampler` (a
shuffle that keeps reads local) and :class:`ShardSampler` (ranks reading whole shards of
their own, block-shuffled).

Every stoker sampler counts epochs (``iter()`` advances the count, ``set_epoch(e)``
picks the next one), makes epoch ``e``'s order a pure function of its seed and ``e``
(unless given a ``torch.Generator``, which reproduces torch's order instead), and
saves and restores its position with ``state_dict()`` / ``load_state_dict()``.
"""

from __future__ import annotations

from stoker.samplers._base import Sampler
from stoker.samplers.basic import RandomSampler, SequentialSampler, SubsetRandomSampler
from stoker.samplers.batch import BatchSampler
from stoker.samplers.block_shuffle import BlockShuffleSampler
from stoker.samplers.bucketing import BucketBatchSampler
from stoker.samplers.distributed import DistributedSampler
from stoker.samplers.shards import ShardSampler
from stoker.samplers.weighted import WeightedRandomSampler

__all__ = [
    "BatchSampler",
    "BlockShuffleSampler",
    "BucketBatchSampler",
    "DistributedSampler",
    "RandomSampler",
    "Sampler",
    "SequentialSampler",
    "ShardSampler",
    "SubsetRandomSampler",
    "WeightedRandomSampler",
]
