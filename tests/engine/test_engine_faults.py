"""Faults inside workers, done for real: exceptions, SIGKILL, os._exit, hangs, init errors.

Every test is followed by the leak check of ``conftest.py``.
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from engine.engine_datasets import (
    BlocksFrom,
    BreaksWhenUnpickled,
    Exits,
    Hangs,
    InitFailed,
    NeedsAModuleItCannotFind,
    Raises,
    RaisesUnpicklable,
    SampleBroken,
    Samples,
    collate_unpicklable_at,
    failing_init,
)
from stoker import DataLoader, WorkerError

MODES = ("process", "thread")
_ERROR_WITHIN_S = 10.0  # generous: the engine notices a death at once, a slow CI box may not


def notes(exc: BaseException) -> str:
    return "\n".join(getattr(exc, "__notes__", []))


def drain(
    loader: DataLoader, catch: type[BaseException]
) -> tuple[list[list[int]], list[BaseException]]:
    """Iterates to the end, collecting batches and the errors raised on the way."""
    batches, errors = [], []
    it = iter(loader)
    while True:
        try:
            batch = next(it)
        except StopIteration:
            return batches, errors
        except catch as exc:
            errors.append(exc)
            continue
        batches.append(batch[0].tolist())


# ------------------------------------------------------------- exceptions in the dataset


@pytest.mark.parametrize("in_order", [True, False], ids=["in_order", "as_ready"])
@pytest.mark.parametrize("mode", MODES)
def test_dataset_exception_arrives_with_its_type_and_the_worker_story(
    mode: str, in_order: bool
) -> None:
    loader = DataLoader(
        Raises(20, bad=9), batch_size=2, num_workers=2, worker_mode=mode, in_order=in_order
    )
    batches, errors = drain(loader, SampleBroken)
    assert len(errors) == 1
    error = errors[0]
    assert type(error) is SampleBroken
    worker = int(re.search(r"raised by worker (\d)", str(error)).group(1))
    text = notes(error)
    assert f"stoker worker {worker}" in text  # the worker that really raised it
    assert "indices [8, 9]" in text
    assert "Worker traceback" in text and "in __getitem__" in text and "raise SampleBroken" in text
    if mode == "process":
        assert re.search(r"\(pid \d+\)", text)
    expected = [[i, i + 1] for i in range(0, 20, 2) if i != 8]
    assert (
        batches if in_order else sorted(batches)
    ) == expected  # the epoch went on after the error


@pytest.mark.parametrize("mode", MODES)
def test_exception_that_cannot_be_rebuilt_becomes_a_worker_error(mode: str) -> None:
    loader = DataLoader(RaisesUnpicklable(6), batch_size=2, num_workers=2, worker_mode=mode)
    it = iter(loader)
    with pytest.raises(WorkerError, match=r"NeedsKeyword: cannot rebuild me: sample 1") as excinfo:
        next(it)
    assert "indices [0, 1]" in notes(excinfo.value) and "in __getitem__" in notes(excinfo.value)
    assert [b[0].tolist() for b in it] == [[2, 3], [4, 5]]


@pytest.mark.parametrize("mode", MODES)
def test_worker_init_fn_error_reaches_the_trainer(mode: str) -> None:
    loader = DataLoader(
        Samples(10), batch_size=2, num_workers=2, worker_mode=mode, worker_init_fn=failing_init
    )
    with pytest.raises(InitFailed, match=r"worker_init_fn refuses to start worker 1") as excinfo:
        list(loader)
    text = notes(excinfo.value)
    assert "stoker worker 1" in text and "in worker_init_fn" in text
    assert "in failing_init" in text  # the worker's traceback


# ------------------------------------------------------------- dead workers


def test_sigkilled_worker_is_reported_with_pid_cause_and_indices(tmp_path) -> None:
    release = tmp_path / "release"  # never created: indices >= 4 stay in flight until the kill
    loader = DataLoader(BlocksFrom(40, 4, str(release)), batch_size=2, num_workers=1)
    it = iter(loader)
    first = next(it)
    assert first[0].tolist() == [0, 1]
    pid = int(first[1][0])
    assert pid != os.getpid()
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    with pytest.raises(WorkerError) as excinfo:
        for _ in range(2):  # [2, 3] may already be waiting to be delivered
            next(it)
    elapsed = time.monotonic() - killed_at
    text = str(excinfo.value)
    assert f"(pid {pid})" in text and "SIGKILL" in text and "out-of-memory" in text
    assert "[4, 5]" in text  # the batch it was loading when it died
    assert "on_worker_death='restart'" in text  # says how to survive it
    assert elapsed < _ERROR_WITHIN_S, f"the death was reported after {elapsed:.1f} s"
    with pytest.raises(StopIteration):
        next(it)  # the epoch is over, not stuck


@pytest.mark.parametrize("in_order", [True, False], ids=["in_order", "as_ready"])
def test_restart_replaces_a_sigkilled_worker_and_delivers_every_index_once(
    in_order: bool, tmp_path
) -> None:
    release = tmp_path / "release"
    loader = DataLoader(
        BlocksFrom(40, 4, str(release)),
        batch_size=2,
        num_workers=2,
        in_order=in_order,
        on_worker_death="restart",
    )
    it = iter(loader)
    first = next(it)
    victim = int(first[1][0])
    os.kill(victim, signal.SIGKILL)
    release.touch()
    with pytest.warns(
        RuntimeWarning, match=rf"\(pid {victim}\) was killed by SIGKILL .*started a replacement"
    ):
        rest = list(it)
    batches = [first[0].tolist()] + [b[0].tolist() for b in rest]
    indices = [i for b in batches for i in b]
    assert sorted(indices) == list(range(40))  # every index exactly once
    if in_order:
        assert indices == list(range(40))
    assert (
        len({int(p) for b in rest for p in b[1]} - {victim}) == 2
    )  # the survivor and the replacement


def test_worker_calling_os_exit_is_reported_with_its_status() -> None:
    loader = DataLoader(Exits(20, bad=5, status=3), batch_size=2, num_workers=2)
    with pytest.raises(WorkerError, match=r"exited with status 3") as excinfo:
        list(loader)
    assert "[4, 5]" in str(excinfo.value)


# ------------------------------------------------------------- hangs


@pytest.mark.parametrize("mode", MODES)
def test_hanging_worker_times_out_with_its_stack(mode: str, tmp_path) -> None:
    # A thread cannot be killed: its hang ends when the test creates the release file.
    release = str(tmp_path / "release") if mode == "thread" else None
    loader = DataLoader(
        Hangs(10, bad=4, release_path=release),
        batch_size=2,
        num_workers=2,
        worker_mode=mode,
        timeout=1,
    )
    it = iter(loader)
    assert [next(it)[0].tolist() for _ in range(2)] == [[0, 1], [2, 3]]
    started = time.monotonic()
    try:
        with pytest.raises(WorkerError) as excinfo:
            next(it)
    finally:
        if release is not None:
            open(release, "w").close()
    elapsed = time.monotonic() - started
    text = str(excinfo.value)
    assert "DataLoader timed out after 1 seconds waiting for" in text and "indices [4, 5]" in text
    assert "sleep_forever_in_dataset" in text and "__getitem__" in text  # the worker's stack
    assert "pid None" not in text
    if mode == "process":
        assert re.search(r"from worker \d \(pid \d+\)", text)
    assert elapsed < _ERROR_WITHIN_S


def refuse_batches_with_seven(samples: list) -> list:
    """A collate_fn that fails on one batch."""
    if any(sample[0] == 7 for sample in samples):
        raise ZeroDivisionError("collate_fn cannot divide sample 7")
    return [sample[0] for sample in samples]


@pytest.mark.parametrize("mode", MODES)
def test_collate_fn_exception_arrives_like_a_dataset_exception(mode: str) -> None:
    loader = DataLoader(
        Samples(10),
        batch_size=2,
        num_workers=2,
        worker_mode=mode,
        collate_fn=refuse_batches_with_seven,
    )
    it = iter(loader)
    assert [next(it) for _ in range(3)] == [[0, 1], [2, 3], [4, 5]]
    with pytest.raises(ZeroDivisionError, match="cannot divide sample 7") as excinfo:
        next(it)
    assert "indices [6, 7]" in notes(excinfo.value)
    assert "in refuse_batches_with_seven" in notes(excinfo.value)
    assert list(it) == [[8, 9]]


@pytest.mark.parametrize("policy", ["raise", "restart"])
def test_persistent_loader_survives_a_worker_killed_between_epochs(policy: str) -> None:
    loader = DataLoader(
        Samples(20), batch_size=2, num_workers=2, persistent_workers=True, on_worker_death=policy
    )
    first_pids = {int(p) for b in loader for p in b[1]}
    victim = min(first_pids)
    os.kill(victim, signal.SIGKILL)
    if policy == "raise":
        with pytest.raises(WorkerError, match=rf"\(pid {victim}\) was killed by SIGKILL"):
            list(loader)
        # the broken pool was shut down: the next epoch starts fresh workers
        batches = list(loader)
        assert {int(p) for b in batches for p in b[1]}.isdisjoint(first_pids)
    else:
        with pytest.warns(RuntimeWarning, match=rf"\(pid {victim}\) was killed by SIGKILL"):
            batches = list(loader)
        assert victim not in {int(p) for b in batches for p in b[1]}
    assert [b[0].tolist() for b in batches] == [[i, i + 1] for i in range(0, 20, 2)]
    loader.close()


# ------------------------------------------------------------- failures outside the fetch


@pytest.mark.parametrize("policy", ["raise", "restart"])
def test_a_batch_that_cannot_be_pickled_is_that_batchs_error_not_a_dead_worker(policy: str) -> None:
    """The worker encodes its answer outside the dataset's guarded region; a batch pickle
    refuses used to kill the worker (four of them, with restart) and blame os._exit."""
    loader = DataLoader(
        Samples(12), batch_size=2, num_workers=2, collate_fn=collate_unpicklable_at(5), on_worker_death=policy
    )
    it = iter(loader)
    got = [next(it) for _ in range(2)]
    with pytest.raises(TypeError) as excinfo:
        next(it)
    assert str(excinfo.value) == "cannot pickle '_thread.lock' object"
    assert "stoker could not send this batch to the trainer: a process worker pickles what collate_fn returns" in notes(excinfo.value)
    assert "while loading indices [4, 5]" in notes(excinfo.value)
    rest = list(it)  # the workers are alive: the epoch goes on
    assert got + rest == [[0, 1], [2, 3], [6, 7], [8, 9], [10, 11]]


def test_a_worker_that_cannot_start_says_why() -> None:
    loader = DataLoader(BreaksWhenUnpickled(8), batch_size=2, num_workers=2, multiprocessing_context="spawn")
    with pytest.raises(NeedsAModuleItCannotFind) as excinfo:
        next(iter(loader))
    assert str(excinfo.value) == "this dataset of 8 samples cannot be rebuilt in a worker"
    text = notes(excinfo.value)
    assert "while the worker was starting (receiving the dataset, collate_fn and worker_init_fn)" in text
    assert "os._exit" not in text


def test_a_worker_killed_by_sigbus_hears_both_causes(tmp_path) -> None:
    """A mapped file that shrinks under a worker kills it with SIGBUS, like a full /dev/shm."""
    from engine.engine_datasets import MappedPages

    path = tmp_path / "pages.bin"
    path.write_bytes(bytes(range(1, 9)) * 4096)  # 32 KiB: 8 pages, each starting with 1
    loader = DataLoader(MappedPages(str(path), 8), batch_size=1, num_workers=1, prefetch_factor=1)
    it = iter(loader)
    assert next(it).tolist() == [1]  # the worker has mapped the file
    with open(path, "r+b") as f:
        f.truncate(0)  # the file shrinks while it is mapped
    with pytest.raises(WorkerError) as excinfo:
        list(it)
    text = str(excinfo.value)
    assert "was killed by SIGBUS (a bus error: a memory-mapped file was read past its end. Either /dev/shm is full" in text
    assert "or a file the dataset maps (a packed shard, an .npy opened with mmap_mode) shrank or was rewritten" in text
