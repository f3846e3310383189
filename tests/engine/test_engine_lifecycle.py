"""Worker lifetime: persistent workers, worker_init_fn, start methods, prefetch bounds, cleanup."""

from __future__ import annotations

import functools
import gc
import os
import threading
import time

import numpy as np
import pytest

from engine.engine_datasets import (
    BlocksFrom,
    CollectsGarbage,
    Raises,
    Recording,
    SampleBroken,
    Samples,
    ShardedStream,
    record_init,
)
from harness import leaks as engine_harness
from stoker import DataLoader
from stoker._proc import descendants

MODES = ("process", "thread")


def worker_identity(batch: tuple) -> set[tuple[int, int, int]]:
    """(worker id, pid, thread ident) of whoever loaded each sample."""
    return {(int(w), int(p), int(t)) for w, p, t in zip(batch[3], batch[1], batch[2], strict=True)}


def epoch(loader: DataLoader) -> tuple[list[int], set[tuple[int, int, int]]]:
    order, workers = [], set()
    for batch in loader:
        order += batch[0].tolist()
        workers |= worker_identity(batch)
    return order, workers


@pytest.mark.parametrize("mode", MODES)
def test_persistent_workers_serve_three_epochs_with_fresh_shuffles(mode: str) -> None:
    loader = DataLoader(
        Samples(40),
        batch_size=4,
        shuffle=True,
        generator=5,
        num_workers=2,
        worker_mode=mode,
        persistent_workers=True,
    )
    orders, crews = zip(*(epoch(loader) for _ in range(3)), strict=True)
    assert all(sorted(order) == list(range(40)) for order in orders)
    assert len({tuple(order) for order in orders}) == 3  # a new shuffle every epoch
    assert crews[0] == crews[1] == crews[2]  # the very same workers every epoch
    assert {w for w, _, _ in crews[0]} == {0, 1}
    loader.close()


def test_non_persistent_workers_are_new_every_epoch() -> None:
    loader = DataLoader(Samples(8), batch_size=2, num_workers=2)
    first, second = epoch(loader)[1], epoch(loader)[1]
    assert {p for _, p, _ in first}.isdisjoint({p for _, p, _ in second})


@pytest.mark.parametrize("mode", MODES)
def test_persistent_epoch_after_an_abandoned_one_still_delivers_everything(mode: str) -> None:
    loader = DataLoader(
        Samples(30), batch_size=3, num_workers=2, worker_mode=mode, persistent_workers=True
    )
    it = iter(loader)
    assert next(it)[0].tolist() == [0, 1, 2]
    del it  # its tasks are still in flight on the same workers
    order, _ = epoch(loader)
    assert order == list(range(30))  # none of the stale epoch's batches leak into this one
    loader.close()


@pytest.mark.parametrize("persistent", [False, True], ids=["per_epoch", "persistent"])
@pytest.mark.parametrize("mode", MODES)
def test_worker_init_fn_runs_once_per_worker_with_its_id(
    mode: str, persistent: bool, tmp_path
) -> None:
    log = tmp_path / "init.log"
    loader = DataLoader(
        Samples(24),
        batch_size=2,
        num_workers=3,
        worker_mode=mode,
        persistent_workers=persistent,
        worker_init_fn=functools.partial(record_init, str(log)),
    )
    _, crew = epoch(loader)
    _, crew2 = epoch(loader)
    lines = [line.split() for line in log.read_text().splitlines()]
    calls = 3 if persistent else 6  # once per worker started: per epoch unless persistent
    assert len(lines) == calls
    # the id passed equals get_worker_info().id inside the same worker
    assert sorted((int(a), int(b)) for a, b, _, _ in lines) == sorted(
        [(i, i) for i in range(3)] * (calls // 3)
    )
    started = {(int(w), int(p), int(t)) for w, _, p, t in lines}
    assert crew | crew2 <= started  # it ran in the worker that then loaded the samples
    if mode == "process":
        assert os.getpid() not in {p for _, p, _ in started}
    else:
        assert threading.get_ident() not in {t for _, _, t in started}
    loader.close()


@pytest.mark.parametrize("context", ["fork", "forkserver", "spawn"])
def test_start_methods_deliver_the_same_batches(context: str) -> None:
    loader = DataLoader(
        Samples(24, width=4096),  # 128 KiB batches: the slots are attached by name in the child
        batch_size=4,
        num_workers=2,
        multiprocessing_context=context,
    )
    batches = list(loader)
    assert [b[0].tolist() for b in batches] == [list(range(i, i + 4)) for i in range(0, 24, 4)]
    for batch in batches:
        np.testing.assert_array_equal(
            batch[4], np.repeat(batch[0][:, None].astype(np.float64), 4096, axis=1)
        )
    pids = {int(p) for b in batches for p in b[1]}
    assert len(pids) == 2 and os.getpid() not in pids


@pytest.mark.parametrize("mode", MODES)
def test_a_generous_timeout_does_not_fire(mode: str) -> None:
    loader = DataLoader(Samples(20), batch_size=2, num_workers=2, worker_mode=mode, timeout=30)
    assert epoch(loader)[0] == list(range(20))


# ------------------------------------------------------------------ prefetch bounds


def fetched(log) -> list[int]:
    return [int(line) for line in log.read_text().split()] if log.exists() else []


@pytest.mark.parametrize("in_order", [True, False], ids=["in_order", "as_ready"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("num_workers", "prefetch_factor"), [(1, 1), (2, 2), (3, 1)])
def test_prefetch_never_runs_ahead_of_the_consumer(
    num_workers: int, prefetch_factor: int, mode: str, in_order: bool, tmp_path
) -> None:
    """At most prefetch_factor * num_workers batches are started beyond those consumed."""
    log = tmp_path / "fetch.log"
    loader = DataLoader(
        Recording(60, str(log)),
        batch_size=None,  # one sample per batch: the log counts batches
        num_workers=num_workers,
        prefetch_factor=prefetch_factor,
        worker_mode=mode,
        in_order=in_order,
    )
    budget = prefetch_factor * num_workers
    received = []
    for consumed, item in enumerate(loader, start=1):
        received.append(item[0])
        started = fetched(log)
        assert len(started) <= consumed + budget, (consumed, started)
    assert sorted(received) == list(range(60))
    assert sorted(fetched(log)) == list(range(60))  # and nothing was fetched twice


@pytest.mark.parametrize("mode", MODES)
def test_a_straggler_does_not_let_the_others_run_unboundedly_ahead(mode: str, tmp_path) -> None:
    """in_order=True with a slow batch: batches ready behind it still count against the budget."""
    log, release = tmp_path / "fetch.log", tmp_path / "release"
    loader = DataLoader(
        Recording(60, str(log), blocked=0, release_path=str(release)),
        batch_size=None,
        num_workers=2,
        prefetch_factor=2,
        worker_mode=mode,
    )
    it = iter(loader)
    timer = threading.Timer(0.3, release.touch)  # the other worker is free meanwhile
    timer.start()
    try:
        assert next(it)[0] == 0
    finally:
        timer.join()
    assert len(fetched(log)) <= 1 + 2 * 2
    assert [item[0] for item in it] == list(range(1, 60))


@pytest.mark.parametrize("mode", MODES)
def test_out_of_order_delivery_does_not_wait_for_a_straggler(mode: str, tmp_path) -> None:
    log, release = tmp_path / "fetch.log", tmp_path / "release"
    loader = DataLoader(
        Recording(30, str(log), blocked=0, release_path=str(release)),
        batch_size=2,
        num_workers=2,
        worker_mode=mode,
        in_order=False,
    )
    it = iter(loader)
    first = [next(it)[0].tolist() for _ in range(5)]  # batch [0, 1] is stuck meanwhile
    assert [0, 1] not in first
    release.touch()
    rest = [b[0].tolist() for b in it]
    everything = first + rest
    assert sorted(everything) == [[i, i + 1] for i in range(0, 30, 2)]  # each batch exactly once


# ------------------------------------------------------------------ cleanup


@pytest.mark.parametrize("mode", MODES)
def test_abandoned_iterator_stops_its_workers(mode: str) -> None:
    loader = DataLoader(Samples(200, width=4096), batch_size=4, num_workers=2, worker_mode=mode)
    it = iter(loader)
    batches = [next(it), next(it)]
    assert [b[0].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    workers = engine_harness.worker_processes()
    assert len(workers) == (2 if mode == "process" else 0)
    del it
    gc.collect()
    assert engine_harness.wait_gone(workers, limit_s=0) == []  # shutdown is synchronous
    assert engine_harness.shm_segments(os.getpid()) == []
    assert engine_harness.worker_threads() == []
    np.testing.assert_array_equal(batches[1][4][:, 0], [4, 5, 6, 7])  # held batches stay readable


@pytest.mark.parametrize("mode", MODES)
def test_garbage_collected_persistent_loader_stops_its_workers(mode: str) -> None:
    loader = DataLoader(
        Samples(16, width=4096),
        batch_size=4,
        num_workers=2,
        worker_mode=mode,
        persistent_workers=True,
    )
    assert epoch(loader)[0] == list(range(16))
    workers = engine_harness.worker_processes()
    threads = engine_harness.worker_threads()
    assert len(workers) == (2 if mode == "process" else 0)  # alive between epochs
    assert len(threads) == (2 if mode == "thread" else 0)
    del loader
    gc.collect()
    assert engine_harness.wait_gone(workers, limit_s=0) == []
    assert not any(t.is_alive() for t in threads)


def test_close_twice_is_fine_and_the_loader_can_start_again() -> None:
    loader = DataLoader(Samples(12), batch_size=3, num_workers=2, persistent_workers=True)
    first_pids = {p for _, p, _ in epoch(loader)[1]}
    loader.close()
    loader.close()
    assert engine_harness.worker_processes() == []
    order, crew = epoch(loader)  # a closed loader starts new workers on the next epoch
    assert order == list(range(12))
    assert first_pids.isdisjoint({p for _, p, _ in crew})
    with loader:
        pass  # __exit__ closes
    assert engine_harness.worker_processes() == []


@pytest.mark.parametrize("mode", MODES)
def test_persistent_workers_restart_an_iterable_stream_every_epoch(mode: str) -> None:
    loader = DataLoader(
        ShardedStream(29, split=17),
        batch_size=3,
        num_workers=2,
        worker_mode=mode,
        persistent_workers=True,
    )
    for _ in range(2):
        values = [int(v) for batch in loader for v in batch]
        assert sorted(values) == list(range(29))  # the whole stream again, exactly once
    loader.close()


def test_a_new_epoch_supersedes_the_previous_iterator_of_persistent_workers() -> None:
    loader = DataLoader(Samples(20), batch_size=2, num_workers=2, persistent_workers=True)
    old = iter(loader)
    assert next(old)[0].tolist() == [0, 1]
    new = iter(loader)
    assert next(old)[0].tolist() == [2, 3]  # the new epoch starts at its first next()
    assert next(new)[0].tolist() == [0, 1]
    with pytest.raises(RuntimeError, match=r"superseded by a newer iter\(loader\)"):
        next(old)
    assert [b[0].tolist() for b in new] == [[i, i + 1] for i in range(2, 20, 2)]
    loader.close()


def test_a_pool_is_never_shut_down_from_a_process_forked_after_it(tmp_path) -> None:
    """A fork copies garbage the trainer has not collected yet: a failed iterator kept in a
    cycle by its traceback. When a new worker's garbage collector frees it, its finalizer
    runs in that worker and used to shut the old pool down from there (joining processes
    that are not its children, unlinking the trainer's segments)."""
    import gc

    gc.collect()
    gc.disable()
    try:
        failing = DataLoader(Raises(20, bad=3), batch_size=2, num_workers=2)
        try:
            list(failing)
        except SampleBroken as exc:
            exc.keep = exc  # a cycle through the traceback keeps the iterator until a collection
        del failing
        log = tmp_path / "finalizers.log"
        collector = DataLoader(CollectsGarbage(4, str(log)), batch_size=2, num_workers=1)
        assert [b.tolist() for b in collector] == [[0, 1], [2, 3]]
    finally:
        gc.enable()
        gc.collect()  # the trainer runs the old pool's finalizer itself, once
    assert not log.exists(), log.read_text()


def test_forked_workers_start_while_the_trainer_waits_and_all_of_them_work() -> None:
    # worker 0 is forked alone; the others are forked one at a time whenever the trainer
    # would wait, so the first batch does not wait for every fork
    loader = DataLoader(Samples(240), batch_size=4, num_workers=6, multiprocessing_context="fork")
    iterator = iter(loader)
    first = next(iterator)
    pool = iterator._inner._pool
    assert pool.ramp, "forked pools start their workers on a ramp"
    rest = list(iterator)
    pids = {int(p) for b in [first, *rest] for p in b[1]}
    assert len(pids) == 6 and os.getpid() not in pids, "every worker was started and worked"
    assert sorted(int(i) for b in [first, *rest] for i in b[0]) == list(range(240))


def test_torch_code_reading_the_workers_after_iter_sees_every_process() -> None:
    loader = DataLoader(Samples(40), batch_size=4, num_workers=4, multiprocessing_context="fork")
    iterator = iter(loader)
    processes = iterator._workers  # torch's attribute, read right after iter()
    assert len(processes) == 4 and all(p.is_alive() for p in processes)
    assert sorted(int(i) for b in iterator for i in b[0]) == list(range(40))


@pytest.mark.parametrize("closer", ["iterator", "loader"])
@pytest.mark.parametrize("persistent", [False, True], ids=["fresh", "persistent"])
@pytest.mark.parametrize("mode", MODES)
def test_close_from_another_thread_ends_a_waiting_next_at_once(
    mode: str, persistent: bool, closer: str, tmp_path
) -> None:
    """next() waits for a batch that will not come soon; another thread closes: next()
    raises StopIteration within a second or so, hands out no batch after the close, and
    the workers are gone (it used to spin at 100% CPU, or deliver one more batch)."""
    release = str(tmp_path / "release")
    loader = DataLoader(
        BlocksFrom(12, first_blocked=4, release_path=release), batch_size=2, num_workers=2,
        worker_mode=mode, persistent_workers=persistent,
    )  # fmt: skip
    it = iter(loader)
    assert [next(it)[0].tolist() for _ in range(2)] == [[0, 1], [2, 3]]
    target = it if closer == "iterator" else loader
    timer = threading.Timer(0.3, target.close)
    timer.start()
    started = time.monotonic()
    try:
        with pytest.raises(StopIteration):
            next(it)
        waited = time.monotonic() - started
        assert list(it) == [], "a batch was handed out after close()"
    finally:
        open(release, "w").close()  # thread workers cannot be killed: let them finish
        timer.join()
    assert waited < 3.0, f"next() took {waited:.1f} s to notice the close"
    loader.close()
    deadline = time.monotonic() + 10
    while descendants(os.getpid()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert descendants(os.getpid()) == []


class _SlowAt(Recording):
    """1 MiB samples (they travel in slots); index ``blocked`` waits for ``release_path``."""

    def __getitem__(self, i: int) -> tuple[int, int, int, int, np.ndarray]:
        sample = super().__getitem__(i)
        return (*sample[:4], np.full(1 << 17, i, dtype=np.float64))


def test_closed_thread_workers_load_nothing_queued_and_print_no_traceback(tmp_path, capfd) -> None:
    """A batch slower than the shutdown's join is loading when the loader closes: the
    thread workers start none of the tasks queued behind it, and nothing is printed (a
    KeyError traceback from a thread came on stderr, and the queued batches were loaded)."""
    log, release = str(tmp_path / "log"), str(tmp_path / "release")
    loader = DataLoader(
        _SlowAt(40, log, blocked=2, release_path=release), batch_size=1, num_workers=2,
        worker_mode="thread", prefetch_factor=4, in_order=True,
    )  # fmt: skip
    it = iter(loader)
    assert [next(it)[0].tolist() for _ in range(2)] == [[0], [1]]
    time.sleep(0.3)  # the other worker runs ahead into its queue
    loader.close()  # waits ~2 s for the blocked thread, then gives up on it
    with open(log) as f:
        started_before = {int(line) for line in f}
    open(release, "w").close()
    time.sleep(1.0)  # time for a thread that went on to start its queued tasks
    with open(log) as f:
        started = [int(line) for line in f]
    assert set(started) == started_before, f"loaded after close: {set(started) - started_before}"
    assert len(started_before) < 40, "the test needs tasks queued at the close"
    assert not [t for t in threading.enumerate() if t.name.startswith("stoker-worker-")]
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception in thread" not in err, err
