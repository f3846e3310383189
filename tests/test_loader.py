"""DataLoader with num_workers=0: arguments, length, batching modes, batched fetch."""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest

from stoker import ArrayDataset, BatchSampler, DataLoader, IterableDataset, SequentialSampler


class Squares:
    """A plain map-style dataset: no base class, no __getitems__."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, float]:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return i, float(i * i)


class CountingBatched(Squares):
    """Records every __getitems__ call."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.calls: list[list[int]] = []

    def __getitems__(self, indices: list[int]) -> list[tuple[int, float]]:
        self.calls.append(list(indices))
        return [self[i] for i in indices]


class Stream(IterableDataset):
    def __init__(self, n: int, with_len: bool = True) -> None:
        self.n = n
        self.with_len = with_len

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self) -> int:
        if not self.with_len:
            raise TypeError("no len")
        return self.n


def test_batches_in_order_with_the_last_one_short() -> None:
    batches = list(DataLoader(Squares(10), batch_size=4))
    assert [b[0].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert batches[0][1].dtype == np.float64
    assert batches[0][0].dtype == np.int64


def test_drop_last_drops_the_short_batch_and_len_agrees() -> None:
    loader = DataLoader(Squares(10), batch_size=4, drop_last=True)
    assert len(loader) == 2
    assert [b[0].tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert len(DataLoader(Squares(10), batch_size=4)) == 3


def test_batched_fetch_goes_through_getitems() -> None:
    ds = CountingBatched(7)
    out = list(DataLoader(ds, batch_size=3))
    assert ds.calls == [[0, 1, 2], [3, 4, 5], [6]]
    assert out[2][1].tolist() == [36.0]


def test_array_dataset_fetch_is_vectorised_and_correct() -> None:
    x = np.arange(20, dtype=np.float32).reshape(10, 2)
    y = np.arange(10) % 3
    batches = list(DataLoader(ArrayDataset(x, y), batch_size=4, shuffle=True, generator=3))
    xs = np.concatenate([b[0] for b in batches])
    ys = np.concatenate([b[1] for b in batches])
    order = xs[:, 0].astype(int) // 2
    assert sorted(order.tolist()) == list(range(10))
    assert (ys == y[order]).all()
    assert xs.dtype == np.float32


def test_unbatched_loading_yields_converted_samples() -> None:
    loader = DataLoader(Squares(3), batch_size=None)
    assert len(loader) == 3
    assert list(loader) == [[0, 0.0], [1, 1.0], [2, 4.0]]  # tuples become lists, as in torch


def test_custom_batch_sampler_decides_the_batches() -> None:
    batch_sampler = [[3, 1], [0], [2, 2]]
    out = [b[0].tolist() for b in DataLoader(Squares(4), batch_sampler=batch_sampler)]
    assert out == [[3, 1], [0], [2, 2]]


def test_shuffle_is_seeded_and_changes_across_epochs() -> None:
    loader = DataLoader(Squares(50), batch_size=50, shuffle=True, generator=7)
    first, second = (next(iter(loader))[0].tolist() for _ in range(2))
    again = next(iter(DataLoader(Squares(50), batch_size=50, shuffle=True, generator=7)))[
        0
    ].tolist()
    assert sorted(first) == list(range(50))
    assert first != list(range(50))
    assert first != second
    assert first == again


def test_shuffle_without_generator_follows_numpy_global_seed() -> None:
    np.random.seed(123)
    a = next(iter(DataLoader(Squares(30), batch_size=30, shuffle=True)))[0].tolist()
    np.random.seed(123)
    b = next(iter(DataLoader(Squares(30), batch_size=30, shuffle=True)))[0].tolist()
    assert a == b


def test_iterable_dataset_is_batched_in_stream_order() -> None:
    loader = DataLoader(Stream(10), batch_size=4)
    assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert len(loader) == 3
    dropped = DataLoader(Stream(10), batch_size=4, drop_last=True)
    assert [b.tolist() for b in dropped] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert len(dropped) == 2
    assert list(DataLoader(Stream(3), batch_size=None)) == [0, 1, 2]


def test_len_of_an_iterable_dataset_without_len_says_so() -> None:
    with pytest.raises(
        TypeError, match="needs the IterableDataset to define __len__; Stream does not"
    ):
        len(DataLoader(Stream(3, with_len=False), batch_size=2))


def test_a_torch_style_sampler_and_iterables_of_indices_are_accepted() -> None:
    loader = DataLoader(Squares(6), sampler=[5, 4, 3], batch_size=2)
    assert [b[0].tolist() for b in loader] == [[5, 4], [3]]
    assert len(loader) == 2


def test_each_iteration_starts_a_new_epoch_from_the_beginning() -> None:
    loader = DataLoader(Squares(5), batch_size=2)
    it = iter(loader)
    next(it)
    assert [b[0].tolist() for b in loader] == [[0, 1], [2, 3], [4]]
    assert len(it) == 3


def test_collate_fn_receives_the_list_of_samples() -> None:
    seen = []

    def collate(samples):
        seen.append(samples)
        return len(samples)

    assert list(DataLoader(Squares(5), batch_size=2, collate_fn=collate)) == [2, 2, 1]
    assert seen[0] == [(0, 0.0), (1, 1.0)]


def test_stream_defining_attributes_are_frozen() -> None:
    loader = DataLoader(Squares(5), batch_size=2)
    with pytest.raises(
        ValueError, match="batch_size cannot be changed after the DataLoader is built"
    ):
        loader.batch_size = 3
    loader.timeout = 5  # not part of the stream: allowed
    assert loader.timeout == 5


def test_pin_memory_without_torch_tensors_warns_once() -> None:
    loader = DataLoader(Squares(4), batch_size=2, pin_memory=True)
    with pytest.warns(UserWarning, match="pin_memory=True has no effect on stoker.DataLoader"):
        list(loader)
    list(loader)  # a second epoch does not warn again (warnings are errors here)


_METHODS = multiprocessing.get_all_start_methods()


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"num_workers": -1},
            ValueError,
            "num_workers option should be non-negative (an integer, or 'auto'), got -1 (use "
            "num_workers=0 to load in the main process, or 'auto' to let stoker tune it)",
        ),
        (
            {"timeout": -2},
            ValueError,
            "timeout option should be non-negative (seconds), got -2 (0 waits forever)",
        ),
        (
            {"timeout": float("nan")},
            ValueError,
            "timeout option should be non-negative (seconds), got nan (0 waits forever)",
        ),
        (
            {"prefetch_factor": 2},
            ValueError,
            "prefetch_factor option could only be specified in multiprocessing: prefetch_factor=2 "
            "applies to background workers. Pass num_workers > 0, or leave prefetch_factor unset "
            "(None).",
        ),
        (
            {"num_workers": 1, "prefetch_factor": 0},
            ValueError,
            "prefetch_factor must be a positive integer, got 0",
        ),
        (
            {"persistent_workers": True},
            ValueError,
            "persistent_workers option needs num_workers > 0: pass num_workers > 0, or "
            "persistent_workers=False",
        ),
        (
            {"persistent_workers": "yes", "num_workers": 1},
            TypeError,
            "persistent_workers must be True or False, got str: 'yes'",
        ),
        (
            {"in_order": "no", "num_workers": 1},
            TypeError,
            "in_order must be True or False, got str: 'no'",
        ),
        ({"copy_batches": "no"}, TypeError, "copy_batches must be True or False, got str: 'no'"),
        (
            {"shuffle": True, "sampler": [0, 1]},
            ValueError,
            "sampler option is mutually exclusive with shuffle: the sampler already decides the "
            "order. Drop shuffle=True, or pass a shuffling sampler such as RandomSampler.",
        ),
        (
            {"batch_sampler": [[0]], "batch_size": 2},
            ValueError,
            "batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and "
            "drop_last: the batch sampler already decides batch size, order and the last batch. "
            "Leave those four at their defaults.",
        ),
        (
            {"batch_sampler": [[0]], "drop_last": 3},
            ValueError,
            "batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and "
            "drop_last: the batch sampler already decides batch size, order and the last batch. "
            "Leave those four at their defaults.",
        ),
        (
            {"batch_size": None, "drop_last": True},
            ValueError,
            "batch_size=None option disables auto-batching and is mutually exclusive with "
            "drop_last=True: there is nothing to drop. Pass a batch_size, or drop_last=False.",
        ),
        (
            {"batch_size": 0},
            ValueError,
            "batch_size must be a positive integer, got 0 (or None to load unbatched samples)",
        ),
        (
            {"batch_size": 2.5},
            ValueError,
            "batch_size must be a positive integer, got 2.5 (or None to load unbatched samples)",
        ),
        ({"drop_last": "yes"}, TypeError, "drop_last must be True or False, got str: 'yes'"),
        (
            {"worker_mode": "fiber"},
            ValueError,
            "worker_mode must be one of ('process', 'thread', 'auto', 'ray'), got 'fiber'",
        ),
        (
            {"on_worker_death": "ignore"},
            ValueError,
            "on_worker_death must be one of ('raise', 'restart'), got 'ignore'",
        ),
        (
            {"worker_init_fn": 3},
            TypeError,
            "worker_init_fn must be callable (it receives the worker id), got 3",
        ),
        (
            {"collate_fn": "stack"},
            TypeError,
            "collate_fn must be callable (it receives a list of samples), got 'stack'",
        ),
        (
            {"multiprocessing_context": "spawn"},
            ValueError,
            "multiprocessing_context can only be used with multi-process loading (num_workers > "
            "0), but got num_workers=0 and multiprocessing_context='spawn': pass num_workers > "
            "0, or leave multiprocessing_context unset",
        ),
        (
            {"num_workers": 1, "multiprocessing_context": "teleport"},
            ValueError,
            f"multiprocessing_context option should specify a valid start method in {_METHODS!r}, "
            "but got multiprocessing_context='teleport'",
        ),
        (
            {"num_workers": 1, "multiprocessing_context": 5},
            TypeError,
            "multiprocessing_context option should be a valid context object or a string "
            "specifying the start method ('fork', 'forkserver', 'spawn'), but got "
            "multiprocessing_context=5",
        ),
    ],
)
def test_bad_arguments_name_the_argument_and_the_fix(kwargs, error, message) -> None:
    """Each message starts with the words torch's loader uses, then says what to do."""
    with pytest.raises(error) as caught:
        DataLoader(Squares(4), **kwargs)
    assert str(caught.value) == message


def test_numpy_integers_are_accepted_wherever_ints_are() -> None:
    loader = DataLoader(
        Squares(10), batch_size=np.int64(4), num_workers=np.int32(1), prefetch_factor=np.uint8(3)
    )
    assert (loader.batch_size, loader.num_workers, loader.prefetch_factor) == (4, 1, 3)
    assert all(
        type(v) is int for v in (loader.batch_size, loader.num_workers, loader.prefetch_factor)
    )
    assert [b[0].tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_more_workers_than_cpus_get_torchs_warning() -> None:
    from stoker._proc import usable_cpus

    with pytest.warns(UserWarning) as caught:
        DataLoader(Squares(4), num_workers=usable_cpus() + 1)
    (warning,) = caught
    assert str(warning.message) == (
        f"This DataLoader will create {usable_cpus() + 1} worker processes in total, more than "
        f"the {usable_cpus()} CPUs this process may use. Please be aware that excessive worker "
        "creation might get DataLoader running slow or even freeze: lower num_workers to "
        f"{usable_cpus()} or fewer, or pass num_workers='auto' to let stoker find the best count."
    )
    assert warning.filename == __file__  # it points at the caller's line


@pytest.mark.parametrize("option", [{"shuffle": True}, {"sampler": [0]}, {"batch_sampler": [[0]]}])
def test_iterable_dataset_rejects_order_options(option) -> None:
    ((name, value),) = option.items()
    with pytest.raises(ValueError) as caught:
        DataLoader(Stream(3), **option)
    assert str(caught.value) == (
        f"DataLoader with IterableDataset: expected unspecified {name} option, but got "
        f"{name}={value!r}. The dataset's own iterator decides the order: shuffle inside it "
        "(stoker's readers take shuffle_buffer=N, and stoker.ShuffleBuffer(dataset, size) wraps "
        "any iterable dataset), or use a map-style dataset."
    )


def test_non_datasets_are_rejected_with_the_type_name() -> None:
    with pytest.raises(TypeError, match=r"dataset must be map-style .* got int"):
        DataLoader(5)


def test_batch_sampler_over_sequential_sampler_matches_default() -> None:
    ds = Squares(9)
    explicit = DataLoader(ds, batch_sampler=BatchSampler(SequentialSampler(ds), 4, drop_last=False))
    default = DataLoader(ds, batch_size=4)
    assert [b[0].tolist() for b in explicit] == [b[0].tolist() for b in default]


class LongStream(IterableDataset):
    """Says it has 4 samples, yields 6."""

    def __len__(self) -> int:
        return 4

    def __iter__(self):
        return iter(range(6))

    def __repr__(self) -> str:
        return "LongStream()"


def test_an_iterable_longer_than_its_len_warns_once_len_was_asked() -> None:
    loader = DataLoader(LongStream())
    assert len(list(loader)) == 6  # nobody asked for len(): no warning (warnings are errors here)
    assert len(loader) == 4
    it = iter(loader)
    for _ in range(4):
        next(it)
    for fetched in (5, 6):
        with pytest.warns(UserWarning) as caught:
            next(it)
        assert str(caught[0].message) == (
            "Length of IterableDataset LongStream() was reported to be 4 (when accessing "
            f"len(dataloader)), but {fetched} samples have been fetched. The dataset's __len__ "
            "does not match what its __iter__ yields."
        )


@pytest.mark.parametrize("num_workers", [0, 2])
def test_skipping_bad_samples_of_a_stream_is_refused_with_where_to_do_it(num_workers) -> None:
    """A stream has no index to skip: the loader says so at once instead of ignoring the
    option (no workers) or failing on the first batch of a healthy stream (workers)."""
    with pytest.raises(ValueError) as caught:
        DataLoader(Stream(3), on_error="skip", num_workers=num_workers)
    assert str(caught.value) == (
        "on_error='skip' leaves bad samples of a map-style dataset out by index, and Stream is "
        "an IterableDataset, whose samples have no index to skip. Handle bad records inside the "
        "stream: stoker's stream readers (TextLines, JsonLines, TarShards) take on_error='skip' "
        "themselves."
    )


class RepeatedStream(IterableDataset):
    """Has a length, and yields all of itself in every worker (it never shards)."""

    def __len__(self) -> int:
        return 6

    def __iter__(self):
        return iter(range(6))

    def __repr__(self) -> str:
        return "RepeatedStream()"


def test_a_stream_with_a_length_that_workers_duplicate_is_named_at_the_end_of_the_epoch() -> None:
    """Nobody asked len(): the epoch runs silent (as torch's does); its end says what happened."""
    loader = DataLoader(RepeatedStream(), batch_size=2, num_workers=2)
    it = iter(loader)
    batches = [next(it) for _ in range(6)]  # no warning yet (warnings are errors here)
    with pytest.warns(UserWarning) as caught, pytest.raises(StopIteration):
        next(it)
    assert sorted(int(v) for b in batches for v in b) == sorted(list(range(6)) * 2)
    assert str(caught[0].message) == (
        "IterableDataset RepeatedStream() has 6 samples (3 batches), but its 2 workers delivered "
        "6 batches this epoch: each worker iterates all of it unless its __iter__ shards it by "
        "worker (stoker.sharding splits files, then records, by rank and worker)."
    )
