"""stoker._tree: the one walker of nested batches, with torch's container rules."""

from __future__ import annotations

import collections
import functools
from collections import OrderedDict, defaultdict, namedtuple
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import pytest

from stoker import DataLoader
from stoker._tree import (
    children,
    is_container,
    leaves,
    map_leaves,
    rebuild,
    rebuild_with,
    walk,
)
from stoker.collate import default_collate, default_convert

Point = namedtuple("Point", ["x", "y"])


class Box(NamedTuple):
    lo: Any
    hi: Any


def tally(**values: Any) -> defaultdict[str, Any]:
    """A defaultdict(list) holding ``values``."""
    d: defaultdict[str, Any] = defaultdict(list)
    d.update(values)
    return d


def assert_tally(d: Any) -> None:
    assert type(d) is defaultdict
    assert d.default_factory is list


# --------------------------------------------------------------------- container rules


LEAVES = [
    "ab",
    b"ab",
    bytearray(b"ab"),
    memoryview(b"ab"),
    range(3),
    3,
    2.5,
    None,
    np.zeros(3),
    np.int8(1),
]
CONTAINERS = [{}, [], (), Point(1, 2), Box(1, 2), OrderedDict(), tally(), collections.deque()]


@pytest.mark.parametrize("leaf", LEAVES, ids=lambda v: type(v).__name__)
def test_strings_bytes_ranges_arrays_and_numbers_are_leaves(leaf: Any) -> None:
    assert not is_container(leaf)
    (only,) = leaves(leaf)
    assert only is leaf
    ((path, walked),) = walk(leaf)
    assert path == () and walked is leaf
    assert map_leaves(leaf, lambda v: [v])[0] is leaf


@pytest.mark.parametrize("container", CONTAINERS, ids=lambda v: type(v).__name__)
def test_mappings_and_sequences_are_containers(container: Any) -> None:
    assert is_container(container)


def test_a_defaultdict_keeps_its_type_and_default_factory() -> None:
    d = tally(a=1, b=2)
    for out in (
        rebuild(d, lambda v: v * 10),
        map_leaves(d, lambda v: v * 10),
        rebuild_with(d, {"a": 10, "b": 20}),
    ):
        assert_tally(out)
        assert out == {"a": 10, "b": 20}
        assert out["missing"] == []  # the factory still works
    assert d == {"a": 1, "b": 2}  # the original is left alone


def test_namedtuples_keep_their_type_even_where_tuples_become_lists() -> None:
    assert map_leaves(Point(1, [2, 3]), lambda v: v + 1) == Point(2, [3, 4])
    out = map_leaves(Box(1, (2, 3)), lambda v: v + 1, tuple_as_list=True)
    assert type(out) is Box and out == Box(2, [3, 4])
    assert rebuild_with(Point(0, 0), [5, 6], tuple_as_list=True) == Point(5, 6)


def test_an_ordered_dict_keeps_its_type_and_order() -> None:
    od = OrderedDict([("b", 1), ("a", 2)])
    out = map_leaves(od, str)
    assert type(out) is OrderedDict
    assert list(out.items()) == [("b", "1"), ("a", "2")]


def test_a_tuple_keeps_its_type_unless_tuple_as_list() -> None:
    assert map_leaves((1, (2, 3)), lambda v: -v) == (-1, (-2, -3))
    assert map_leaves((1, (2, 3)), lambda v: -v, tuple_as_list=True) == [-1, [-2, -3]]


class Frozen(Mapping):
    """A mapping that cannot be built from a dict (keyword-only constructor)."""

    def __init__(self, *, items: dict[str, Any]) -> None:
        self._items = items

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self):
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


class Pair(Sequence):
    """A sequence that cannot be built from a list (two positional arguments)."""

    def __init__(self, a: Any, b: Any) -> None:
        self._items = (a, b)

    def __getitem__(self, i: Any) -> Any:
        return self._items[i]

    def __len__(self) -> int:
        return 2


def test_containers_that_cannot_be_rebuilt_become_a_dict_or_a_list() -> None:
    assert map_leaves(Frozen(items={"a": 1}), lambda v: v + 1) == {"a": 2}
    assert map_leaves(Pair(1, 2), lambda v: v + 1) == [2, 3]
    assert rebuild(range(3), lambda v: v) == [0, 1, 2]  # what default_convert makes of a range


def test_a_nested_mix_is_walked_in_order_with_paths_and_rebuilt_with_its_types() -> None:
    image = np.zeros(2)
    batch = {
        "img": image,
        "meta": [Point(1, "a"), tally(k=(2, b"x"))],
        "ids": OrderedDict(p="p", q=None),
    }
    assert list(walk(batch)) == [
        (("img",), image),
        (("meta", 0, 0), 1),
        (("meta", 0, 1), "a"),
        (("meta", 1, "k", 0), 2),
        (("meta", 1, "k", 1), b"x"),
        (("ids", "p"), "p"),
        (("ids", "q"), None),
    ]
    assert [leaf for _, leaf in walk(batch)] == list(leaves(batch))
    assert list(children(batch["meta"])) == list(enumerate(batch["meta"]))
    out = map_leaves(batch, lambda v: v)
    assert type(out["meta"][0]) is Point and type(out["ids"]) is OrderedDict
    assert_tally(out["meta"][1])
    assert out["meta"][1]["k"] == (2, b"x")


def test_walk_yields_whole_the_containers_is_leaf_names() -> None:
    def strings(c: Any) -> bool:
        return isinstance(c, list) and all(isinstance(v, str) for v in c)

    tree = {"names": ["a", "b"], "x": [1], "empty": []}
    assert list(walk(tree, is_leaf=strings)) == [
        (("names",), ["a", "b"]),
        (("x", 0), 1),
        (("empty",), []),
    ]
    assert list(walk(tree)) == [(("names", 0), "a"), (("names", 1), "b"), (("x", 0), 1)]


# --------------------------------------------------- a defaultdict through collate and loaders


def test_default_collate_and_default_convert_keep_a_defaultdict() -> None:
    samples = [tally(x=np.full(2, i), y=i, point=Point(i, -i)) for i in range(3)]
    batch = default_collate(samples)
    assert_tally(batch)
    assert batch["y"].tolist() == [0, 1, 2] and type(batch["point"]) is Point
    converted = default_convert(samples[1])
    assert_tally(converted)
    assert converted["point"] == Point(1, -1)


class TallyRows:
    """Samples that are defaultdicts; a batch of 4 (128 KiB) travels in shared memory."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> defaultdict[str, Any]:
        return tally(
            x=np.full((128, 64), i, np.float32),
            y=i,
            meta=OrderedDict(name=f"r{i}", point=Point(i, -i)),
        )


def assert_tally_batches(batches: list[Any]) -> None:
    assert len(batches) == 2
    for k, batch in enumerate(batches):
        assert_tally(batch)
        assert type(batch["meta"]) is OrderedDict and type(batch["meta"]["point"]) is Point
        assert [int(v) for v in batch["x"][:, 0, 0]] == list(range(4 * k, 4 * k + 4))
        assert [int(v) for v in batch["y"]] == list(range(4 * k, 4 * k + 4))
        assert batch["meta"]["name"] == [f"r{i}" for i in range(4 * k, 4 * k + 4)]


@pytest.mark.parametrize(
    "options",
    [{}, {"copy_batches": True}, {"multiprocessing_context": "spawn"}],
    ids=["shared", "copied", "spawn"],
)
def test_a_defaultdict_batch_through_process_workers(options: dict[str, Any]) -> None:
    loader = DataLoader(TallyRows(), batch_size=4, num_workers=2, **options)
    try:
        batches = [batch for _epoch in range(2) for batch in loader][-2:]
    finally:
        loader.close()
    assert_tally_batches(batches)


@pytest.mark.parametrize("pinning", ["cpu", "accelerator"])
def test_a_defaultdict_batch_through_stoker_torch_pin_memory(pinning: str, monkeypatch) -> None:
    torch = pytest.importorskip(
        "torch", reason="pin_memory belongs to stoker.torch, which needs torch"
    )
    from stoker.torch import DataLoader as TorchDataLoader
    from stoker.torch import _loader
    from stoker.torch._pinning import pin_batch

    if pinning == "cpu":  # the real carving and rebuilding, into a plain CPU block
        cpu_pin = functools.partial(pin_batch, allocate=lambda n: torch.empty(n, dtype=torch.uint8))
        monkeypatch.setattr(_loader, "accelerator_pin_function", lambda: (cpu_pin, None))
    elif not torch.accelerator.is_available():
        pytest.skip("real pinning needs an accelerator (CUDA, XPU, ...)")
    loader = TorchDataLoader(TallyRows(), batch_size=4, num_workers=2, pin_memory=True)
    try:
        batches = list(loader)
    finally:
        loader.close()
    assert_tally_batches(batches)
    for batch in batches:
        point = batch["meta"]["point"]
        tensors = [batch["x"], batch["y"], point.x, point.y]
        assert all(isinstance(t, torch.Tensor) for t in tensors)
        if pinning == "accelerator":
            assert all(t.is_pinned() for t in tensors)
        else:  # one block per batch
            assert len({t.untyped_storage().data_ptr() for t in tensors}) == 1
