"""The samplers package's public surface, and that importing it never imports torch."""

from __future__ import annotations

import subprocess
import sys

import stoker.samplers as samplers
from stoker.samplers import (
    _base,
    basic,
    batch,
    block_shuffle,
    bucketing,
    distributed,
    shards,
    weighted,
)


def test_all_is_sorted_and_complete() -> None:
    assert samplers.__all__ == sorted(samplers.__all__)
    assert set(samplers.__all__) == {
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
    }
    for name in samplers.__all__:
        assert getattr(samplers, name).__module__.startswith("stoker.samplers")


def test_every_module_all_is_sorted_and_resolves() -> None:
    for module in (_base, basic, batch, block_shuffle, bucketing, distributed, shards, weighted):
        assert module.__all__ == sorted(module.__all__), module.__name__
        for name in module.__all__:
            assert hasattr(module, name), (module.__name__, name)


def test_importing_and_using_samplers_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "import stoker.samplers as s\n"
        "b = s.BatchSampler(s.RandomSampler(range(50), generator=3), 8, False)\n"
        "assert sum(len(x) for x in b) == 50\n"
        "d = s.DistributedSampler(range(10), num_replicas=2, rank=1)\n"
        "assert len(list(d)) == 5\n"
        "list(s.WeightedRandomSampler([1.0, 2.0], 4, generator=0))\n"
        "list(s.BucketBatchSampler([3, 1, 2], 2, generator=0))\n"
        "list(s.BlockShuffleSampler(range(9), 2, generator=0))\n"
        "list(s.ShardSampler(range(9), shard_sizes=[3] * 3, num_replicas=2, rank=0))\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "False"
