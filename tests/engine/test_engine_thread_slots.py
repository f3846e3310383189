"""Thread workers collate large batches into reused slots of the trainer's own memory.

A fresh 24 MiB allocation per batch costs more than the copy into it (the kernel zeroes
and faults in every page), so thread workers reuse a few slots as process workers do,
under the same rule: a slot goes back to the pool only once no array of its batch is
alive, so a batch the user keeps is never overwritten."""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable, Iterator

import numpy as np
import pytest

import stoker
import stoker.loader
from stoker.engine.mode_trial import ModeTrial

SHAPE = (3, 128, 128)  # 192 KiB per sample: a batch of 8 is 1.5 MiB, above the slot threshold
N, BATCH = 96, 8


class Images:
    """Thread-safe; sample ``i`` is a float32 array filled with ``i``, and ``i``."""

    thread_safe = True

    def __init__(self, shape: tuple[int, ...] = SHAPE, bad: frozenset[int] = frozenset()) -> None:
        self.shape = shape
        self.bad = bad

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        if i in self.bad:
            raise ValueError(f"sample {i} is damaged")
        return np.full(self.shape, i, np.float32), i


@pytest.fixture
def thread_loader() -> Iterator[Callable[..., stoker.DataLoader]]:
    """Makes persistent thread-worker loaders, and closes them whatever the test's outcome."""
    made: list[stoker.DataLoader] = []

    def make(dataset: Images, **kwargs: object) -> stoker.DataLoader:
        kwargs = {"shuffle": True, "generator": 7, "persistent_workers": True, **kwargs}
        loader = stoker.DataLoader(
            dataset, batch_size=BATCH, num_workers=2, worker_mode="thread", **kwargs
        )
        made.append(loader)
        return loader

    yield make
    for loader in made:
        loader.close()


def check(batch: tuple[np.ndarray, np.ndarray]) -> list[int]:
    """The batch's indices, after checking every array holds its own index throughout."""
    arrays, indices = batch
    column = indices.reshape((-1,) + (1,) * (arrays.ndim - 1)).astype(np.float32)
    expected = np.broadcast_to(column, arrays.shape)
    np.testing.assert_array_equal(arrays, expected)
    return indices.tolist()


def slot_ranges(loader: stoker.DataLoader) -> list[tuple[int, int]]:
    """The address ranges of the pool's slots."""
    ranges = []
    for slot in loader._pool.slots._slots:
        view = np.frombuffer(slot.mm, np.uint8)
        start = view.__array_interface__["data"][0]
        ranges.append((start, start + view.nbytes))
        del view
    return ranges


def address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def own_segments() -> set[str]:
    """This process's files in /dev/shm (stoker names them by their creator's pid): another
    program's, a test run beside this one included, are none of this test's business."""
    return {name for name in os.listdir("/dev/shm") if name.startswith(f"stoker-{os.getpid()}-")}


def test_large_batches_reuse_a_few_slots_of_the_trainers_memory(
    thread_loader: Callable[..., stoker.DataLoader],
) -> None:
    shm_before = own_segments()
    loader = thread_loader(Images())
    for epoch in range(2):
        seen, addresses = [], []
        for batch in loader:
            seen += check(batch)
            addresses.append(address(batch[0]))
            del batch
        assert sorted(seen) == list(range(N)), epoch
    slots = loader._pool.slots
    assert slots is not None and slots._in_process
    ranges = slot_ranges(loader)
    assert len(ranges) <= slots.capacity == 2 * 2 + 2
    # the second epoch's batches lie in those few slots (all of them but for a rare one
    # loaded while a worker thread still held its last lease for a moment)
    in_slots = [any(lo <= a < hi for lo, hi in ranges) for a in addresses]
    assert sum(in_slots) >= len(in_slots) - 2, (addresses, ranges)
    assert own_segments() - shm_before == set()  # nothing in /dev/shm


def test_batches_the_user_keeps_are_never_overwritten(
    thread_loader: Callable[..., stoker.DataLoader],
) -> None:
    loader = thread_loader(Images())
    reference = stoker.DataLoader(Images(), batch_size=BATCH, shuffle=True, generator=7)
    for _ in range(2):
        kept = list(loader)  # every batch of the epoch held at once
        assert sorted(i for batch in kept for i in check(batch)) == list(range(N))
        starts = [address(batch[0]) for batch in kept]
        assert len(set(starts)) == len(starts)  # no two kept batches share memory
        assert [b[1].tolist() for b in kept] == [b[1].tolist() for b in reference]


def test_failed_and_skipped_batches_give_their_slots_back(
    thread_loader: Callable[..., stoker.DataLoader],
) -> None:
    bad = frozenset(range(0, N, 5))
    loader = thread_loader(Images(bad=bad), on_error="skip", max_errors=3 * len(bad))
    for _ in range(3):
        seen = [i for batch in loader for i in check(batch)]
        assert sorted(seen) == sorted(set(range(N)) - bad)
    assert len(slot_ranges(loader)) <= loader._pool.slots.capacity
    dataset = Images(bad=frozenset({40}))
    loader = thread_loader(dataset)
    for _ in range(2):
        with pytest.raises(ValueError, match="sample 40 is damaged"):
            for batch in loader:
                check(batch)
    dataset.bad = frozenset()  # mended: the same workers and slots load every sample
    assert sorted(i for batch in loader for i in check(batch)) == list(range(N))
    assert len(slot_ranges(loader)) <= loader._pool.slots.capacity


def test_copy_batches_hands_out_copies_outside_the_slots(
    thread_loader: Callable[..., stoker.DataLoader],
) -> None:
    loader = thread_loader(Images(), copy_batches=True)
    batches = list(loader)
    ranges = slot_ranges(loader)
    assert ranges  # the workers did use slots
    for batch in batches:
        check(batch)
        assert not any(lo <= address(batch[0]) < hi for lo, hi in ranges)


def test_small_batches_are_allocated_as_usual(
    thread_loader: Callable[..., stoker.DataLoader],
) -> None:
    loader = thread_loader(Images(shape=(4,)))
    assert sorted(i for batch in loader for i in check(batch)) == list(range(N))
    assert loader._pool.slots is None


@pytest.mark.parametrize(("margin", "kept"), [(float("inf"), "process"), (0.0, "thread")])
def test_switching_kinds_mid_epoch_keeps_every_held_batch(
    monkeypatch: pytest.MonkeyPatch, margin: float, kept: str
) -> None:
    # worker_mode="auto" over large batches: thread slots, then shared-memory slots (and back
    # when threads win), while the loop holds every batch of both epochs
    trial = functools.partial(ModeTrial, warmup=1, min_batches=3, min_s=0.0, margin=margin)
    monkeypatch.setattr(stoker.loader, "ModeTrial", trial)
    reference = stoker.DataLoader(Images(), batch_size=BATCH, shuffle=True, generator=7)
    loader = stoker.DataLoader(
        Images(), batch_size=BATCH, shuffle=True, generator=7, num_workers=2, worker_mode="auto"
    )
    held = [list(loader) for _ in range(2)]
    assert f"batches/s: {'processes' if kept == 'process' else 'threads'}" in "\n".join(
        loader.stats().autotune
    )
    for epoch, expected in zip(held, [list(reference) for _ in range(2)], strict=True):
        assert [check(b) for b in epoch] == [b[1].tolist() for b in expected]
    starts = [address(b[0]) for epoch in held for b in epoch]
    assert len(set(starts)) == len(starts)  # no two held batches share memory


def test_torch_tensors_over_thread_slots_keep_their_batch() -> None:
    torch = pytest.importorskip("torch", reason="stoker.torch needs torch, which CI installs")
    import stoker.torch

    loader = stoker.torch.DataLoader(
        Images(), batch_size=BATCH, shuffle=True, generator=7, num_workers=2,
        worker_mode="thread", persistent_workers=True,
    )  # fmt: skip
    try:
        for _ in range(2):
            kept = list(loader)
            for arrays, indices in kept:
                assert isinstance(arrays, torch.Tensor)
                check((arrays.numpy(), indices.numpy()))
            assert sorted(int(i) for _, indices in kept for i in indices) == list(range(N))
            ranges = slot_ranges(loader)
            in_slots = [any(lo <= a.data_ptr() < hi for lo, hi in ranges) for a, _ in kept]
            assert any(in_slots)  # tensors built over the slots, which the held ones keep busy
            del kept, arrays, indices  # the slots are free for the next epoch
    finally:
        loader.close()


def test_a_budget_too_small_for_the_slots_leaves_them_out_quietly(
    thread_loader: Callable[..., stoker.DataLoader],
) -> None:
    # 4 MiB hold 2 batches of 1.5 MiB, not the 6 slots: every batch is allocated on its own
    loader = thread_loader(Images(), memory_budget=4 * 2**20)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            assert sorted(i for batch in loader for i in check(batch)) == list(range(N))
    assert loader._pool.slots is None
