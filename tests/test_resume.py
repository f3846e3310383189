"""state_dict / load_state_dict: resuming gives exactly the uninterrupted run's batches."""

from __future__ import annotations

import random

import numpy as np
import pytest

from harness.save_load import run_test_save_load_state
from stoker import (
    ArrayDataset,
    BucketBatchSampler,
    DataLoader,
    DistributedSampler,
    RandomSampler,
    WeightedRandomSampler,
    sample_rng,
)


class Noisy:
    """A map-style dataset whose samples carry random augmentations."""

    def __len__(self) -> int:
        return 23

    def __getitem__(self, i: int) -> dict:
        return {"i": i, "np": np.random.rand(), "py": random.random(), "rng": sample_rng().random()}


def loader_factory(first: dict, resumed: dict | None = None, dataset=None, **common):
    def make(resumed_run: bool):
        kwargs = {**common, **(resumed if (resumed_run and resumed is not None) else first)}
        return DataLoader(dataset if dataset is not None else Noisy(), **kwargs)

    return lambda resumed: make(resumed)


SHUFFLED = {"batch_size": 4, "shuffle": True, "generator": 17}
EPOCH = 6  # batches per epoch of Noisy with batch_size 4


@pytest.mark.parametrize(
    "stop_at", [1, 3, EPOCH, EPOCH + 2, 2 * EPOCH - 1], ids=lambda k: f"after-{k}"
)
def test_resume_single_process(stop_at) -> None:
    run_test_save_load_state(loader_factory({}, **SHUFFLED), stop_at=stop_at)


@pytest.mark.parametrize(
    ("first", "resumed"),
    [
        ({"num_workers": 2}, {"num_workers": 0}),
        ({"num_workers": 0}, {"num_workers": 3}),
        ({"num_workers": 2, "persistent_workers": True}, {"num_workers": 1}),
        ({"num_workers": 2, "worker_mode": "thread"}, {"num_workers": 2, "in_order": True}),
        ({"num_workers": 3, "prefetch_factor": 3}, {"num_workers": 2, "worker_mode": "thread"}),
    ],
    ids=["2-to-0", "0-to-3", "persistent-2-to-1", "threads-to-processes", "3-to-threads"],
)
@pytest.mark.parametrize("stop_at", [2, EPOCH, EPOCH + 3])
def test_resume_with_a_changed_number_of_workers(first, resumed, stop_at) -> None:
    run_test_save_load_state(loader_factory(first, resumed, **SHUFFLED), stop_at=stop_at)


def test_a_state_after_the_last_batch_resumes_at_the_end_of_that_epoch() -> None:
    state = run_test_save_load_state(loader_factory({}, **SHUFFLED), stop_at=EPOCH, epochs=3)
    assert (state["epoch"], state["batches"]) == (0, EPOCH)


@pytest.mark.parametrize("loading", [{}, {"num_workers": 2}], ids=["main", "workers"])
def test_an_epoch_loop_resumed_after_the_last_batch_runs_the_epochs_left(loading) -> None:
    """`for epoch in range(E)` resumed from a state saved inside the loop after the last
    batch: the resumed iter() ends at once and E - 1 epochs follow, not E."""
    reference = DataLoader(Noisy(), **SHUFFLED, **loading)
    expected = [[b["i"].tolist() for b in reference] for _ in range(3)]
    first = DataLoader(Noisy(), **SHUFFLED, **loading)
    for batch_number, _ in enumerate(first, 1):
        if batch_number == EPOCH:
            state = first.state_dict()
    resumed = DataLoader(Noisy(), **SHUFFLED, **loading)
    resumed.load_state_dict(state)
    epochs = [[b["i"].tolist() for b in resumed] for _ in range(3)]
    assert epochs[0] == []
    assert epochs[1:] == expected[1:]


def test_a_state_after_stop_iteration_starts_the_next_epoch() -> None:
    loader = DataLoader(Noisy(), **SHUFFLED)
    expected = [[b["i"].tolist() for b in loader] for _ in range(2)]
    loader = DataLoader(Noisy(), **SHUFFLED)
    assert len(list(loader)) == EPOCH
    state = loader.state_dict()
    assert (state["epoch"], state["batches"]) == (1, 0)
    resumed = DataLoader(Noisy(), **SHUFFLED)
    resumed.load_state_dict(state)
    assert [b["i"].tolist() for b in resumed] == expected[1]


def test_the_state_is_small_and_holds_no_batches() -> None:
    loader = DataLoader(Noisy(), batch_size=4, shuffle=True, generator=5, num_workers=2)
    it = iter(loader)
    next(it)
    next(it)
    state = loader.state_dict()
    assert state["epoch"] == 0
    assert state["batches"] == 2
    assert len(repr(state)) < 400, state
    del it


def test_seedless_loader_resumes_in_a_fresh_process_state() -> None:
    """generator=None: the seed drawn at construction is part of the state."""

    def make(resumed: bool):
        np.random.seed(1 if not resumed else 999)  # the new "process" has another global state
        return DataLoader(Noisy(), batch_size=5, shuffle=True)

    np.random.seed(1)
    run_test_save_load_state(make, stop_at=3)


@pytest.mark.parametrize(
    "make_sampler",
    [
        lambda ds: RandomSampler(ds, replacement=True, num_samples=30, generator=4),
        lambda ds: WeightedRandomSampler(np.linspace(0.1, 1, len(ds)), 25, generator=4),
        lambda ds: DistributedSampler(ds, num_replicas=2, rank=1, seed=4),
    ],
    ids=["random-replacement", "weighted", "distributed"],
)
def test_resume_with_stoker_samplers(make_sampler) -> None:
    ds = Noisy()

    def make(resumed: bool):
        return DataLoader(
            ds, batch_size=3, sampler=make_sampler(ds), generator=6, num_workers=2 if resumed else 0
        )

    run_test_save_load_state(make, stop_at=4, epochs=3)


def test_resume_with_a_bucketing_batch_sampler() -> None:
    lengths = [(i * 7) % 11 + 1 for i in range(40)]
    ds = ArrayDataset(np.arange(40), np.asarray(lengths))

    def make(resumed: bool):
        sampler = BucketBatchSampler(lengths, 4, bucket_size_multiplier=3, generator=8)
        return DataLoader(ds, batch_sampler=sampler, num_workers=2 if resumed else 0, generator=1)

    run_test_save_load_state(make, stop_at=13, epochs=2)


def test_resume_with_a_torch_generator() -> None:
    torch = pytest.importorskip("torch", reason="resumes a loader seeded by a torch.Generator")

    def make(resumed: bool):
        return DataLoader(
            Noisy(),
            batch_size=4,
            shuffle=True,
            generator=torch.Generator().manual_seed(3),
            num_workers=2 if resumed else 0,
        )

    run_test_save_load_state(make, stop_at=EPOCH + 1, epochs=3)


def test_resume_with_a_custom_stateless_sampler_replays_its_order() -> None:
    class EveryOther:
        def __iter__(self):
            return iter(range(0, 23, 2))

        def __len__(self) -> int:
            return 12

    make = loader_factory({}, dataset=Noisy(), batch_size=5, sampler=EveryOther(), generator=2)
    run_test_save_load_state(make, stop_at=1)


def test_the_loader_owns_the_epoch_and_tells_distributed_sampler() -> None:
    ds = Noisy()
    sampler = DistributedSampler(ds, num_replicas=2, rank=0, seed=3)
    loader = DataLoader(ds, batch_size=100, sampler=sampler)
    orders = [next(iter(loader))["i"].tolist() for _ in range(3)]
    assert orders[0] != orders[1] != orders[2]  # set_epoch was done for us
    assert sampler.epoch == 3
    sampler.set_epoch(1)  # a user's own call is followed
    assert next(iter(loader))["i"].tolist() == orders[1]


def test_a_torch_distributed_sampler_gets_set_epoch() -> None:
    torch = pytest.importorskip("torch", reason="uses torch's own DistributedSampler")
    ds = Noisy()
    sampler = torch.utils.data.DistributedSampler(ds, num_replicas=2, rank=0, seed=3)
    loader = DataLoader(ds, batch_size=100, sampler=sampler)
    first = next(iter(loader))["i"].tolist()
    second = next(iter(loader))["i"].tolist()
    assert sampler.epoch == 1
    assert first != second


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({"epoch": 0}, r"expects a dict made by DataLoader.state_dict\(\) \(version 1\), got None"),
        ("state", r"expects a dict made by DataLoader.state_dict\(\) \(version 1\), got 'str'"),
        ({"version": 1, "epoch": 0, "seed": 1}, "the loader state has no 'batches' entry"),
    ],
)
def test_bad_states_are_rejected_with_what_to_pass(state, message) -> None:
    with pytest.raises(ValueError, match=message):
        DataLoader(Noisy()).load_state_dict(state)


@pytest.mark.parametrize(
    ("entry", "value", "expected"),
    [
        ("batches", -3, "a non-negative int, got -3"),
        ("batches", "3", "a non-negative int, got '3'"),
        ("batches", True, "a non-negative int, got True"),
        ("epoch", 1.5, "a non-negative int, got 1.5"),
        ("epoch", -1, "a non-negative int, got -1"),
        ("seed", -7, "a non-negative int, got -7"),
        ("seed", "17", "a non-negative int, got '17'"),
        ("ahead", [1, 1], "batch numbers without repeats, got [1, 1]"),
        ("ahead", [0], "an int of at least 1, got [0]"),
        ("ahead", 4, "a list of the batch numbers delivered beyond 'batches', got 4"),
        ("drew_seed", "yes", "True or False, got 'yes'"),
        ("samples", -2, "a non-negative int, got -2"),
        (
            "workers",
            {"num_workers": 2, "streams": {"5": {}}, "next": 0},
            "a dict whose 'streams' keys are worker ids below 2, got "
            "{'num_workers': 2, 'streams': {'5': {}}, 'next': 0}",
        ),
        (
            "workers",
            {"num_workers": 2, "streams": {}, "next": 2},
            "a dict whose 'next' is a worker id below 2, got "
            "{'num_workers': 2, 'streams': {}, 'next': 2}",
        ),
        ("workers", [], "a dict of 'num_workers', 'streams' and 'next', got []"),
        ("stream", 3, "the stream's state (a dict), got 3"),
    ],
)
def test_an_edited_state_is_refused_naming_the_entry_and_its_value(entry, value, expected) -> None:
    loader = DataLoader(Noisy(), batch_size=4, shuffle=True, generator=1)
    state = {**loader.state_dict(), entry: value}
    with pytest.raises(ValueError) as caught:
        loader.load_state_dict(state)
    assert str(caught.value) == (
        f"the loader state's {entry!r} entry must be {expected}; pass what state_dict() "
        "returned, unedited"
    )


def test_a_state_past_the_end_of_the_epoch_is_refused_before_anything_loads() -> None:
    loader = DataLoader(Noisy(), batch_size=4, shuffle=True, generator=1)
    loader.load_state_dict({**loader.state_dict(), "batches": 9})
    with pytest.raises(ValueError) as caught:
        next(iter(loader))
    assert str(caught.value) == (
        "the loader state is 9 batches into epoch 0, but this loader's epoch has 6 batches: "
        "the state was saved by a loader over another dataset, sampler or batch size, or "
        "edited. Build the loader as the saved one was built."
    )
    assert loader.state_dict()["batches"] == 9  # nothing changed: still the state loaded
    loader.load_state_dict({**loader.state_dict(), "batches": EPOCH})  # its end: valid
    assert list(loader) == []


def test_a_sampler_state_needs_a_sampler_that_can_load_it() -> None:
    state = DataLoader(Noisy(), batch_size=2, shuffle=True, generator=1).state_dict()
    loader = DataLoader(Noisy(), batch_sampler=[[0, 1], [2]])
    with pytest.raises(
        ValueError, match="holds a sampler state but this loader's list has no load_state_dict"
    ):
        loader.load_state_dict(state)


class CountingStream:
    """A resumable stream: its state is where it stands; samples carry random draws."""

    def __init__(self) -> None:
        self.start = 0

    def __iter__(self):
        for i in range(self.start, 17):
            self.start = i + 1
            yield {"i": i, "np": np.random.rand(), "rng": sample_rng().random()}
        self.start = 0

    def state_dict(self) -> dict:
        return {"start": self.start}

    def load_state_dict(self, state: dict) -> None:
        self.start = state["start"]


def _stream_loader(resumed: bool):
    from stoker import IterableDataset

    class Stream(CountingStream, IterableDataset):
        pass

    return DataLoader(Stream(), batch_size=4, generator=9)


@pytest.mark.parametrize("stop_at", [2, 5, 6])
def test_iterable_datasets_with_state_resume_mid_epoch(stop_at) -> None:
    run_test_save_load_state(_stream_loader, stop_at=stop_at, epochs=2)


def test_iterable_datasets_without_state_are_replayed_and_with_workers_save_each() -> None:
    from stoker import IterableDataset

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(10))

    loader = DataLoader(Stream(), batch_size=3)
    it = iter(loader)
    next(it)
    state = loader.state_dict()  # nothing holds the stream's place: it counts the samples
    assert state["stream"] == {
        "dataset": None, "iterator": None, "taken": 3, "ended": False, "replay": True
    }  # fmt: skip
    resumed = DataLoader(Stream(), batch_size=3)
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] == [b.tolist() for b in it]
    assert loader.state_dict()["epoch"] == 1  # at the epoch boundary

    class Stateful(CountingStream, IterableDataset):
        pass

    workers = DataLoader(Stateful(), batch_size=3, num_workers=2)
    it = iter(workers)
    with pytest.warns(
        UserWarning, match="never called get_worker_info"
    ):  # unsharded: expected here
        next(it)
    state = workers.state_dict()["workers"]
    assert state["num_workers"] == 2 and state["streams"][0]["dataset"] == {"start": 3}
    del it


class Uneven:
    """Like Noisy, but a few samples are slow: with in_order=False batches finish out of order."""

    def __len__(self) -> int:
        return 23

    def __getitem__(self, i: int) -> dict:
        if i % 5 == 0:
            import time

            time.sleep(0.03)
        return {"i": i, "np": np.random.rand(), "py": random.random(), "rng": sample_rng().random()}


MODES = [
    pytest.param({"num_workers": 0}, id="main"),
    pytest.param({"num_workers": 2}, id="process"),
    pytest.param({"num_workers": 2, "worker_mode": "thread"}, id="thread"),
    pytest.param({"num_workers": 2, "persistent_workers": True}, id="persistent"),
]
BOUNDARIES = [2, EPOCH - 1, EPOCH, EPOCH + 1]  # mid-epoch, the last batch, the end, the next start


ORDERS = [
    pytest.param(
        mode.values[0], in_order, id=f"{mode.id}-{'in-order' if in_order else 'out-of-order'}"
    )
    for mode in MODES
    for in_order in (True, False)
    if in_order or mode.values[0]["num_workers"]  # in_order applies to background workers only
]


@pytest.mark.parametrize(("loading", "in_order"), ORDERS)
@pytest.mark.parametrize("stop_at", BOUNDARIES, ids=lambda k: f"after-{k}")
def test_save_load_round_trip_over_order_modes_and_epoch_boundaries(
    loading, in_order, stop_at
) -> None:
    options = {**loading, "in_order": in_order} if loading["num_workers"] else loading
    make = loader_factory(
        options, {"num_workers": 3, "in_order": in_order}, dataset=Uneven(), **SHUFFLED
    )
    run_test_save_load_state(make, stop_at=stop_at, epochs=2, ordered=in_order)


def test_out_of_order_delivery_resumes_exactly() -> None:
    """Out of order, the first N batches handed out are not the first N of the epoch: the
    state records where the epoch stands and which batches beyond it were delivered."""

    def make(resumed: bool):
        return DataLoader(
            Uneven(), batch_size=2, shuffle=True, generator=3, num_workers=3, in_order=False
        )

    loader = make(False)
    it = iter(loader)
    seen = [tuple(next(it)["i"].tolist()) for _ in range(4)]
    state = loader.state_dict()
    assert state["batches"] + len(state.get("ahead", [])) == 4
    assert all(b > state["batches"] for b in state.get("ahead", []))
    rest = list(it)
    del it
    resumed = make(True)
    resumed.load_state_dict(state)
    tail = [tuple(b["i"].tolist()) for b in resumed]
    assert sorted(seen + tail) == sorted(seen + [tuple(b["i"].tolist()) for b in rest])
    assert len(set(seen + tail)) == 12  # every batch exactly once


@pytest.mark.parametrize("resumed_workers", [0, 1, 3])
def test_batches_delivered_out_of_order_are_not_delivered_again_by_any_loader(
    resumed_workers,
) -> None:
    """A state saved with in_order=False holds the batches delivered beyond its place; a
    loader resumed from it, with or without workers, skips exactly those."""

    def make(resumed: bool):
        workers = {"num_workers": resumed_workers} if resumed else {"num_workers": 3}
        return DataLoader(
            Uneven(), batch_size=2, shuffle=True, generator=3, in_order=False, **workers
        )

    loader = make(False)
    it = iter(loader)
    seen = [tuple(next(it)["i"].tolist()) for _ in range(5)]
    state = loader.state_dict()
    del it
    loader.close()
    assert state.get("ahead"), f"the test needs batches delivered out of order: {state}"
    resumed = make(True)
    resumed.load_state_dict(state)
    tail = [tuple(b["i"].tolist()) for b in resumed]
    everything = sorted(tuple(b["i"].tolist()) for b in make(False))
    assert sorted(seen + tail) == everything
