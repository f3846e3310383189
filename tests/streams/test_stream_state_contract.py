"""What ``loader.state_dict()`` of an IterableDataset loader holds, whenever it is taken.

Each stream (the main process's with ``num_workers=0``, each process worker's otherwise)
is restored in one order: the dataset's state, then ``iter(dataset)``, then the iterator's
state; a stream with neither is replayed up to where it stood. Every test compares the
resumed run, batch for batch, with the uninterrupted one; the samples carry draws from
numpy's global generator, so their random draws are compared too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import pytest

from harness.save_load import to_plain
from harness.streams import (
    BothStates,
    EpochCounting,
    OwnIterator,
    SelfIterating,
    StatefulIterator,
    Stateless,
    batches_of,
    round_trip,
    shard,
)
from stoker import DataLoader, IterableDataset, ShuffleBuffer, mix
from stoker._errors import WorkerError

STREAMS = [EpochCounting, OwnIterator, StatefulIterator, BothStates, Stateless]
LOADING = [
    pytest.param({"num_workers": 0}, id="main"),
    pytest.param({"num_workers": 2}, id="2-workers"),
    pytest.param({"num_workers": 2, "persistent_workers": True}, id="2-persistent"),
]


def tags(batches) -> list[tuple[int, int]]:
    return [(s["value"], s["epoch"]) for batch in batches for s in batch]


def copies_count_epochs(loading) -> bool:
    """The dataset object that counts epochs lives on: the main one, or persistent copies."""
    return not loading["num_workers"] or loading.get("persistent_workers", False)


@pytest.mark.parametrize("loading", LOADING)
@pytest.mark.parametrize("stream", STREAMS, ids=lambda s: s.__name__)
@pytest.mark.parametrize("stop_after", [1, 30, 34, 40])  # 34 batches an epoch
def test_a_state_resumes_exactly_whatever_holds_the_streams_place(
    stream, loading, stop_after
) -> None:
    def make():
        return DataLoader(stream(100), batch_size=3, collate_fn=list, generator=4, **loading)

    whole, head, rest, _ = round_trip(make, stop_after, epochs=2)
    assert sorted(v for v, _ in tags(whole[:34])) == list(range(100))
    assert head + rest == whole


@pytest.mark.parametrize("loading", LOADING)
def test_an_epoch_boundary_state_carries_the_datasets_own_epoch(loading) -> None:
    def make():
        return DataLoader(EpochCounting(12), batch_size=4, collate_fn=list, generator=1, **loading)

    loader = make()
    list(loader)
    state = loader.state_dict()  # after StopIteration: the next epoch's start
    expected = tags(loader)
    loader.close()
    assert {e for _, e in expected} == ({1} if copies_count_epochs(loading) else {0})
    resumed = make()
    resumed.load_state_dict(state)
    assert tags(resumed) == expected
    resumed.close()


@pytest.mark.parametrize("loading", LOADING)
def test_a_state_right_after_iter_rewinds_a_dataset_that_is_its_own_iterator(loading) -> None:
    loader = DataLoader(SelfIterating(100), batch_size=None, **loading)
    iterator = iter(loader)
    state = loader.state_dict()
    first = [s["value"] for s in iterator]
    assert sorted(first) == list(range(100))
    again = [s["value"] for s in loader]
    assert again == ([] if copies_count_epochs(loading) else first)  # at its end, if it lives on
    loader.load_state_dict(state)
    assert [s["value"] for s in loader] == first
    loader.close()


@pytest.mark.parametrize("loading", LOADING)
def test_a_state_after_the_last_batch_resumes_at_that_epochs_end(loading) -> None:
    def make():
        return DataLoader(EpochCounting(10), batch_size=4, collate_fn=list, generator=2, **loading)

    loader = make()
    epoch0, epoch1 = batches_of(loader), batches_of(loader)
    loader.close()
    first = make()
    iterator = iter(first)
    assert [to_plain(next(iterator)) for _ in epoch0] == epoch0
    state = first.state_dict()  # every batch handed out, StopIteration not raised yet
    first.close()
    resumed = make()
    resumed.load_state_dict(state)
    assert list(resumed) == []  # the rest of epoch 0: nothing
    assert batches_of(resumed) == epoch1  # then epoch 1, tagged as its dataset tags it
    assert {e for _, e in tags(epoch1)} == ({1} if copies_count_epochs(loading) else {0})
    resumed.close()


@pytest.mark.parametrize("loading", LOADING[:2])
def test_a_stateless_stream_is_replayed_and_stats_and_the_log_say_so(loading, caplog) -> None:
    def make():
        return DataLoader(Stateless(50), batch_size=4, collate_fn=list, generator=3, **loading)

    with caplog.at_level(logging.WARNING, logger="stoker"):
        whole, head, rest, state = round_trip(make, 5)
    assert head + rest == whole
    saving = (
        "state_dict: Stateless has no state_dict / load_state_dict, nor has the iterator its "
        "__iter__ returns, so this state only counts the samples each stream delivered: "
        "resuming from it replays them and drops them. Give the dataset or its iterator "
        "state_dict / load_state_dict to resume without reading them again."
    )
    where = "worker 0: 12, worker 1: 8" if loading["num_workers"] else "the stream: 20"
    resuming = (
        "resume: Stateless keeps no state, so the resumed epoch replays the 20 samples "
        f"delivered before the state was saved ({where}) and drops them"
    )
    assert [r.getMessage() for r in caplog.records] == [saving, resuming]
    loader = make()
    loader.load_state_dict(state)
    next(iter(loader))
    assert loader.stats().notes == [resuming]
    assert f"note: {resuming}" in str(loader.stats()).splitlines()
    loader.close()


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("stop_after", [1, 9])
def test_a_buffer_and_a_mix_over_plain_iterables_run_and_resume_with_workers(
    num_workers, stop_after
) -> None:
    def buffered():
        return DataLoader(
            ShuffleBuffer(Stateless(60), 8), batch_size=5, collate_fn=list, generator=6,
            num_workers=num_workers,
        )  # fmt: skip

    def mixed():
        return DataLoader(
            mix([Stateless(40), Stateless(30)], [2, 1]), batch_size=5, collate_fn=list,
            generator=6, num_workers=num_workers,
        )  # fmt: skip

    for make in (buffered, mixed):
        whole, head, rest, _ = round_trip(make, stop_after, epochs=2)
        assert len(whole) > 2 * stop_after
        assert head + rest == whole


class Tracked:
    """A sample that writes a line to ``log`` each time it is pickled (in a worker)."""

    def __init__(self, value: int, log: str) -> None:
        self.value, self.log = value, log

    def __reduce__(self):
        with open(self.log, "a") as out:
            out.write(f"{self.value}\n")
        return int, (self.value,)


class TrackedStream(IterableDataset):
    """A stream of :class:`Tracked` samples with its own state."""

    def __init__(self, n: int, log: str) -> None:
        self.n, self.log, self.at = n, log, 0

    def __iter__(self):
        values = list(shard(self.n))
        while self.at < len(values):
            self.at += 1
            yield Tracked(values[self.at - 1], self.log)
        self.at = 0

    def state_dict(self):
        return {"at": self.at}

    def load_state_dict(self, state):
        self.at = state["at"]


def test_buffered_samples_cross_once_in_their_batch_and_the_buffer_only_when_asked(
    tmp_path,
) -> None:
    log = tmp_path / "pickled.txt"
    log.touch()

    def make():
        return DataLoader(
            ShuffleBuffer(TrackedStream(400, str(log)), 50), batch_size=8, collate_fn=list,
            num_workers=2, generator=1,
        )  # fmt: skip

    def pickled() -> int:
        return len(log.read_text().split())

    whole = batches_of(make())
    assert pickled() == 400  # every sample once, in its batch
    loader = make()
    iterator = iter(loader)
    head = [next(iterator) for _ in range(10)]
    time.sleep(0.3)  # the workers load ahead
    before = pickled()
    assert before <= 400 + 80 + 2 * 2 * 8  # the 10 batches, and those loaded ahead
    state = loader.state_dict()
    assert pickled() - before == 2 * 49  # each worker's buffer, once (after a batch: 49 held)
    rest = list(iterator)
    loader.close()
    assert pickled() == 400 + 400 + 2 * 49
    resumed = make()
    resumed.load_state_dict(state)
    assert head + rest == whole
    assert head + list(resumed) == whole
    resumed.close()


class SlowState(IterableDataset):
    """Its iterator's ``state_dict()`` takes 30 s."""

    def __iter__(self):
        iterator = StatefulIterator(40).__iter__()
        iterator.state_dict = lambda: time.sleep(30) or {}
        return iterator


def test_a_worker_that_does_not_answer_is_named_with_its_pid(monkeypatch) -> None:
    from stoker.engine import stream_state

    monkeypatch.setattr(stream_state, "STATE_REQUEST_TIMEOUT_S", 1.0)
    loader = DataLoader(SlowState(), batch_size=4, collate_fn=list, num_workers=1)
    iterator = iter(loader)
    next(iterator)
    pid = loader._live_pool().pid(0)
    with pytest.raises(WorkerError) as info:
        loader.state_dict()
    assert str(info.value) == (
        f"state_dict() waited 1 s for the stream state of worker 0 (pid {pid}), which did not "
        "answer: it is still loading a batch, or stuck in its dataset's state_dict(). A worker "
        "answers once its current batch is loaded."
    )
    iterator.close()


class FailingState(StatefulIterator):
    def __iter__(self):
        iterator = super().__iter__()
        iterator.state_dict = lambda: {}[iterator.at]  # KeyError
        return iterator


def test_a_state_dict_that_raises_in_a_worker_raises_its_error_naming_the_worker() -> None:
    loader = DataLoader(FailingState(40), batch_size=4, collate_fn=list, num_workers=2)
    iterator = iter(loader)
    next(iterator)
    with pytest.raises(KeyError) as info:
        loader.state_dict()
    note = info.value.__notes__[-1]
    assert note.startswith("Raised in stoker worker 0 (pid ")
    assert ") while it captured its stream's state for state_dict().\nWorker traceback" in note
    assert list(iterator)  # the epoch goes on
    loader.close()


@pytest.mark.parametrize("loading", LOADING)
def test_a_state_after_a_break_resumes_where_the_loop_stopped(loading) -> None:
    def make():
        stream = StatefulIterator(60)
        return DataLoader(stream, batch_size=4, collate_fn=list, generator=5, **loading)

    whole = batches_of(make())
    loader = make()
    head = []
    for batch in loader:
        head.append(to_plain(batch))
        if len(head) == 5:
            break  # the iterator is dropped: non-persistent workers stop
    state = loader.state_dict()
    loader.close()
    resumed = make()
    resumed.load_state_dict(state)
    assert head + batches_of(resumed) == whole
    resumed.close()


@pytest.mark.parametrize("stream", [StatefulIterator, Stateless], ids=lambda s: s.__name__)
@pytest.mark.parametrize("worker_mode", ["process", "thread"])
def test_thread_workers_resume_streams_kept_by_their_iterators_or_replayed(
    stream, worker_mode
) -> None:
    def make():
        return DataLoader(
            stream(60), batch_size=4, collate_fn=list, generator=8, num_workers=2,
            worker_mode=worker_mode,
        )  # fmt: skip

    whole, head, rest, _ = round_trip(make, 6)
    assert head + rest == whole


def test_a_boundary_state_of_persistent_workers_is_refused_with_another_count() -> None:
    loader = DataLoader(EpochCounting(12), batch_size=4, num_workers=2, persistent_workers=True)
    list(loader)
    state = loader.state_dict()
    loader.close()
    other = DataLoader(EpochCounting(12), batch_size=4, num_workers=3)
    other.load_state_dict(state)
    with pytest.raises(ValueError) as info:
        next(iter(other))
    assert str(info.value) == (
        "this state was saved at the start of epoch 1 by a loader whose 2 persistent workers "
        "each held their own copy of EpochCounting, with its own state, and this one has "
        "num_workers=3: each copy resumes in its own worker. Pass num_workers=2, or save the "
        "state before the workers start to change it."
    )


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("stream", [EpochCounting, StatefulIterator], ids=lambda s: s.__name__)
def test_a_state_taken_while_a_pinning_thread_reads_ahead_counts_what_the_loop_received(
    monkeypatch, stream, num_workers
) -> None:
    pytest.importorskip("torch", reason="pin_memory belongs to stoker.torch, which needs torch")
    import functools

    import torch

    from stoker.torch import DataLoader as TorchLoader
    from stoker.torch import _loader as torch_loader
    from stoker.torch._pinning import pin_batch

    cpu_pin = functools.partial(pin_batch, allocate=lambda n: torch.empty(n, dtype=torch.uint8))
    monkeypatch.setattr(torch_loader, "accelerator_pin_function", lambda: (cpu_pin, None))

    def make(**options):
        return TorchLoader(
            stream(60), batch_size=4, generator=3, num_workers=num_workers, **options
        )

    pinned_round_trip(make, 3, lambda loader, iterator: iterator._queue.qsize() == 2)


@pytest.mark.parametrize("persistent", [False, True], ids=["own-workers", "persistent"])
@pytest.mark.parametrize(
    "stream",
    [EpochCounting, StatefulIterator, lambda n: ShuffleBuffer(EpochCounting(n), 5, seed=2)],
    ids=["EpochCounting", "StatefulIterator", "ShuffleBuffer"],
)
def test_a_state_taken_after_the_workers_ended_while_a_pinning_thread_holds_batches(
    monkeypatch, stream, persistent
) -> None:
    """The engine saw the epoch's end and stopped its workers, the loop has two batches to
    go: the state is the one before them (it raised AssertionError: the workers moved on)."""
    pytest.importorskip("torch", reason="pin_memory belongs to stoker.torch, which needs torch")
    from stoker.torch import DataLoader as TorchLoader
    from stoker.torch import _loader as torch_loader

    monkeypatch.setattr(torch_loader, "accelerator_pin_function", lambda: (lambda b: b, None))

    def make(**options):
        return TorchLoader(
            stream(60), batch_size=4, generator=3, num_workers=2,
            persistent_workers=persistent, **options,
        )  # fmt: skip

    assert len(batches_of(make())) == 16  # 8 a worker: 2 left after 14
    pinned_round_trip(
        make, 14, lambda loader, iterator: loader._progress.done and iterator._queue.qsize() == 2
    )


def pinned_round_trip(
    make: Callable[..., Any], taken: int, ready: Callable[[Any, Any], bool]
) -> None:
    """Takes ``taken`` batches through a pinning thread, waits until ``ready(loader,
    iterator)`` (what the thread holds then), takes the state: the iterator goes on as if
    nothing happened, and the state resumes the uninterrupted run exactly."""
    expected = batches_of(make())
    loader = make(pin_memory=True)
    iterator = iter(loader)
    head = [to_plain(next(iterator)) for _ in range(taken)]
    deadline = time.monotonic() + 10
    while not ready(loader, iterator) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ready(loader, iterator)
    state = loader.state_dict()
    assert [to_plain(b) for b in iterator] == expected[taken:]  # the iterator is undisturbed
    loader.close()
    resumed = make()
    resumed.load_state_dict(state)
    assert head + batches_of(resumed) == expected
    resumed.close()


def test_a_buffers_capture_is_the_state_it_had_however_far_the_buffer_moved_on() -> None:
    from stoker._state_capture import capture, captured

    buffer = ShuffleBuffer(EpochCounting(90), 7, seed=5)
    iterator = iter(buffer)
    marks, expected = [], []
    for step in range(95):  # past the end: the buffer drains, then stops
        marks.append(capture(buffer))
        expected.append(buffer.state_dict())
        if next(iterator, None) is None:
            break
        if step % 10 == 9:
            del marks[-5:-2]  # captures dropped: the log keeps only what live ones need
            del expected[-5:-2]
    assert len(marks) > 60
    for mark, state in zip(marks, expected, strict=True):
        assert captured(buffer, mark) == state
    marks.clear()
    del mark
    assert buffer._live.journal is None  # no capture left: the buffer logs nothing
