"""A thread pool's first batch is made by one thread alone, and the others follow as soon as
it is answered or its thread waits (stoker.engine.head_start)."""

from __future__ import annotations

import functools
import threading
import time

import numpy as np
import pytest

import stoker
from stoker.engine import multi_worker
from stoker.engine.head_start import HeadStart

N, BATCH = 24, 4


class Spinning:
    """Thread-safe; each sample holds the GIL for ``spin_s`` and logs when it starts and ends."""

    thread_safe = True

    def __init__(self, spin_s: float = 0.003) -> None:
        self.spin_s = spin_s
        self.events: list[tuple[str, int, int]] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return N

    def _log(self, what: str, i: int) -> None:
        info = stoker.get_worker_info()
        with self._lock:
            self.events.append((what, i, -1 if info is None else info.id))

    def __getitem__(self, i: int) -> np.ndarray:
        self._log("start", i)
        end = time.perf_counter() + self.spin_s
        while time.perf_counter() < end:  # Python work: holds the GIL
            pass
        self._log("end", i)
        return np.full(3, i)


class MeetingWorkers(Spinning):
    """Each worker's first sample waits for the other worker's at a barrier."""

    def __init__(self) -> None:
        super().__init__(spin_s=0.0)
        self.barrier = threading.Barrier(2, timeout=30)
        self._met: set[int] = set()

    def __getitem__(self, i: int) -> np.ndarray:
        worker = stoker.get_worker_info().id
        if worker not in self._met:
            self._met.add(worker)
            self.barrier.wait()  # BrokenBarrierError after 30 s if a worker never comes
        return super().__getitem__(i)


def expected() -> list[list[int]]:
    return [list(range(b, b + BATCH)) for b in range(0, N, BATCH)]


def rows(batches: list) -> list[list[int]]:
    return [b[:, 0].tolist() for b in batches]


def hold(monkeypatch: pytest.MonkeyPatch, **settings: float) -> None:
    monkeypatch.setattr(multi_worker, "HeadStart", functools.partial(HeadStart, **settings))


@pytest.mark.parametrize("persistent", [False, True], ids=["fresh", "persistent"])
def test_the_first_batch_is_made_before_any_other_starts(
    monkeypatch: pytest.MonkeyPatch, persistent: bool
) -> None:
    # only an answer ends the head start here (a busy share of 0 never reads as waiting), so
    # the order does not depend on how loaded the machine is
    hold(monkeypatch, busy_share=0.0, limit_s=60.0)
    dataset = Spinning()
    loader = stoker.DataLoader(
        dataset,
        batch_size=BATCH,
        num_workers=2,
        worker_mode="thread",
        persistent_workers=persistent,
    )
    for epoch in range(2):
        dataset.events.clear()
        assert rows(list(loader)) == expected(), epoch
        first_batch_done = dataset.events.index(("end", BATCH - 1, 0))
        later_starts = [
            k for k, (what, i, _) in enumerate(dataset.events) if what == "start" and i >= BATCH
        ]
        assert min(later_starts) > first_batch_done, dataset.events[: first_batch_done + 3]
        assert {w for _, _, w in dataset.events} == {0, 1}  # then both workers load


def test_a_worker_that_waits_for_the_others_releases_them(monkeypatch: pytest.MonkeyPatch) -> None:
    # the first worker waits at a barrier for the second: its thread stops using the CPU,
    # which ends the head start long before its 60 s limit (the barrier breaks after 30 s)
    hold(monkeypatch, limit_s=60.0)
    loader = stoker.DataLoader(
        MeetingWorkers(), batch_size=BATCH, num_workers=2, worker_mode="thread"
    )
    began = time.monotonic()
    assert rows(list(loader)) == expected()
    assert time.monotonic() - began < 30


def test_a_worker_that_waits_for_the_others_is_released_by_default_settings() -> None:
    loader = stoker.DataLoader(
        MeetingWorkers(), batch_size=BATCH, num_workers=2, worker_mode="thread"
    )
    assert rows(list(loader)) == expected()


def test_thread_workers_report_their_cpu_time() -> None:
    loader = stoker.DataLoader(
        Spinning(0.01), batch_size=BATCH, num_workers=2, worker_mode="thread",
        persistent_workers=True,
    )  # fmt: skip
    assert rows(list(loader)) == expected()
    pool = loader._pool
    used = [pool.cpu_s(w) for w in range(2)]
    # each spun for 40 ms or more of wall time, sharing the GIL and maybe the CPUs with other
    # jobs: some of it on a CPU, and less than the whole process (a thread's clock, not the
    # process's)
    assert all(s is not None and 0.001 < s < time.process_time() for s in used), used
    loader._pool.shutdown()


class Clock:
    """A test clock, and a thread's CPU seconds that advance as told."""

    def __init__(self) -> None:
        self.now = 0.0
        self.cpu: float | None = 0.0
        self.reads = 0

    def cpu_s(self) -> float | None:
        self.reads += 1
        return self.cpu

    def advance(self, wall_s: float, cpu_s: float) -> None:
        self.now += wall_s
        if self.cpu is not None:
            self.cpu += cpu_s


def head(clock: Clock, **settings: float) -> HeadStart:
    return HeadStart(clock.cpu_s, clock=lambda: clock.now, **settings)


def test_a_busy_thread_keeps_the_head_start_until_its_limit() -> None:
    clock = Clock()
    start = head(clock, limit_s=0.1, interval_s=0.01)
    for _ in range(9):
        clock.advance(0.01, 0.009)
        assert not start.over()
    clock.advance(0.011, 0.011)
    assert start.over()


def test_a_waiting_thread_ends_the_head_start() -> None:
    clock = Clock()
    start = head(clock, limit_s=10.0, interval_s=0.01, busy_share=0.5)
    clock.advance(0.01, 0.01)
    assert not start.over()
    clock.advance(0.01, 0.004)  # 40% of a CPU: waiting for something
    assert start.over()


def test_the_thread_is_looked_at_no_more_often_than_the_interval() -> None:
    clock = Clock()
    start = head(clock, limit_s=10.0, interval_s=0.05)
    reads = clock.reads
    clock.advance(0.01, 0.0)  # idle, but too short an interval to judge
    assert not start.over() and clock.reads == reads
    assert start.wait_s() == pytest.approx(0.05)
    clock.advance(0.05, 0.0)
    assert start.over() and clock.reads == reads + 1


def test_without_a_cpu_clock_only_the_limit_ends_it() -> None:
    clock = Clock()
    clock.cpu = None
    start = head(clock, limit_s=0.05, interval_s=0.01)
    for _ in range(4):
        clock.advance(0.01, 0.0)
        assert not start.over()
    assert start.wait_s() == pytest.approx(0.01)
    clock.advance(0.01, 0.0)
    assert start.over() and start.wait_s() == 0.0


class Sleeping:
    """Thread-safe; each sample waits without the GIL, draws from sample_rng and notes which
    thread loaded it, under which worker's info."""

    thread_safe = True

    def __init__(self, bad: int | None = None) -> None:
        self.bad = bad
        self.loaded: dict[int, tuple[str, int]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> np.ndarray:
        time.sleep(0.01)  # I/O: the GIL is free for the other thread
        if i == self.bad:
            raise ValueError(f"cannot decode file_{i}.jpg")
        info = stoker.get_worker_info()
        with self._lock:
            self.loaded[i] = (threading.current_thread().name, -1 if info is None else info.id)
        return np.array([i, int(stoker.sample_rng().integers(1 << 30))])


def helper_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if "-helper" in t.name]


@pytest.mark.parametrize("persistent", [False, True], ids=["fresh", "persistent"])
def test_the_first_batch_is_loaded_by_as_many_threads_as_workers(persistent: bool) -> None:
    # the first task goes out alone, but the pool's other threads are free: its samples are
    # split between them, each drawing what it draws in any other worker or in the trainer
    plain = stoker.DataLoader(Sleeping(), batch_size=8, generator=3)
    reference = [[b.tolist() for b in plain] for _ in range(2)]
    dataset = Sleeping()
    loader = stoker.DataLoader(
        dataset, batch_size=8, num_workers=2, worker_mode="thread", generator=3,
        persistent_workers=persistent,
    )  # fmt: skip
    for epoch in range(2):
        dataset.loaded.clear()
        assert [b.tolist() for b in loader] == reference[epoch], epoch
        first = [dataset.loaded[i] for i in range(8)]
        assert len({name for name, _ in first}) == 2, first  # two threads at once
        assert {worker for _, worker in first} == {0}, first  # both as worker 0
        later = [dataset.loaded[i] for i in range(8, N)]
        assert {worker for _, worker in later} == {0, 1}, later  # then both workers load
    loader.close()
    assert helper_threads() == []


def test_an_error_in_the_second_half_of_the_first_batch_names_its_index() -> None:
    loader = stoker.DataLoader(Sleeping(bad=6), batch_size=8, num_workers=2, worker_mode="thread")
    with pytest.raises(ValueError, match=r"cannot decode file_6\.jpg") as info:
        list(loader)
    notes = "\n".join(getattr(info.value, "__notes__", ()))
    assert "stoker: raised by dataset[6] (Sleeping) while loading batch 0, dataset indices" in notes
    loader.close()
    assert helper_threads() == []


def test_the_first_failing_sample_of_the_first_batch_is_the_one_raised() -> None:
    # both halves fail: the error raised is the first half's, whichever thread failed first
    class TwoBad(Sleeping):
        def __getitem__(self, i: int) -> np.ndarray:
            if i in (1, 5):
                time.sleep(0.05 if i == 1 else 0.0)  # the later sample fails first
                raise ValueError(f"cannot decode file_{i}.jpg")
            return super().__getitem__(i)

    loader = stoker.DataLoader(TwoBad(), batch_size=8, num_workers=2, worker_mode="thread")
    with pytest.raises(ValueError, match=r"cannot decode file_1\.jpg"):
        next(iter(loader))
    loader.close()
