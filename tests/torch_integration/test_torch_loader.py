"""stoker.torch.DataLoader against torch.utils.data.DataLoader, batch for batch.

The oracle is real torch: the same dataset object goes through both loaders and every
node of every batch must have the same type, and every tensor the same dtype, shape
and values. stoker runs with no workers, process workers and thread workers.
"""

from __future__ import annotations

import collections
import gc

import numpy as np
import pytest

import stoker

torch = pytest.importorskip(
    "torch", reason="stoker.torch is the torch integration; torch is its oracle"
)
tud = torch.utils.data
from stoker.torch import DataLoader

Point = collections.namedtuple("Point", ["x", "y"])

LOADING = [
    pytest.param({"num_workers": 0}, id="main"),
    pytest.param({"num_workers": 2}, id="process"),
    pytest.param({"num_workers": 2, "worker_mode": "thread"}, id="thread"),
]


def assert_same(ours, theirs, path="batch") -> None:
    """Same type at every node; tensors: same dtype, shape and values."""
    assert type(ours) is type(theirs), f"{path}: {type(ours).__name__} != {type(theirs).__name__}"
    if isinstance(theirs, torch.Tensor):
        assert ours.dtype == theirs.dtype, f"{path}: dtype {ours.dtype} != {theirs.dtype}"
        assert ours.shape == theirs.shape, (
            f"{path}: shape {tuple(ours.shape)} != {tuple(theirs.shape)}"
        )
        assert torch.equal(ours, theirs), f"{path}: values differ"
    elif isinstance(theirs, dict):
        assert ours.keys() == theirs.keys(), f"{path}: keys {list(ours)} != {list(theirs)}"
        for key in theirs:
            assert_same(ours[key], theirs[key], f"{path}[{key!r}]")
    elif isinstance(theirs, (list, tuple)):
        assert len(ours) == len(theirs), f"{path}: length {len(ours)} != {len(theirs)}"
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert_same(a, b, f"{path}[{i}]")
    else:
        assert ours == theirs, f"{path}: {ours!r} != {theirs!r}"


def assert_batches_agree(ours, theirs) -> None:
    assert len(ours) == len(theirs), f"{len(ours)} batches != {len(theirs)}"
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert_same(a, b, f"batch {i}")


# ------------------------------------------------------------------ datasets


class Records(tud.Dataset):
    """A torch Dataset whose samples hold every container and leaf kind default_collate takes."""

    def __len__(self) -> int:
        return 11

    def __getitem__(self, i: int):
        rng = np.random.default_rng(i)
        return {
            "image": rng.random((3, 4), dtype=np.float32),
            "mask": rng.random(5) > 0.5,
            "label": i % 3,
            "weight": i / 4,
            "flag": bool(i % 2),
            "name": f"item-{i}",
            "raw": f"b{i}".encode(),
            "scalar": np.int16(i),
            "point": Point(np.float64(-i), [f"p{i}", "q"]),
            "pair": (f"s{i}", np.uint8(i), [i, (i, f"t{i}")]),
            "tensor": torch.full((2,), float(i)),
        }


class Sentences(tud.Dataset):
    def __len__(self) -> int:
        return 7

    def __getitem__(self, i: int):
        return f"sentence number {i}"


class TextPairs(tud.Dataset):
    """Tuple samples with strings: torch returns the strings as tuples, not lists."""

    def __len__(self) -> int:
        return 9

    def __getitem__(self, i: int):
        return f"q{i}", f"a{i}", np.array([i, -i], dtype=np.int32)


class TensorSamples(tud.Dataset):
    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int):
        return {"x": torch.arange(3, dtype=torch.float16) + i, "y": torch.tensor(i)}


class Stream(tud.IterableDataset):
    """Splits its stream over workers with torch's get_worker_info, as torch users write it."""

    def __iter__(self):
        info = tud.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(worker, 19, workers):
            yield {"i": i, "v": np.arange(i, i + 3, dtype=np.float32), "s": str(i)}


class StokerStream(stoker.IterableDataset):
    """The same stream for stoker, split with stoker's get_worker_info."""

    def __iter__(self):
        info = stoker.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(worker, 19, workers):
            yield {"i": i, "v": np.arange(i, i + 3, dtype=np.float32), "s": str(i)}


# ------------------------------------------------------------------ differential tests


@pytest.mark.parametrize("loading", LOADING)
@pytest.mark.parametrize(
    ("make", "kwargs"),
    [
        pytest.param(Records, {"batch_size": 4}, id="records"),
        pytest.param(Records, {"batch_size": 3, "drop_last": True}, id="records-drop-last"),
        pytest.param(Records, {"batch_size": None}, id="records-unbatched"),
        pytest.param(Sentences, {"batch_size": 3}, id="strings"),
        pytest.param(TextPairs, {"batch_size": 4}, id="string-tuples"),
        pytest.param(TensorSamples, {"batch_size": 4}, id="tensor-samples"),
        pytest.param(TensorSamples, {"batch_size": None}, id="tensor-samples-unbatched"),
    ],
)
def test_map_style_batches_equal_torch(make, kwargs, loading) -> None:
    ds = make()
    expected = list(tud.DataLoader(ds, **kwargs))
    assert_batches_agree(list(DataLoader(ds, **kwargs, **loading)), expected)


@pytest.mark.parametrize("loading", LOADING)
def test_tensor_dataset_and_array_dataset_of_tensors_equal_torch(loading) -> None:
    x = torch.arange(60, dtype=torch.float32).reshape(20, 3)
    y = torch.arange(20) % 4
    expected = list(tud.DataLoader(tud.TensorDataset(x, y), batch_size=6))
    assert_batches_agree(
        list(DataLoader(tud.TensorDataset(x, y), batch_size=6, **loading)), expected
    )
    assert_batches_agree(
        list(DataLoader(stoker.ArrayDataset(x, y), batch_size=6, **loading)), expected
    )
    assert_batches_agree(
        list(DataLoader(stoker.ArrayDataset(x.numpy(), y.numpy()), batch_size=6, **loading)),
        expected,
    )


@pytest.mark.parametrize("loading", LOADING)
def test_iterable_dataset_stream_equals_torch(loading) -> None:
    """torch's get_worker_info answers inside stoker's workers, so the stream splits as in torch."""
    expected = list(tud.DataLoader(Stream(), batch_size=4, num_workers=loading["num_workers"]))
    assert_batches_agree(list(DataLoader(Stream(), batch_size=4, **loading)), expected)
    assert_batches_agree(list(DataLoader(StokerStream(), batch_size=4, **loading)), expected)
    assert tud.get_worker_info() is None  # and nowhere else


@pytest.mark.parametrize("num_workers", [0, 2])
def test_shuffle_with_a_torch_generator_equals_torch_every_epoch(num_workers) -> None:
    ds = TextPairs()
    ours = DataLoader(
        ds,
        batch_size=2,
        shuffle=True,
        num_workers=num_workers,
        generator=torch.Generator().manual_seed(4),
    )
    theirs = tud.DataLoader(
        ds, batch_size=2, shuffle=True, generator=torch.Generator().manual_seed(4)
    )
    for _epoch in range(2):
        assert_batches_agree(list(ours), list(theirs))


def test_torch_samplers_and_batch_samplers_are_taken_as_they_are() -> None:
    ds = Records()
    batch_sampler = tud.BatchSampler(
        tud.RandomSampler(ds, generator=torch.Generator().manual_seed(2)), 3, False
    )
    expected = list(
        tud.DataLoader(
            ds,
            batch_sampler=tud.BatchSampler(
                tud.RandomSampler(ds, generator=torch.Generator().manual_seed(2)), 3, False
            ),
        )
    )
    assert_batches_agree(list(DataLoader(ds, batch_sampler=batch_sampler)), expected)


def test_known_difference_mixed_int_and_float_samples_are_float64() -> None:
    """Documented in DataLoader's docstring: torch builds float32 here, stoker float64."""
    ds = [1, 2.5, 3]
    (theirs,) = tud.DataLoader(ds, batch_size=3)
    (ours,) = DataLoader(ds, batch_size=3)
    assert theirs.dtype == torch.float32
    assert ours.dtype == torch.float64
    assert ours.tolist() == theirs.tolist()


# ------------------------------------------------------------------ conversion rules


class Items(tud.Dataset):
    def __init__(self, items) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        return self.items[i]


def test_unbatched_arrays_become_tensors_over_the_same_memory() -> None:
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    (tensor,) = DataLoader(Items([array]), batch_size=None)
    assert isinstance(tensor, torch.Tensor)
    assert tensor.data_ptr() == array.ctypes.data  # zero-copy
    array[0, 0] = 100.0
    assert tensor[0, 0].item() == 100.0


def test_arrays_torch_cannot_share_are_copied_without_a_warning() -> None:
    read_only = np.arange(4, dtype=np.int64)
    read_only.flags.writeable = False
    reversed_view = np.arange(5, dtype=np.int32)[::-1]
    big_endian = np.arange(3, dtype=">f4")
    (a, b, c) = next(
        iter(DataLoader(Items([(read_only, reversed_view, big_endian)]), batch_size=None))
    )
    assert a.tolist() == [0, 1, 2, 3] and a.data_ptr() != read_only.ctypes.data
    assert b.tolist() == [4, 3, 2, 1, 0] and b.dtype == torch.int32
    assert c.tolist() == [0.0, 1.0, 2.0] and c.dtype == torch.float32
    a.add_(1)  # the copy is writable and private
    assert read_only.tolist() == [0, 1, 2, 3]


def test_leaves_torch_has_no_tensor_for_pass_through_unchanged() -> None:
    words = np.array(["a", "bc"])
    stamp = np.datetime64("2024-01-02")
    huge = np.uint64(2**64 - 1)
    sample = {
        "words": words,
        "stamp": stamp,
        "text": "x",
        "raw": b"y",
        "n": 7,
        "f": 0.5,
        "none": None,
        "huge": huge,
    }
    (out,) = DataLoader(Items([sample]), batch_size=None)
    assert out["words"] is words
    assert out["stamp"] is stamp
    assert (out["text"], out["raw"], out["n"], out["f"], out["none"]) == ("x", b"y", 7, 0.5, None)
    assert isinstance(out["huge"], torch.Tensor) and out["huge"].dtype == torch.uint64
    assert out["huge"].item() == 2**64 - 1


def test_custom_collate_results_are_converted_and_containers_kept() -> None:
    class Batch(dict):
        """A dict subclass with an attribute, kept by the shallow-copy rebuild."""

    def collate(samples):
        batch = Batch(x=np.stack(samples), names=[str(s[0]) for s in samples])
        batch.note = "kept"
        return batch

    (out,) = DataLoader(Items([np.zeros(2), np.ones(2)]), batch_size=2, collate_fn=collate)
    assert type(out) is Batch and out.note == "kept"
    assert isinstance(out["x"], torch.Tensor) and out["x"].dtype == torch.float64
    assert out["names"] == ["0.0", "1.0"]  # lists of str stay lists with a custom collate


# ------------------------------------------------------------------ randomness


def shuffled_run(num_workers: int, seed: int) -> tuple[list[list[int]], list[float]]:
    class Noisy(tud.Dataset):
        def __len__(self) -> int:
            return 12

        def __getitem__(self, i: int):
            return i, torch.rand(()).item()

    torch.manual_seed(seed)
    loader = DataLoader(Noisy(), batch_size=4, shuffle=True, num_workers=num_workers)
    orders, noise = [], []
    for _epoch in range(2):
        for index, value in loader:
            orders.append(index.tolist())
            noise.extend(value.tolist())
    return orders, noise


@pytest.mark.parametrize("num_workers", [0, 2])
def test_torch_manual_seed_makes_a_run_repeat(num_workers) -> None:
    first, second, other = (
        shuffled_run(num_workers, 0),
        shuffled_run(num_workers, 0),
        shuffled_run(num_workers, 1),
    )
    assert first == second
    assert first[0] != other[0]
    orders = first[0]
    assert orders[:3] != orders[3:]  # epochs differ
    assert sorted(i for batch in orders[:3] for i in batch) == list(range(12))


def test_generator_none_is_kept_and_torch_rng_decides_the_order() -> None:
    torch.manual_seed(3)
    loader = DataLoader(list(range(20)), batch_size=20, shuffle=True)
    assert loader.generator is None
    (first,) = loader
    torch.manual_seed(3)
    (again,) = DataLoader(list(range(20)), batch_size=20, shuffle=True)
    assert first.tolist() == again.tolist()
    assert first.tolist() != list(range(20))


def test_state_dict_resumes_a_torch_seeded_run_under_another_torch_seed() -> None:
    def batches(loader, limit=None):
        out = []
        for batch in loader:
            out.append(batch.tolist())
            if limit is not None and len(out) == limit:
                break
        return out

    torch.manual_seed(5)
    expected = batches(DataLoader(list(range(15)), batch_size=4, shuffle=True))
    torch.manual_seed(5)
    first = DataLoader(list(range(15)), batch_size=4, shuffle=True)
    head = batches(first, limit=2)
    state = first.state_dict()
    torch.manual_seed(12345)  # the resumed loader draws another seed, then loads the saved one
    second = DataLoader(list(range(15)), batch_size=4, shuffle=True)
    second.load_state_dict(state)
    assert head + batches(second) == expected


# ------------------------------------------------------------------ pin_memory, no accelerator


@pytest.mark.skipif(
    torch.accelerator.is_available(), reason="checks the behaviour without an accelerator"
)
def test_pin_memory_without_accelerator_warns_once_and_starts_no_thread() -> None:
    loader = DataLoader(list(range(6)), batch_size=2, pin_memory=True)
    with pytest.warns(
        UserWarning,
        match=r"pin_memory=True: no accelerator is available, so batches are not pinned",
    ):
        iterator = iter(loader)
    assert not any(t.name == "stoker-pin-memory" for t in __import__("threading").enumerate())
    assert [b.tolist() for b in iterator] == [[0, 1], [2, 3], [4, 5]]
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second epoch says nothing more
        assert len(list(loader)) == 3
    del iterator
    gc.collect()
