"""stoker: keeps accelerators fed.

A torch-compatible data loading library over a numpy core. ``import stoker`` never
imports torch; :mod:`stoker.torch` is the one module that does.

The pipeline, as in ``torch.utils.data``::

    Dataset -> Sampler -> BatchSampler -> collate_fn -> DataLoader
"""

from __future__ import annotations

from stoker._errors import (
    CollateError,
    DatasetError,
    DatasetIndexError,
    ImageDecodeError,
    MissingExtraError,
    PackedFormatError,
    ShmError,
    StokerError,
    TooManyBadSamples,
    WorkerError,
)
from stoker._stacked import StackedSamples
from stoker._worker_info import WorkerInfo, WorkerRNG, get_worker_info
from stoker.collate import (
    PadCollate,
    RaggedCollate,
    collate_into,
    default_collate,
    default_collate_fn_map,
    default_convert,
    pad_collate,
    register_collate,
)
from stoker.datasets import (
    ArrayDataset,
    ChainDataset,
    ConcatDataset,
    Dataset,
    IterableDataset,
    MapDataset,
    Subset,
    is_iterable_dataset,
    random_split,
)
from stoker.engine.ray_workers import RayWorkers
from stoker.loader import DataLoader
from stoker.profiling import LoaderStats, profile
from stoker.samplers import (
    BatchSampler,
    BlockShuffleSampler,
    BucketBatchSampler,
    DistributedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)
from stoker.seeding import sample_rng, seed_everything
from stoker.streams import BucketStream, Mix, ShuffleBuffer, mix

__version__ = "0.1.0"

__all__ = [
    "ArrayDataset",
    "BatchSampler",
    "BlockShuffleSampler",
    "BucketBatchSampler",
    "BucketStream",
    "ChainDataset",
    "CollateError",
    "ConcatDataset",
    "DataLoader",
    "Dataset",
    "DatasetError",
    "DatasetIndexError",
    "DistributedSampler",
    "ImageDecodeError",
    "IterableDataset",
    "LoaderStats",
    "MapDataset",
    "MissingExtraError",
    "Mix",
    "PackedFormatError",
    "PadCollate",
    "RaggedCollate",
    "RandomSampler",
    "RayWorkers",
    "Sampler",
    "SequentialSampler",
    "ShmError",
    "ShuffleBuffer",
    "StackedSamples",
    "StokerError",
    "Subset",
    "SubsetRandomSampler",
    "TooManyBadSamples",
    "WeightedRandomSampler",
    "WorkerError",
    "WorkerInfo",
    "WorkerRNG",
    "collate_into",
    "default_collate",
    "default_collate_fn_map",
    "default_convert",
    "get_worker_info",
    "is_iterable_dataset",
    "mix",
    "pad_collate",
    "profile",
    "random_split",
    "register_collate",
    "sample_rng",
    "seed_everything",
]
