"""ShardSampler: whole shards per rank, every sample exactly once across the ranks per epoch."""

from __future__ import annotations

import numpy as np
import pytest

from stoker.formats.packed import PackedDataset, PackedWriter
from stoker.samplers import ShardSampler

SIZES = [7, 3, 5, 5, 9, 1, 6, 4]  # uneven on purpose: 40 samples


def _shard_of(sizes: list[int]) -> np.ndarray:
    return np.repeat(np.arange(len(sizes)), sizes)


def _ranks(sizes: list[int], replicas: int, **options) -> list[ShardSampler]:
    return [
        ShardSampler(range(sum(sizes)), shard_sizes=sizes, num_replicas=replicas, rank=r, **options)
        for r in range(replicas)
    ]


@pytest.mark.parametrize("replicas", [2, 3])
def test_every_sample_once_across_ranks_and_each_shard_on_one_rank(replicas: int) -> None:
    shard_of = _shard_of(SIZES)
    samplers = _ranks(SIZES, replicas, seed=5)
    dealings = set()
    for _ in range(4):  # four epochs
        lengths = [len(s) for s in samplers]
        orders = [list(s) for s in samplers]
        assert [len(o) for o in orders] == lengths
        assert sorted(i for order in orders for i in order) == list(range(sum(SIZES)))
        owners = [{int(shard_of[i]) for i in order} for order in orders]
        for a in range(replicas):
            for b in range(a + 1, replicas):
                assert not owners[a] & owners[b]  # no shard read by two ranks
        assert max(lengths) - min(lengths) <= max(SIZES)  # dealt to the emptiest rank
        dealings.add(tuple(tuple(sorted(o)) for o in owners))
    assert len(dealings) > 1  # the shards go to other ranks in other epochs


def test_equal_shards_give_equal_counts_and_stay_within_windows() -> None:
    sizes = [5] * 6
    shard_of = _shard_of(sizes)
    samplers = _ranks(sizes, 3, seed=0, window=2)
    assert [len(s) for s in samplers] == [10, 10, 10]
    assert samplers[0].min_len() == 10
    for sampler in samplers:
        order = np.array(list(sampler))
        first, second = set(shard_of[order[:10]]), set(shard_of[order[10:]])
        assert len(first) == 2 and not second  # two whole shards, read as one window
        assert sorted(order.tolist()) == sorted(i for s in first for i in range(5 * s, 5 * s + 5))
        assert order.tolist() != sorted(order.tolist())  # shuffled within the window


def test_without_shuffle_each_rank_reads_its_shards_front_to_back() -> None:
    samplers = _ranks(SIZES, 2, shuffle=False)
    orders = [list(s) for s in samplers]
    for order in orders:
        assert order == sorted(order)
    assert sorted(orders[0] + orders[1]) == list(range(40))
    assert [list(s) for s in samplers] == orders  # the same every epoch


def test_the_order_is_a_function_of_seed_and_epoch_and_resumes_from_state() -> None:
    a, b = _ranks(SIZES, 2, seed=3)[0], _ranks(SIZES, 2, seed=3)[0]
    assert list(a) == list(b)
    state = a.state_dict()
    expected = list(a)
    resumed = _ranks(SIZES, 2, seed=99)[0]
    resumed.load_state_dict(state)
    assert list(resumed) == expected
    assert list(_ranks(SIZES, 2, seed=4)[0]) != list(_ranks(SIZES, 2, seed=3)[0])


def test_a_packed_dataset_gives_its_shards(tmp_path) -> None:
    with PackedWriter(tmp_path / "p", max_shard_bytes=1400) as writer:
        for i in range(60):
            writer.add({"x": np.full(64, i, dtype=np.int32), "label": i})
    ds = PackedDataset(tmp_path / "p")
    sampler = ShardSampler(ds, num_replicas=2, rank=1, seed=0)
    assert sampler.shard_sizes.tolist() == [5] * 12 and len(sampler) == 30


def test_wrong_sizes_and_a_dataset_without_shards_are_named() -> None:
    with pytest.raises(ValueError, match=r"shard_sizes add up to 9 samples but the dataset has 10"):
        ShardSampler(range(10), shard_sizes=[3, 3, 3], num_replicas=2, rank=0)
    with pytest.raises(TypeError, match=r"cannot tell the shards of a range: pass shard_sizes="):
        ShardSampler(range(10), num_replicas=2, rank=0)
    with pytest.raises(ValueError, match=r"Invalid rank 2"):
        ShardSampler(range(10), shard_sizes=[10], num_replicas=2, rank=2)
