"""Differential tests: stoker's DataLoader yields torch.utils.data.DataLoader's batches.

Same dataset objects, same samplers (or the same torch.Generator state), value for
value and dtype for dtype. stoker's core returns numpy, so its batches are converted
with ``torch.as_tensor`` before comparing.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest

import stoker

torch = pytest.importorskip(
    "torch", reason="the differential tests use torch.utils.data as the oracle"
)
tud = torch.utils.data

Point = collections.namedtuple("Point", ["x", "y"])


def assert_same(ours, theirs, path="batch") -> None:
    """Recursively asserts equal structure, values and dtypes."""
    if isinstance(theirs, torch.Tensor):
        mine = torch.as_tensor(ours)
        assert mine.dtype == theirs.dtype, f"{path}: dtype {mine.dtype} != {theirs.dtype}"
        assert mine.shape == theirs.shape, (
            f"{path}: shape {tuple(mine.shape)} != {tuple(theirs.shape)}"
        )
        assert torch.equal(mine, theirs), f"{path}: values differ"
    elif isinstance(theirs, dict):
        assert isinstance(ours, dict) and ours.keys() == theirs.keys(), path
        for key in theirs:
            assert_same(ours[key], theirs[key], f"{path}[{key!r}]")
    elif isinstance(theirs, (list, tuple)):
        assert type(ours) is type(theirs), (
            f"{path}: {type(ours).__name__} != {type(theirs).__name__}"
        )
        assert len(ours) == len(theirs), path
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert_same(a, b, f"{path}[{i}]")
    else:
        assert ours == theirs, f"{path}: {ours!r} != {theirs!r}"


def assert_loaders_agree(ours, theirs) -> None:
    ours_batches, their_batches = list(ours), list(theirs)
    assert len(ours_batches) == len(their_batches) == len(theirs) == len(ours)
    for i, (a, b) in enumerate(zip(ours_batches, their_batches, strict=True)):
        assert_same(a, b, f"batch {i}")


class Records(tud.Dataset):
    """A torch Dataset whose samples mix every container and scalar kind."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        rng = np.random.default_rng(i)
        return {
            "image": rng.random((3, 4, 4), dtype=np.float32),
            "label": i % 5,
            "weight": float(i) / 3,
            "flag": bool(i % 2),
            "name": f"item-{i}",
            "point": Point(np.int32(i), np.float64(-i)),
            "pair": (i, [i, i + 1]),
        }


class PlainPairs:
    def __len__(self) -> int:
        return 23

    def __getitem__(self, i: int):
        return np.full(3, i, dtype=np.int16), i * 0.5


@pytest.mark.parametrize("batch_size", [1, 4, 7])
@pytest.mark.parametrize("drop_last", [False, True])
def test_sequential_batches_of_mixed_records(batch_size, drop_last) -> None:
    ds = Records(17)
    assert_loaders_agree(
        stoker.DataLoader(ds, batch_size=batch_size, drop_last=drop_last),
        tud.DataLoader(ds, batch_size=batch_size, drop_last=drop_last),
    )


def test_shuffled_with_the_same_torch_generator_state() -> None:
    ds = PlainPairs()
    ours = stoker.DataLoader(
        ds, batch_size=5, shuffle=True, generator=torch.Generator().manual_seed(11)
    )
    theirs = tud.DataLoader(
        ds, batch_size=5, shuffle=True, generator=torch.Generator().manual_seed(11)
    )
    for _epoch in range(3):  # the generators advance identically epoch after epoch
        assert_loaders_agree(ours, theirs)


def test_a_torch_sampler_is_used_as_it_is() -> None:
    ds = PlainPairs()
    theirs = tud.DataLoader(
        ds, batch_size=4, sampler=tud.RandomSampler(ds, generator=torch.Generator().manual_seed(5))
    )
    ours = stoker.DataLoader(
        ds, batch_size=4, sampler=tud.RandomSampler(ds, generator=torch.Generator().manual_seed(5))
    )
    assert_loaders_agree(ours, theirs)


@pytest.mark.parametrize(
    "make_sampler",
    [
        lambda lib, ds, g: lib.RandomSampler(ds, replacement=True, num_samples=30, generator=g),
        lambda lib, ds, g: lib.SubsetRandomSampler([1, 4, 9, 16, 22, 3], generator=g),
        lambda lib, ds, g: lib.WeightedRandomSampler([0.1, 2.0, 0.5] * 7 + [1, 1], 12, generator=g),
        lambda lib, ds, g: lib.WeightedRandomSampler(
            [0.1, 2.0, 0.5] * 7 + [1, 1], 9, replacement=False, generator=g
        ),
    ],
    ids=["random-replacement", "subset-random", "weighted", "weighted-no-replacement"],
)
def test_stoker_samplers_with_torch_generators_equal_torch_samplers(make_sampler) -> None:
    ds = PlainPairs()
    ours = stoker.DataLoader(
        ds, batch_size=4, sampler=make_sampler(stoker, ds, torch.Generator().manual_seed(3))
    )
    theirs = tud.DataLoader(
        ds, batch_size=4, sampler=make_sampler(tud, ds, torch.Generator().manual_seed(3))
    )
    assert_loaders_agree(ours, theirs)


def test_distributed_sampler_without_shuffle_matches_torch_on_every_rank() -> None:
    ds = PlainPairs()
    for rank in range(3):
        kwargs = {"num_replicas": 3, "rank": rank, "shuffle": False}
        assert_loaders_agree(
            stoker.DataLoader(ds, batch_size=3, sampler=stoker.DistributedSampler(ds, **kwargs)),
            tud.DataLoader(ds, batch_size=3, sampler=tud.DistributedSampler(ds, **kwargs)),
        )


def test_tensor_dataset_and_array_dataset_agree() -> None:
    x = torch.arange(40, dtype=torch.float32).reshape(20, 2)
    y = torch.arange(20) % 4
    assert_loaders_agree(
        stoker.DataLoader(stoker.ArrayDataset(x.numpy(), y.numpy()), batch_size=6),
        tud.DataLoader(tud.TensorDataset(x, y), batch_size=6),
    )
    # torch tensors given to ArrayDataset come back as torch tensors
    assert_loaders_agree(
        stoker.DataLoader(stoker.ArrayDataset(x, y), batch_size=6),
        tud.DataLoader(tud.TensorDataset(x, y), batch_size=6),
    )


def test_unbatched_and_custom_batch_sampler_modes() -> None:
    ds = Records(6)
    assert_loaders_agree(
        stoker.DataLoader(ds, batch_size=None), tud.DataLoader(ds, batch_size=None)
    )
    batches = [[5, 0], [2], [1, 3, 4]]
    assert_loaders_agree(
        stoker.DataLoader(ds, batch_sampler=batches), tud.DataLoader(ds, batch_sampler=batches)
    )


class TorchStream(tud.IterableDataset):
    def __iter__(self):
        for i in range(11):
            yield {"i": i, "v": np.arange(i, i + 2)}


@pytest.mark.parametrize("drop_last", [False, True])
def test_torch_iterable_dataset(drop_last) -> None:
    ds = TorchStream()
    ours = list(stoker.DataLoader(ds, batch_size=4, drop_last=drop_last))
    theirs = list(tud.DataLoader(ds, batch_size=4, drop_last=drop_last))
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        assert_same(a, b)


def test_concat_subset_and_random_split_feed_identical_batches() -> None:
    base = PlainPairs()
    g_ours, g_theirs = torch.Generator().manual_seed(2), torch.Generator().manual_seed(2)
    ours_parts = stoker.random_split(base, [0.6, 0.4], generator=g_ours)
    their_parts = tud.random_split(base, [0.6, 0.4], generator=g_theirs)
    ours = stoker.ConcatDataset([ours_parts[1], stoker.Subset(base, [0, 2, 4])])
    theirs = tud.ConcatDataset([their_parts[1], tud.Subset(base, [0, 2, 4])])
    assert_loaders_agree(
        stoker.DataLoader(ours, batch_size=4), tud.DataLoader(theirs, batch_size=4)
    )
