"""Tests for stoker.datasets: protocols, ArrayDataset, Concat/Chain/Subset, random_split."""

from __future__ import annotations

import itertools
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker import datasets as ds_mod
from stoker._errors import DatasetError, DatasetIndexError
from stoker._stacked import StackedSamples
from stoker._worker_info import get_worker_info
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

TORCH_REASON = "torch is optional; these tests compare against torch.utils.data"


@pytest.fixture
def torch():
    return pytest.importorskip("torch", reason=TORCH_REASON)


# --- helpers -----------------------------------------------------------------------------


class Plain:
    """A map-style dataset that subclasses nothing and has no __getitems__."""

    def __init__(self, values):
        self.values = list(values)

    def __getitem__(self, i):
        return self.values[i]

    def __len__(self):
        return len(self.values)


class Batched(Plain):
    """A plain dataset with __getitems__ that records every batched call."""

    def __init__(self, values):
        super().__init__(values)
        self.calls: list[list[int]] = []

    def __getitems__(self, indices):
        self.calls.append(list(indices))
        return [("batched", self.values[i]) for i in indices]


class Count(IterableDataset):
    def __init__(self, start, stop, sized=True):
        self.start, self.stop, self.sized = start, stop, sized

    def __iter__(self):
        return iter(range(self.start, self.stop))

    def __len__(self):
        if not self.sized:
            raise TypeError("Count(sized=False) has no length")
        return self.stop - self.start


def as_tuples(samples):
    return [tuple(np.asarray(x).tolist() for x in s) for s in samples]


# --- module surface ----------------------------------------------------------------------


def test_all_is_sorted_and_exported():
    assert sorted(ds_mod.__all__) == ds_mod.__all__
    for name in ds_mod.__all__:
        assert hasattr(ds_mod, name), name


def test_import_does_not_import_torch():
    code = "import sys, stoker.datasets; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_get_worker_info_is_none_in_main_process():
    assert get_worker_info() is None


# --- Dataset / IterableDataset / protocols -----------------------------------------------


def test_dataset_base_getitem_says_what_to_implement():
    class NoGetitem(Dataset):
        pass

    with pytest.raises(
        NotImplementedError,
        match=r"NoGetitem subclasses Dataset but does not "
        r"implement __getitem__\(index\)",
    ):
        NoGetitem()[0]


def test_dataset_add_concatenates():
    a, b = ArrayDataset(np.arange(3)), ArrayDataset(np.arange(10, 12))
    both = a + b
    assert isinstance(both, ConcatDataset)
    assert [s[0] for s in (both[i] for i in range(len(both)))] == [0, 1, 2, 10, 11]


def test_iterable_dataset_needs_iter():
    class NoIter(IterableDataset):
        pass

    with pytest.raises(TypeError, match="abstract"):
        NoIter()


def test_iterable_dataset_add_chains():
    chained = Count(0, 2) + Count(5, 7)
    assert isinstance(chained, ChainDataset)
    assert list(chained) == [0, 1, 5, 6]


def test_is_iterable_dataset_for_stoker_and_plain_objects():
    assert is_iterable_dataset(Count(0, 1))
    assert is_iterable_dataset(ChainDataset([]))
    assert not is_iterable_dataset(ArrayDataset(np.arange(3)))
    assert not is_iterable_dataset([1, 2, 3])
    assert not is_iterable_dataset(Plain([1]))


def test_is_iterable_dataset_for_torch(torch):
    class TorchStream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(3))

    assert is_iterable_dataset(TorchStream())
    assert not is_iterable_dataset(torch.utils.data.TensorDataset(torch.arange(3)))


def test_map_dataset_protocol_is_structural():
    class NoLen:
        def __getitem__(self, i):
            return i

    assert isinstance(Plain([1, 2]), MapDataset)
    assert isinstance(ArrayDataset(np.arange(2)), MapDataset)
    assert not isinstance(NoLen(), MapDataset)


# --- ArrayDataset ------------------------------------------------------------------------


def test_array_dataset_numpy_getitem_and_len():
    x = np.arange(12).reshape(4, 3)
    y = np.array([10, 11, 12, 13])
    ds = ArrayDataset(x, y)
    assert len(ds) == 4
    sample = ds[2]
    assert isinstance(sample, tuple) and len(sample) == 2
    np.testing.assert_array_equal(sample[0], [6, 7, 8])
    assert sample[1] == 12
    np.testing.assert_array_equal(ds[np.int64(1)][0], [3, 4, 5])


def test_array_dataset_negative_index_like_numpy():
    ds = ArrayDataset(np.arange(5) * 10)
    assert ds[-1][0] == 40
    assert ds[-5][0] == 0


@pytest.mark.parametrize("index", [5, 17, -6])
def test_array_dataset_out_of_range_names_index_and_length(index):
    ds = ArrayDataset(np.arange(5))
    with pytest.raises(
        DatasetIndexError,
        match=rf"index {index} is out of range for "
        r"ArrayDataset of length 5; valid indices are -5 to 4",
    ):
        ds[index]


def test_out_of_range_is_an_index_error_so_old_iteration_protocol_stops():
    ds = ArrayDataset(np.arange(3))
    assert issubclass(DatasetIndexError, IndexError)
    assert [s[0] for s in ds] == [0, 1, 2]


@pytest.mark.parametrize("index", [True, 1.0, slice(0, 2), "0"])
def test_array_dataset_rejects_non_integer_index(index):
    ds = ArrayDataset(np.arange(3))
    with pytest.raises(TypeError, match="ArrayDataset index must be an integer"):
        ds[index]


@pytest.mark.parametrize("indices", [[0], [3, 1, 1, 0], [-1, 2, -4], list(range(4))[::-1]])
def test_array_dataset_getitems_equals_per_index(indices):
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    y = np.array([5, 6, 7, 8])
    ds = ArrayDataset(x, y)
    batch = ds.__getitems__(indices)
    assert isinstance(batch, StackedSamples)
    assert len(batch) == len(indices)
    assert as_tuples(batch) == as_tuples([ds[i] for i in indices])
    np.testing.assert_array_equal(batch.columns[0], x[np.asarray(indices)])


def test_array_dataset_getitems_empty_and_errors():
    ds = ArrayDataset(np.arange(4), np.ones((4, 2)))
    empty = ds.__getitems__([])
    assert len(empty) == 0
    assert empty.columns[1].shape == (0, 2)
    with pytest.raises(
        DatasetIndexError,
        match=r"index 9 \(position 1 of the 2 requested\) is "
        r"out of range for ArrayDataset of length 4",
    ):
        ds.__getitems__([0, 9])
    with pytest.raises(TypeError, match="needs integer indices, got dtype float64"):
        ds.__getitems__([0.5, 1.0])
    with pytest.raises(ValueError, match=r"flat list of indices, got shape \(1, 2\)"):
        ds.__getitems__([[0, 1]])


def test_array_dataset_length_mismatch_names_argument_and_lengths():
    with pytest.raises(DatasetError, match="argument 0 has length 3 but argument 2 has length 4"):
        ArrayDataset(np.zeros(3), np.zeros((3, 2)), np.zeros(4))


def test_array_dataset_rejects_bad_arguments():
    with pytest.raises(ValueError, match="at least one array, got none"):
        ArrayDataset()
    with pytest.raises(ValueError, match="argument 1 is 0-dimensional"):
        ArrayDataset(np.zeros(3), np.array(1.0))
    with pytest.raises(TypeError, match=r"argument 0 is list; convert it with numpy.asarray"):
        ArrayDataset([1, 2, 3])


def test_array_dataset_torch_matches_tensor_dataset(torch):
    x = torch.arange(20, dtype=torch.float32).reshape(5, 4)
    y = torch.arange(5)
    ours, theirs = ArrayDataset(x, y), torch.utils.data.TensorDataset(x, y)
    assert len(ours) == len(theirs)
    for i in [0, 3, -1, -5]:
        for a, b in zip(ours[i], theirs[i], strict=True):
            assert torch.equal(a, b)
    batch = ours.__getitems__([4, 0, -2])
    assert all(isinstance(c, torch.Tensor) for c in batch.columns)
    assert torch.equal(batch.columns[0], x[torch.tensor([4, 0, 3])])
    assert torch.equal(batch.columns[1], torch.tensor([4, 0, 3]))
    with pytest.raises(DatasetIndexError, match="index 5 is out of range"):
        ours[5]


def test_array_dataset_mixed_numpy_and_torch(torch):
    x = np.arange(6).reshape(3, 2)
    y = torch.tensor([7, 8, 9])
    ds = ArrayDataset(x, y)
    a, b = ds[1]
    assert isinstance(a, np.ndarray) and isinstance(b, torch.Tensor)
    batch = ds.__getitems__([2, 0])
    assert isinstance(batch.columns[0], np.ndarray)
    assert isinstance(batch.columns[1], torch.Tensor)
    np.testing.assert_array_equal(batch.columns[0], [[4, 5], [0, 1]])
    assert batch.columns[1].tolist() == [9, 7]


# --- ConcatDataset -----------------------------------------------------------------------


def test_concat_getitem_across_members_and_negative():
    ds = ConcatDataset([Plain("abc"), Plain(""), Plain("de"), ["f"]])
    assert ds.cumulative_sizes == [3, 3, 5, 6]
    assert len(ds) == 6
    assert [ds[i] for i in range(6)] == list("abcdef")
    assert [ds[i] for i in range(-6, 0)] == list("abcdef")


@pytest.mark.parametrize("index", [6, -7])
def test_concat_out_of_range(index):
    ds = ConcatDataset([Plain("abc"), Plain("def")])
    with pytest.raises(
        DatasetIndexError,
        match=rf"index {index} is out of range for "
        r"ConcatDataset of length 6; valid indices are -6 to 5",
    ):
        ds[index]


def test_concat_errors():
    with pytest.raises(ValueError, match="needs at least one dataset, got an empty iterable"):
        ConcatDataset([])
    with pytest.raises(
        TypeError,
        match=r"datasets\[1\] is the iterable-style Count; use "
        "ChainDataset",
    ):
        ConcatDataset([Plain("a"), Count(0, 3)])
    with pytest.raises(TypeError, match=r"datasets\[0\] \(generator\) has no __len__"):
        ConcatDataset([(i for i in range(3))])
    with pytest.raises(TypeError, match="got a single ArrayDataset; pass ConcatDataset"):
        ConcatDataset(ArrayDataset(np.arange(3)))


def test_concat_getitems_preserves_order_and_batches_per_member():
    batched = Batched("abcd")
    ds = ConcatDataset([Plain("xyz"), batched, Plain("pq")])
    indices = [3, 0, 7, 5, -1, 4, 1, 3]
    out = ds.__getitems__(indices)
    b = "batched"
    assert out == [(b, "a"), "x", "p", (b, "c"), "q", (b, "b"), "y", (b, "a")]
    # one batched call for all indices of the batched member, in request order
    assert batched.calls == [[0, 2, 1, 0]]


def test_concat_getitems_single_member_keeps_stacked_samples():
    a, b = ArrayDataset(np.arange(3)), ArrayDataset(np.arange(10, 15))
    out = ConcatDataset([a, b]).__getitems__([4, 3, 6])
    assert isinstance(out, StackedSamples)
    np.testing.assert_array_equal(out.columns[0], [11, 10, 13])


def test_concat_getitems_mixed_array_members():
    a, b = ArrayDataset(np.arange(3)), ArrayDataset(np.arange(10, 15))
    ds = ConcatDataset([a, b])
    out = ds.__getitems__([4, 0, 7, -8])
    assert as_tuples(out) == [(11,), (0,), (14,), (0,)]
    with pytest.raises(DatasetIndexError, match=r"index 8 .* ConcatDataset of length 8"):
        ds.__getitems__([0, 8])


def test_concat_getitems_rejects_member_returning_wrong_count():
    class Liar(Plain):
        def __getitems__(self, indices):
            return [0]

    ds = ConcatDataset([Liar("abc")])
    with pytest.raises(DatasetError, match=r"Liar\.__getitems__ returned 1 samples for 2 indices"):
        ds.__getitems__([0, 1])


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 6), min_size=1, max_size=5).filter(lambda s: sum(s) > 0),
    data=st.data(),
)
def test_concat_getitems_equals_per_index_property(sizes, data):
    members, start = [], 0
    for k, size in enumerate(sizes):
        values = list(range(start, start + size))
        members.append(ArrayDataset(np.array(values, dtype=np.int64)) if k % 2 else Plain(values))
        start += size
    ds = ConcatDataset(members)
    n = len(ds)
    indices = data.draw(st.lists(st.integers(-n, n - 1), max_size=12))
    got = ds.__getitems__(indices)
    want = [ds[i] for i in indices]
    norm = [v[0] if isinstance(v, tuple) else v for v in want]
    assert [int(v[0]) if isinstance(v, tuple) else v for v in got] == [int(v) for v in norm]
    assert [int(v) for v in norm] == [i % n for i in indices]


# --- ChainDataset ------------------------------------------------------------------------


def test_chain_iterates_in_turn_and_sums_len():
    chain = ChainDataset(d for d in [Count(0, 2), Count(10, 13), Count(5, 5)])
    assert list(chain) == [0, 1, 10, 11, 12]
    assert list(chain) == [0, 1, 10, 11, 12]  # re-iterable although built from a generator
    assert len(chain) == 5
    assert len(ChainDataset([])) == 0


def test_chain_len_fails_clearly_for_unsized_member():
    chain = ChainDataset([Count(0, 2), Count(0, 2, sized=False)])
    assert list(chain) == [0, 1, 0, 1]
    with pytest.raises(
        TypeError,
        match=r"ChainDataset member datasets\[1\] \(Count\) has no "
        "__len__",
    ):
        len(chain)


def test_chain_rejects_non_iterable_member():
    class MapOnly(Dataset):
        def __getitem__(self, i):
            return i

        def __len__(self):
            return 1

    with pytest.raises(
        TypeError,
        match=r"datasets\[0\] \(MapOnly\) has no __iter__; use "
        "ConcatDataset",
    ):
        ChainDataset([MapOnly()])
    with pytest.raises(TypeError, match="got a single Count; pass ChainDataset"):
        ChainDataset(Count(0, 3))


def test_chain_accepts_torch_iterable_datasets(torch):
    class TorchStream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter("ab")

    assert list(ChainDataset([TorchStream(), Count(0, 1)])) == ["a", "b", 0]


# --- Subset ------------------------------------------------------------------------------


def test_subset_getitem_len_and_list_index():
    sub = Subset(Plain("abcdef"), [4, 0, 2])
    assert len(sub) == 3
    assert [sub[i] for i in range(3)] == ["e", "a", "c"]
    assert sub[-1] == "c"

    class ListIndexed(Plain):
        def __getitem__(self, i):
            return [self.values[j] for j in i] if isinstance(i, list) else self.values[i]

    assert Subset(ListIndexed("abcdef"), [5, 1, 3])[[2, 0]] == ["d", "f"]


def test_subset_getitems_delegates_to_parent():
    parent = Batched("abcdef")
    sub = Subset(parent, [5, 3, 1])
    assert sub.__getitems__([2, 0]) == [("batched", "b"), ("batched", "f")]
    assert parent.calls == [[1, 5]]
    assert Subset(Plain("abc"), [2, 1]).__getitems__([1, 0]) == ["b", "c"]


def test_nested_subset_keeps_batched_path():
    parent = ArrayDataset(np.arange(10) * 10)
    inner = Subset(parent, [9, 7, 5, 3, 1])
    outer = Subset(inner, [4, 0, 2])
    out = outer.__getitems__([0, 1, 2])
    assert isinstance(out, StackedSamples)
    np.testing.assert_array_equal(out.columns[0], [10, 90, 50])
    assert [outer[i][0] for i in range(3)] == [10, 90, 50]


def test_subset_subclass_overriding_only_getitem_is_rejected():
    class Doubled(Subset):
        def __getitem__(self, i):
            return 2 * super().__getitem__(i)

    with pytest.raises(
        NotImplementedError, match="Doubled overrides __getitem__ but not __getitems__"
    ):
        Doubled(Plain([1, 2]), [0])


# --- random_split ------------------------------------------------------------------------


def _covers(splits, n):
    flat = [i for s in splits for i in s.indices]
    return sorted(flat) == list(range(n))


def test_random_split_int_lengths():
    data = Plain(range(10))
    a, b = random_split(data, [3, 7], generator=1)
    assert (len(a), len(b)) == (3, 7)
    assert _covers([a, b], 10)
    assert all(isinstance(i, int) for i in a.indices)
    assert [a[i] for i in range(3)] == list(a.indices)
    assert a.dataset is data


def test_random_split_fractions_follow_torch_rounding():
    splits = random_split(range(10), [0.33, 0.33, 0.34], generator=0)
    # floors are 3, 3, 3 and the remainder of 1 goes to the first split
    assert [len(s) for s in splits] == [4, 3, 3]
    assert _covers(splits, 10)


def test_random_split_warns_on_empty_split():
    with pytest.warns(UserWarning, match="is empty") as record:
        splits = random_split(range(2), [0.5, 0.3, 0.2], generator=0)
    assert [len(s) for s in splits] == [2, 0, 0]
    messages = [str(w.message) for w in record]
    assert messages == [
        f"random_split: split {i} is empty (fraction {f} of 2 samples rounds to 0); the "
        "returned Subset will have no samples"
        for i, f in [(1, 0.3), (2, 0.2)]
    ]
    assert record[0].filename == __file__  # stacklevel points at the caller


def test_random_split_errors():
    with pytest.raises(
        ValueError,
        match="lengths sum to 9 but the dataset has 10 samples; pass "
        "lengths that sum to 10, or fractions that sum to 1",
    ):
        random_split(range(10), [4, 5], generator=0)
    with pytest.raises(ValueError, match=r"lengths\[0\] must be non-negative, got -1"):
        random_split(range(10), [-1, 11], generator=0)
    with pytest.raises(TypeError, match=r"lengths\[0\] is 2.5 and they sum to 10.0"):
        random_split(range(10), [2.5, 7.5], generator=0)
    with pytest.raises(
        ValueError,
        match=r"lengths\[0\] must be a fraction between 0 and 1, "
        "got 1.5",
    ):
        random_split(range(10), [1.5, -0.5], generator=0)
    with pytest.raises(TypeError, match=r"random_split's dataset .* has no __len__"):
        random_split(iter(range(3)), [1, 2], generator=0)


def test_random_split_is_deterministic_per_seed():
    first = [s.indices for s in random_split(range(50), [20, 30], generator=7)]
    again = [s.indices for s in random_split(range(50), [20, 30], generator=7)]
    other = [s.indices for s in random_split(range(50), [20, 30], generator=8)]
    assert first == again
    assert first != other
    gen_a, gen_b = np.random.default_rng(3), np.random.default_rng(3)
    assert [s.indices for s in random_split(range(50), [0.5, 0.5], generator=gen_a)] == [
        s.indices for s in random_split(range(50), [0.5, 0.5], generator=gen_b)
    ]


def test_random_split_none_uses_numpy_global_seed():
    np.random.seed(123)
    first = [s.indices for s in random_split(range(30), [10, 20])]
    np.random.seed(123)
    assert [s.indices for s in random_split(range(30), [10, 20])] == first


@pytest.mark.parametrize("lengths", [[3, 7], [0.3, 0.3, 0.4], [0.5, 0.25, 0.25], [10, 0]])
def test_random_split_matches_torch_with_torch_generator(torch, lengths):
    ours = random_split(range(10), lengths, generator=torch.Generator().manual_seed(42))
    theirs = torch.utils.data.random_split(
        range(10), lengths, generator=torch.Generator().manual_seed(42)
    )
    assert [list(s.indices) for s in ours] == [list(s.indices) for s in theirs]


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 200),
    cuts=st.lists(st.floats(0, 1), max_size=4),
    seed=st.integers(0, 2**32),
)
def test_random_split_is_disjoint_and_covering(n, cuts, seed):
    bounds = sorted({0, n, *(int(c * n) for c in cuts)})
    lengths = [b - a for a, b in itertools.pairwise(bounds)] or [0]
    splits = random_split(range(n), lengths, generator=seed)
    assert [len(s) for s in splits] == lengths
    assert _covers(splits, n)


# --- foreign datasets --------------------------------------------------------------------


def test_plain_objects_work_in_every_helper():
    data = Plain("abcdef")
    concat = ConcatDataset([data, Plain("gh")])
    assert concat[-1] == "h" and concat.__getitems__([6, 0]) == ["g", "a"]
    sub = Subset(data, [1, 3])
    assert sub.__getitems__([1, 0]) == ["d", "b"]
    parts = random_split(data, [0.5, 0.5], generator=0)
    assert sorted(x for p in parts for x in (p[i] for i in range(len(p)))) == list("abcdef")


def test_torch_datasets_work_in_every_helper(torch):
    class Squares(torch.utils.data.Dataset):
        def __getitem__(self, i):
            return i * i

        def __len__(self):
            return 5

    tensors = torch.utils.data.TensorDataset(torch.arange(3) + 100)
    concat = ConcatDataset([Squares(), tensors])
    assert len(concat) == 8
    assert concat[4] == 16
    assert concat[5][0].item() == 100
    got = concat.__getitems__([6, 2, -1])
    assert got[0][0].item() == 101 and got[1] == 4 and got[2][0].item() == 102
    sub = Subset(tensors, [2, 0])
    assert [t[0].item() for t in sub.__getitems__([0, 1])] == [102, 100]
    parts = random_split(Squares(), [2, 3], generator=torch.Generator().manual_seed(0))
    assert sorted(p[i] for p in parts for i in range(len(p))) == [0, 1, 4, 9, 16]
    # torch's own helpers accept stoker datasets too
    assert len(torch.utils.data.ConcatDataset([ArrayDataset(np.arange(2)), Squares()])) == 7
