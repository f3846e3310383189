"""DistributedSampler: pad, drop and uneven splits, topology discovery, padding masks."""

from __future__ import annotations

import sys
import types
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker._errors import DatasetError
from stoker.samplers import DistributedSampler


def _all_ranks(n: int, replicas: int, **kwargs: object) -> list[DistributedSampler]:
    return [DistributedSampler(range(n), replicas, r, **kwargs) for r in range(replicas)]


@given(
    n=st.integers(0, 80),
    replicas=st.integers(1, 9),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**40),
    epoch=st.integers(0, 5),
)
@settings(max_examples=80, deadline=None)
def test_every_mode_covers_the_dataset(
    n: int, replicas: int, shuffle: bool, seed: int, epoch: int
) -> None:
    for mode in ("pad", "drop", "uneven"):
        shares = []
        for s in _all_ranks(n, replicas, shuffle=shuffle, seed=seed, mode=mode):
            s.set_epoch(epoch)
            share = list(s)
            assert len(share) == len(s) == s.num_samples
            shares.append(share)
        everything = [i for share in shares for i in share]
        if mode == "uneven":
            assert sorted(everything) == list(range(n))  # each index exactly once
            assert {len(x) for x in shares} <= {n // replicas, n // replicas + 1}
        elif mode == "drop":
            assert len(set(everything)) == len(everything)  # disjoint
            assert len(everything) == n - n % replicas
            assert {len(x) for x in shares} == {n // replicas}
        else:
            assert set(everything) == set(range(n))
            assert {len(x) for x in shares} == {-(-n // replicas)}


@given(n=st.integers(0, 80), replicas=st.integers(1, 12), shuffle=st.booleans())
@settings(max_examples=60, deadline=None)
def test_padding_mask_marks_exactly_the_duplicates(n: int, replicas: int, shuffle: bool) -> None:
    samplers = _all_ranks(n, replicas, shuffle=shuffle, seed=3)
    real = []
    padded = 0
    for s in samplers:
        share = np.array(list(s), dtype=np.int64)
        mask = s.padding_mask()
        assert mask.dtype == bool and mask.shape == share.shape
        assert s.num_padded == int(mask.sum())
        padded += s.num_padded
        real.extend(share[~mask].tolist())
        # padding only at the end of a rank's order
        assert not mask[: len(mask) - s.num_padded].any()
    assert sorted(real) == list(range(n))  # without the padding: each index exactly once
    assert padded == samplers[0].total_size - n


def test_padding_mask_is_all_false_when_nothing_is_padded() -> None:
    for mode in ("drop", "uneven"):
        s = DistributedSampler(range(10), 4, 1, mode=mode)
        assert s.padding_mask().tolist() == [False] * len(s)
        assert s.num_padded == 0


def test_padding_repeats_the_order_cyclically_when_the_dataset_is_tiny() -> None:
    shares = [list(s) for s in _all_ranks(2, 5, shuffle=False)]
    assert shares == [[0], [1], [0], [1], [0]]


@given(n=st.integers(1, 100), replicas=st.integers(2, 8), seed=st.integers(0, 2**40))
@settings(max_examples=40, deadline=None)
def test_all_ranks_agree_on_the_permutation(n: int, replicas: int, seed: int) -> None:
    for epoch in (0, 1):
        samplers = _all_ranks(n, replicas, seed=seed, mode="uneven")
        for s in samplers:
            s.set_epoch(epoch)
        shares = [list(s) for s in samplers]
        # Dealt round-robin from one permutation: interleaving the shares rebuilds it.
        rebuilt = [shares[p % replicas][p // replicas] for p in range(n)]
        assert sorted(rebuilt) == list(range(n))
        # The padded and dropped modes deal out the same permutation.
        pad = DistributedSampler(range(n), replicas, 0, seed=seed)
        pad.set_epoch(epoch)
        assert list(pad)[: len(shares[0])] == shares[0]


def test_shuffle_depends_on_seed_and_epoch() -> None:
    a = DistributedSampler(range(100), 2, 0, seed=1)
    b = DistributedSampler(range(100), 2, 0, seed=2)
    first = list(a)
    assert first != list(b)
    assert list(a) != first  # the next epoch
    c = DistributedSampler(range(100), 2, 0, seed=1)
    assert list(c) == first


def test_rank_is_checked_with_a_clear_message() -> None:
    with pytest.raises(
        ValueError, match=r"Invalid rank 4: with num_replicas=4, rank must be .* \[0, 3\]"
    ):
        DistributedSampler(range(10), num_replicas=4, rank=4)
    with pytest.raises(ValueError, match=r"Invalid rank -1"):
        DistributedSampler(range(10), num_replicas=4, rank=-1)
    with pytest.raises(ValueError, match=r"num_replicas must be a positive integer, got 0"):
        DistributedSampler(range(10), num_replicas=0, rank=0)


def test_mode_and_drop_last_are_checked() -> None:
    with pytest.raises(
        ValueError, match=r"mode must be one of \('pad', 'drop', 'uneven'\), got 'odd'"
    ):
        DistributedSampler(range(10), 2, 0, mode="odd")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"drop_last=True asks for mode 'drop' but mode='uneven'"):
        DistributedSampler(range(10), 2, 0, drop_last=True, mode="uneven")
    assert DistributedSampler(range(10), 2, 0, drop_last=True).mode == "drop"
    assert DistributedSampler(range(10), 2, 0).mode == "pad"
    assert DistributedSampler(range(10), 2, 0, mode="drop").drop_last is True
    assert DistributedSampler(range(10), 2, 0, mode="uneven").drop_last is False
    with pytest.raises(TypeError, match=r"shuffle must be True or False, got str: 'yes'"):
        DistributedSampler(range(10), 2, 0, shuffle="yes")  # type: ignore[arg-type]


def test_seed_is_checked() -> None:
    with pytest.raises(ValueError, match=r"seed must be a non-negative int, got -5"):
        DistributedSampler(range(10), 2, 0, seed=-5)
    with pytest.raises(TypeError, match=r"seed must be a non-negative int, got float: 1.5"):
        DistributedSampler(range(10), 2, 0, seed=1.5)  # type: ignore[arg-type]
    s = DistributedSampler(range(10), 2, 0, seed=1)
    s.seed = 2  # settable, as in torch
    assert list(s) == list(DistributedSampler(range(10), 2, 0, seed=2))


def _without_dist(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch.distributed", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)


def test_topology_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    _without_dist(monkeypatch)
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    s = DistributedSampler(range(9), shuffle=False)
    assert (s.num_replicas, s.rank) == (3, 2)
    assert list(s) == [2, 5, 8]
    # an explicit argument wins over the environment
    assert DistributedSampler(range(9), rank=0).rank == 0


def test_missing_topology_says_how_to_fix_it(monkeypatch: pytest.MonkeyPatch) -> None:
    _without_dist(monkeypatch)
    with pytest.raises(ValueError, match=r"could not find num_replicas and rank.*torchrun"):
        DistributedSampler(range(9))
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=r"could not find rank: .*Pass num_replicas= and rank="):
        DistributedSampler(range(9))
    monkeypatch.setenv("RANK", "one")
    with pytest.raises(
        ValueError, match=r"environment variable RANK .* not an integer: RANK='one'"
    ):
        DistributedSampler(range(9))


def test_topology_comes_from_an_initialized_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    _without_dist(monkeypatch)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    fake = types.ModuleType("torch.distributed")
    fake.is_available = lambda: True  # type: ignore[attr-defined]
    fake.is_initialized = lambda: True  # type: ignore[attr-defined]
    fake.get_world_size = lambda: 4  # type: ignore[attr-defined]
    fake.get_rank = lambda: 3  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch.distributed", fake)
    s = DistributedSampler(range(8))
    assert (s.num_replicas, s.rank) == (4, 3)
    fake.is_initialized = lambda: False  # type: ignore[attr-defined]
    s = DistributedSampler(range(8))  # not initialized: the environment decides
    assert (s.num_replicas, s.rank) == (1, 0)


def test_a_dataset_that_changes_length_is_reported() -> None:
    data = list(range(10))
    s = DistributedSampler(data, 2, 0)
    data.append(10)
    with pytest.raises(DatasetError, match=r"had 10 samples when .* built and has 11 now"):
        list(s)


def test_uneven_split_gives_the_first_ranks_one_more() -> None:
    lengths = [len(s) for s in _all_ranks(10, 4, mode="uneven")]
    assert lengths == [3, 3, 2, 2]
    counts = Counter(i for s in _all_ranks(10, 4, mode="uneven", shuffle=False) for i in s)
    assert set(counts.values()) == {1}


def test_topology_from_a_real_torch_process_group(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    torch = pytest.importorskip("torch", reason="needs torch.distributed as the topology source")
    dist = torch.distributed
    if not dist.is_available() or dist.is_initialized():
        pytest.skip("torch.distributed is unavailable or already initialized in this process")
    monkeypatch.setenv("RANK", "5")  # the process group, not the environment, must win
    monkeypatch.setenv("WORLD_SIZE", "7")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        s = DistributedSampler(range(6), shuffle=False)
        assert (s.num_replicas, s.rank) == (1, 0)
        assert list(s) == list(range(6))
    finally:
        dist.destroy_process_group()
