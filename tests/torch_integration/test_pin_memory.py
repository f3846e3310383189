"""pin_memory=True: the pinning thread, the carving of one pinned block per batch, shutdown.

There is no accelerator on the CI machines, and without one torch cannot allocate pinned
memory. So most tests drive the real machinery (``_PinningIterator``, ``_pin_batch``, the
loader's wiring) with a plain CPU copy in place of the pinned allocation: ordering, error
propagation, back-pressure and shutdown are the same code either way. The tests marked
``accelerator`` run the real pinning and are skipped without an accelerator.
"""

from __future__ import annotations

import functools
import gc
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="pin_memory belongs to stoker.torch, which needs torch")
from stoker.torch import DataLoader
from stoker.torch import _loader as stoker_torch_loader
from stoker.torch._pinning import PinningIterator as _PinningIterator
from stoker.torch._pinning import pin_batch as _pin_batch

_SETTLE_S = 5.0
accelerator = pytest.mark.skipif(
    not torch.accelerator.is_available(),
    reason="real pinning needs an accelerator (CUDA, XPU, ...)",
)


def pin_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "stoker-pin-memory"]


@pytest.fixture(autouse=True)
def no_pin_thread_left() -> object:
    """Fails the test if a pinning thread outlives it (after garbage collection)."""
    yield
    gc.collect()
    deadline = time.monotonic() + _SETTLE_S
    while pin_threads() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not pin_threads(), f"pinning threads left behind: {pin_threads()}"


def cpu_buffer(nbytes: int):
    return torch.empty(nbytes, dtype=torch.uint8)


cpu_pin = functools.partial(_pin_batch, allocate=cpu_buffer)


class Source:
    """An iterator that records what was pulled, can fail at given positions, and be closed."""

    def __init__(self, n: int | None, fail_at: tuple[int, ...] = (), delay_s: float = 0.0) -> None:
        self.n, self.fail_at, self.delay_s = n, fail_at, delay_s
        self.pulled = 0
        self.closed = threading.Event()
        self.threads: set[str] = set()

    def __iter__(self):
        return self

    def __next__(self):
        self.threads.add(threading.current_thread().name)
        if self.n is not None and self.pulled >= self.n:
            raise StopIteration
        i = self.pulled
        self.pulled += 1
        if self.delay_s:
            time.sleep(self.delay_s)
        if i in self.fail_at:
            raise KeyError(f"bad item {i}")
        return {"i": torch.tensor([i]), "x": torch.full((2, 3), float(i))}

    def close(self) -> None:
        self.closed.set()


# ------------------------------------------------------------------ the thread machinery


def test_batches_arrive_in_order_pinned_by_the_background_thread() -> None:
    source = Source(20)
    it = _PinningIterator(source, cpu_pin, maxsize=2, length=20)
    assert len(it) == 20
    got = [int(b["i"]) for b in it]
    assert got == list(range(20))
    assert source.threads == {"stoker-pin-memory"}  # the consumer never touched the source
    assert source.closed.wait(_SETTLE_S)
    with pytest.raises(StopIteration):
        next(it)


def test_an_exception_reaches_the_consumer_with_its_type_and_the_stream_goes_on() -> None:
    it = _PinningIterator(Source(6, fail_at=(2, 4)), cpu_pin, maxsize=2)
    got: list[object] = []
    while True:
        try:
            got.append(int(next(it)["i"]))
        except KeyError as exc:
            got.append(str(exc))
        except StopIteration:
            break
    assert got == [0, 1, "'bad item 2'", 3, "'bad item 4'", 5]


def test_an_exception_in_the_pin_step_reaches_the_consumer() -> None:
    def pin(batch):
        if int(batch["i"]) == 1:
            raise MemoryError("cannot pin batch 1")
        return batch

    it = _PinningIterator(Source(3), pin, maxsize=1)
    assert int(next(it)["i"]) == 0
    with pytest.raises(MemoryError, match="cannot pin batch 1"):
        next(it)
    assert int(next(it)["i"]) == 2


def test_a_failing_setup_is_raised_by_the_first_next() -> None:
    def setup() -> None:
        raise RuntimeError("no such device")

    source = Source(3)
    it = _PinningIterator(source, cpu_pin, maxsize=1, setup=setup)
    with pytest.raises(RuntimeError, match="no such device"):
        next(it)
    assert source.pulled == 0
    assert source.closed.wait(_SETTLE_S)


def test_read_ahead_is_bounded_by_the_queue() -> None:
    source = Source(None)  # endless
    it = _PinningIterator(source, cpu_pin, maxsize=3)
    next(it)
    time.sleep(0.3)
    # one handed over, three waiting in the queue, one held by the blocked put
    assert source.pulled <= 1 + 3 + 1
    it.close()
    assert source.closed.wait(_SETTLE_S)


def test_an_abandoned_iterator_stops_its_thread_and_closes_the_source() -> None:
    source = Source(None)
    it = _PinningIterator(source, cpu_pin, maxsize=2)
    next(it)
    next(it)
    del it
    gc.collect()
    assert source.closed.wait(_SETTLE_S)  # the fixture checks the thread is gone


def test_close_is_idempotent_and_ends_the_stream() -> None:
    source = Source(None, delay_s=0.01)
    it = _PinningIterator(source, cpu_pin, maxsize=2)
    next(it)
    it.close()
    it.close()
    with pytest.raises(StopIteration):
        next(it)
    assert source.closed.is_set()


def test_interpreter_exit_with_a_live_pinning_thread_is_clean() -> None:
    script = textwrap.dedent(
        """
        import itertools, sys, torch
        from stoker.torch._pinning import PinningIterator as _PinningIterator
        def forever():
            for i in itertools.count():
                yield torch.full((4,), i)
        it = _PinningIterator(forever(), lambda b: b.clone(), maxsize=2)
        assert next(it)[0].item() == 0
        print("exiting", flush=True)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "exiting"
    assert "Traceback" not in done.stderr and "Exception" not in done.stderr, done.stderr


# ------------------------------------------------------------------ carving one block per batch


class Pinnable:
    """A custom batch type with its own pin_memory(), which torch calls too."""

    def __init__(self) -> None:
        self.pinned = False

    def pin_memory(self) -> Pinnable:
        out = Pinnable()
        out.pinned = True
        return out


def test_every_tensor_of_a_batch_is_a_view_of_one_aligned_block() -> None:
    base = torch.arange(24, dtype=torch.float64).reshape(4, 6)
    shared = torch.tensor([7, 8, 9], dtype=torch.int8)
    batch = {
        "half": torch.ones(3, dtype=torch.float16),
        "flags": torch.tensor([True, False, True]),
        "complex": torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex128),
        "big": torch.tensor([2**64 - 1], dtype=torch.uint64),
        "strided": base[:, ::2],  # not contiguous
        "empty": torch.empty(0, 5),
        "same": (shared, shared),
        "names": ["a", "b"],
        "custom": Pinnable(),
        "number": 3,
    }
    out = cpu_pin(batch)
    tensors = [
        out["half"],
        out["flags"],
        out["complex"],
        out["big"],
        out["strided"],
        out["same"][0],
    ]
    block = tensors[0].untyped_storage().data_ptr()
    for t in tensors:
        assert t.untyped_storage().data_ptr() == block, "each batch gets exactly one block"
        assert (t.data_ptr() - block) % 64 == 0, "tensors start on a 64-byte boundary"
        assert t.is_contiguous()
    for key in ("half", "flags", "complex", "big", "strided", "empty"):
        assert out[key].dtype == batch[key].dtype and torch.equal(out[key], batch[key]), key
    assert out["same"][0] is out["same"][1]  # one tensor, one copy
    assert torch.equal(out["same"][0], shared)
    assert out["names"] == ["a", "b"] and out["number"] == 3
    assert out["custom"].pinned
    assert out["strided"].data_ptr() != base.data_ptr()  # copied, not aliased


# ------------------------------------------------------------------ the loader's wiring


class Rows(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 13

    def __getitem__(self, i: int):
        return {"x": np.full(4, i, dtype=np.float32), "y": i, "name": f"r{i}"}


@pytest.fixture
def cpu_pinning(monkeypatch):
    """Makes the loader believe an accelerator exists and pin with plain CPU buffers."""
    monkeypatch.setattr(stoker_torch_loader, "accelerator_pin_function", lambda: (cpu_pin, None))


@pytest.mark.parametrize(
    "loading",
    [{"num_workers": 0}, {"num_workers": 2}, {"num_workers": 2, "worker_mode": "thread"}],
    ids=["main", "process", "thread"],
)
def test_the_loader_pins_in_a_thread_and_yields_the_same_batches(cpu_pinning, loading) -> None:
    plain = list(DataLoader(Rows(), batch_size=4, **loading))
    loader = DataLoader(Rows(), batch_size=4, pin_memory=True, **loading)
    it = iter(loader)
    assert isinstance(it, _PinningIterator) and len(it) == 4
    pinned = list(it)
    assert len(pinned) == len(plain) == 4
    for a, b in zip(pinned, plain, strict=True):
        assert (
            torch.equal(a["x"], b["x"]) and torch.equal(a["y"], b["y"]) and a["name"] == b["name"]
        )
        assert a["x"].untyped_storage().data_ptr() == a["y"].untyped_storage().data_ptr()


def test_a_new_epoch_stops_the_previous_pinning_thread_first(cpu_pinning) -> None:
    loader = DataLoader(
        Rows(), batch_size=2, pin_memory=True, num_workers=2, persistent_workers=True
    )
    first = iter(loader)
    next(first)  # abandon epoch 0 mid-way; the same workers serve epoch 1
    second = list(loader)
    assert len(pin_threads()) == 0
    assert sorted(int(i) for b in second for i in b["y"]) == list(range(13))
    with pytest.raises(StopIteration):
        next(first)
    loader.close()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_state_dict_counts_only_batches_the_loop_received(cpu_pinning, num_workers) -> None:
    """The thread has read ahead when the state is taken; those batches are not lost."""
    expected = [
        b["y"].tolist() for b in DataLoader(Rows(), batch_size=2, shuffle=True, generator=3)
    ]
    loader = DataLoader(
        Rows(), batch_size=2, shuffle=True, generator=3, pin_memory=True, num_workers=num_workers
    )
    it = iter(loader)
    head = [next(it)["y"].tolist() for _ in range(2)]
    deadline = time.monotonic() + _SETTLE_S
    while it._queue.qsize() < 2 and time.monotonic() < deadline:  # let it read ahead
        time.sleep(0.01)
    assert it._queue.qsize() == 2
    state = loader.state_dict()
    assert state["batches"] == 2
    assert [b["y"].tolist() for b in it] == expected[2:]  # the iterator itself is undisturbed
    resumed = DataLoader(Rows(), batch_size=2, shuffle=True, generator=3, pin_memory=True)
    resumed.load_state_dict(state)
    assert head + [b["y"].tolist() for b in resumed] == expected
    loader.close()


def test_close_stops_the_pinning_thread(cpu_pinning) -> None:
    loader = DataLoader(Rows(), batch_size=2, pin_memory=True)
    it = iter(loader)
    next(it)
    assert len(pin_threads()) == 1
    loader.close()
    assert pin_threads() == []


def test_mps_is_named_in_the_notice_and_not_pinned(monkeypatch) -> None:
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda: torch.device("mps"))
    loader = DataLoader(Rows(), batch_size=5, pin_memory=True)
    with pytest.warns(UserWarning, match=r"pin_memory=True: pinned memory is not supported on MPS"):
        batches = list(loader)
    assert len(batches) == 3 and pin_threads() == []


# ------------------------------------------------------------------ with an accelerator


@accelerator
@pytest.mark.parametrize("num_workers", [0, 2])
def test_batches_are_pinned_and_copy_to_the_device_without_blocking(num_workers) -> None:
    device = torch.accelerator.current_accelerator()
    loader = DataLoader(Rows(), batch_size=4, pin_memory=True, num_workers=num_workers)
    for _epoch in range(3):  # later epochs reuse the blocks the first ones freed
        total = torch.zeros((), device=device)
        for batch in loader:
            assert batch["x"].is_pinned() and batch["y"].is_pinned()
            x = batch["x"].to(device, non_blocking=True)
            y = batch["y"].to(device, non_blocking=True)
            total += x.sum() + y.sum()
            del batch  # the block returns to the allocator while the copies may still run
        expected = sum(4 * i + i for i in range(13))
        assert total.item() == expected


@accelerator
def test_real_pinning_keeps_every_value() -> None:
    batch = {"a": torch.arange(1000, dtype=torch.int64), "b": torch.rand(3, 5)[:, ::2], "s": "x"}
    out = _pin_batch(batch)
    assert out["a"].is_pinned() and out["b"].is_pinned() and out["s"] == "x"
    assert torch.equal(out["a"], batch["a"]) and torch.equal(out["b"], batch["b"])
