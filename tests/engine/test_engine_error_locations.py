"""Errors name the dataset index that raised them, with or without workers.

People debug with ``num_workers=0``: there, as in a worker, an exception from
``__getitem__`` / ``__getitems__`` carries the dataset index, and a collate error maps the
samples it names ("sample 2") to dataset indices. A worker that dies while starting says
so, instead of blaming a sample it never loaded.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from stoker import CollateError, DataLoader, WorkerError


class FailsAt:
    def __init__(self, bad: int) -> None:
        self.bad = bad

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> np.ndarray:
        if i == self.bad:
            raise ValueError(f"cannot decode file_{i}.jpg")
        return np.zeros(3)


class FailsInGetitems(FailsAt):
    def __getitems__(self, indices: list[int]) -> list[np.ndarray]:
        if self.bad in indices:
            raise OSError("shard 3 is unreadable")
        return [np.zeros(3) for _ in indices]


class Ragged(FailsAt):
    def __getitem__(self, i: int) -> np.ndarray:
        return np.zeros(4 if i == self.bad else 3)


def notes(exc: BaseException) -> str:
    return "\n".join(getattr(exc, "__notes__", ()))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_getitem_errors_name_the_dataset_index(num_workers) -> None:
    loader = DataLoader(FailsAt(bad=5), batch_size=4, num_workers=num_workers)
    with pytest.raises(ValueError, match=r"cannot decode file_5\.jpg") as info:
        list(loader)
    assert (
        "stoker: raised by dataset[5] (FailsAt) while loading batch 1, dataset indices [4, 5, 6, 7]"
        in notes(info.value)
    )


@pytest.mark.parametrize("num_workers", [0, 2])
def test_getitems_errors_name_the_batch(num_workers) -> None:
    loader = DataLoader(FailsInGetitems(bad=2), batch_size=4, num_workers=num_workers)
    with pytest.raises(OSError, match="shard 3 is unreadable") as info:
        list(loader)
    assert (
        "stoker: raised by FailsInGetitems.__getitems__ for batch 0 (dataset indices [0, 1, 2, 3])"
        in notes(info.value)
    )


def test_unbatched_errors_name_the_index() -> None:
    loader = DataLoader(FailsAt(bad=3), batch_size=None)
    with pytest.raises(ValueError) as info:
        list(loader)
    assert notes(info.value) == "stoker: raised by dataset[3] (FailsAt)"


@pytest.mark.parametrize("num_workers", [0, 2])
def test_collate_errors_map_sample_places_to_dataset_indices(num_workers) -> None:
    loader = DataLoader(Ragged(bad=6), batch_size=4, num_workers=num_workers)
    with pytest.raises(
        CollateError, match=r"sample 0 has shape \(3,\) but sample 2 has shape \(4,\)"
    ) as info:
        list(loader)
    assert (
        "stoker: sample 0 is dataset index 4, sample 2 is dataset index 6 "
        "(the batch holds dataset indices [4, 5, 6, 7])"
    ) in notes(info.value)
    assert f"{type(info.value).__module__}.{type(info.value).__name__}" == "stoker.CollateError"


def test_a_shuffled_batch_is_mapped_through_the_sampler() -> None:
    loader = DataLoader(
        Ragged(bad=6), batch_size=8, shuffle=True, generator=np.random.default_rng(3)
    )
    order = next(iter(loader.batch_sampler))
    with pytest.raises(CollateError) as info:
        list(loader)
    place = order.index(6)
    assert f"sample {place} is dataset index 6" in notes(info.value)


def exits_while_starting(worker_id: int) -> None:
    os._exit(3)


@pytest.mark.parametrize("on_worker_death", ["raise", "restart"])
def test_a_worker_that_dies_while_starting_says_so(on_worker_death) -> None:
    loader = DataLoader(
        FailsAt(bad=-1), batch_size=4, num_workers=2, worker_init_fn=exits_while_starting,
        on_worker_death=on_worker_death,
    )  # fmt: skip
    with pytest.raises(WorkerError) as info:
        list(loader)
    message = str(info.value)
    assert message.startswith("DataLoader worker ")
    assert (
        "exited with status 3 while starting, before it loaded any batch: in worker_init_fn, or "
        "while importing the dataset's modules in the new process." in message
    )
    assert "A replacement would fail the same way, so stoker does not start one." in message
    assert "on_worker_death" not in message and "os._exit or sys.exit in the dataset" not in message
    loader.num_workers = 0
    assert len(list(loader)) == 2  # the loader is usable again


def test_a_worker_that_dies_on_a_sample_after_starting_still_blames_the_batch() -> None:
    from engine.engine_datasets import Exits

    loader = DataLoader(Exits(20, bad=5, status=3), batch_size=2, num_workers=2)
    with pytest.raises(WorkerError) as info:
        list(loader)
    assert "exited with status 3 (os._exit or sys.exit in the dataset?)" in str(info.value)
    assert "[4, 5]" in str(info.value) and "while starting" not in str(info.value)
