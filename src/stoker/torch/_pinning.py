"""``pin_memory=True``: batches copied into page-locked memory by one background thread.

The thread pulls a batch from the loader's iterator, copies every CPU tensor of it into
ONE pinned block from torch's caching host allocator, and hands it over through a small
queue, so that ``batch.to(device, non_blocking=True)`` overlaps with compute.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

from stoker._tree import leaves, map_leaves

__all__ = ["PinningIterator", "accelerator_pin_function", "pin_batch"]

_PIN_ALIGN_BYTES = 64  # every tensor carved out of a pinned buffer starts on a cache line
_PIN_POLL_S = 0.1  # how often the pinning thread and its consumer check for a stop
PIN_JOIN_TIMEOUT_S = 10.0  # how long an abandoned iterator waits for its thread to finish a batch


# --------------------------------------------------------------------------- pinning


def _allocate_pinned(nbytes: int) -> Any:
    """``nbytes`` of page-locked host memory from torch's caching host allocator."""
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


def pin_batch(batch: Any, allocate: Callable[[int], Any] = _allocate_pinned) -> Any:
    """Copies every CPU tensor of ``batch`` into ONE pinned buffer; returns the rebuilt batch.

    The buffer comes from torch's caching host allocator
    (``torch.empty(n, dtype=torch.uint8, pin_memory=True)``) and each tensor becomes a
    view of it. When the last view is garbage collected the block goes back to the
    allocator, which reuses it only after the events it recorded for copies still in
    flight have completed: ``tensor.to(device, non_blocking=True)`` records one on the
    view's allocation (torch keys the event by the storage's context, so views carved
    out of a block are covered). Reuse is therefore safe without any synchronisation
    here. Objects that are not tensors but have a ``pin_memory()`` method are pinned
    with it, as torch does; everything else is returned as it is.

    ``allocate(nbytes)`` returns the 1-D uint8 buffer (tests pass a CPU allocator to
    check the carving where no accelerator exists).
    """
    tensors = {id(t): t for t in leaves(batch) if _carvable(t)}
    views: dict[int, Any] = {}
    if tensors:
        sizes = {key: t.numel() * t.element_size() for key, t in tensors.items()}
        total = 0
        offsets = {}
        for key, nbytes in sizes.items():
            offsets[key] = total
            total += -(-nbytes // _PIN_ALIGN_BYTES) * _PIN_ALIGN_BYTES
        buffer = allocate(max(total, 1))
        with torch.no_grad():
            for key, t in tensors.items():
                start = offsets[key]
                view = buffer[start : start + sizes[key]].view(t.dtype).view(t.shape)
                view.copy_(t)
                views[key] = view
    return _replace_pinned(batch, views)


def _carvable(t: Any) -> bool:
    """A plain, dense CPU tensor not pinned yet: one that is copied into the batch's block."""
    return (
        type(t) is torch.Tensor
        and t.layout == torch.strided
        and t.device.type == "cpu"
        and not t.is_quantized
        and not t.is_pinned()
    )


def _replace_pinned(data: Any, views: dict[int, Any]) -> Any:
    return map_leaves(data, lambda leaf: _pinned_leaf(leaf, views))


def _pinned_leaf(leaf: Any, views: dict[int, Any]) -> Any:
    if isinstance(leaf, torch.Tensor):
        view = views.get(id(leaf))
        if view is not None:
            return view
        if leaf.device.type == "cpu" and not leaf.is_pinned():
            return leaf.pin_memory()  # sparse, quantized or subclassed: torch's own way
        return leaf
    if hasattr(leaf, "pin_memory"):  # a custom batch type, as torch allows
        return leaf.pin_memory()
    return leaf


def accelerator_pin_function() -> tuple[Callable[[Any], Any], Callable[[], None]] | str:
    """``(pin, setup)`` for the current accelerator, or why batches cannot be pinned.

    ``setup`` runs first in the pinning thread: it makes the thread use the caller's
    device and one CPU thread for the copies (as torch's pin thread does; the thread
    count is per thread in torch, so the training thread keeps its own).
    """
    accelerator = (
        torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    )
    if accelerator is None:
        return "no accelerator is available"
    if accelerator.type == "mps":  # torch's loader does not pin for MPS either
        return "pinned memory is not supported on MPS"
    device_index = torch.accelerator.current_device_index()

    def setup() -> None:
        torch.set_num_threads(1)
        torch.accelerator.set_device_index(device_index)

    return pin_batch, setup


class _End:
    """The stream ended (a sentinel type, so it cannot be confused with a batch)."""


class _Failure:
    """An exception on its way to the consumer; ``pulled``: it replaces a pulled batch."""

    __slots__ = ("error", "pulled")

    def __init__(self, error: BaseException, *, pulled: bool = False) -> None:
        self.error = error
        self.pulled = pulled


class _Pulls:
    """How many batches the thread took from the source; the lock is held while it pulls."""

    __slots__ = ("count", "lock")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = 0


def _offer(out: queue.Queue[Any], item: Any, stop: threading.Event) -> bool:
    """Puts ``item`` into the bounded queue; gives up (False) once ``stop`` is set."""
    while not stop.is_set():
        try:
            out.put(item, timeout=_PIN_POLL_S)
            return True
        except queue.Full:
            continue
    return False


class _Pulled:
    __slots__ = ("batch",)

    def __init__(self, batch: Any) -> None:
        self.batch = batch


def _pull(source: Iterator[Any], pulls: _Pulls) -> _Pulled | _End | _Failure:
    """The next batch of ``source``, its end or its exception; counted under the pull lock.

    The lock is never held while waiting for the consumer, so a consumer that holds
    the thread (``PinningIterator.paused``) cannot deadlock with it.
    """
    with pulls.lock:
        try:
            batch = next(source)
        except StopIteration:
            return _End()
        except BaseException as exc:  # travels to the consumer, re-raised there
            return _Failure(exc)
        pulls.count += 1
        return _Pulled(batch)


def _pin_loop(
    source: Iterator[Any],
    pin: Callable[[Any], Any],
    setup: Callable[[], None] | None,
    out: queue.Queue[Any],
    stop: threading.Event,
    pulls: _Pulls,
) -> None:
    """The pinning thread: pull, pin, hand over, in order, until the end or a stop.

    Exceptions from ``source`` or ``pin`` travel to the consumer as values and are
    re-raised there with their type; the thread then goes on with the next batch (a
    stoker iterator stays usable after a batch fails). The thread closes ``source``
    itself when it leaves, so ``source`` is only ever touched from this thread.
    """
    try:
        if setup is not None:
            setup()
        while not stop.is_set():
            item: Any = _pull(source, pulls)
            if isinstance(item, _Pulled):
                try:
                    item = pin(item.batch)
                except BaseException as exc:
                    item = _Failure(exc, pulled=True)
            if not _offer(out, item, stop) or isinstance(item, _End):
                return
            del item  # hold no batch while waiting for the next one
    except BaseException as exc:  # setup failed: the consumer sees it at its next()
        _offer(out, _Failure(exc), stop)
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            try:
                close()
            except Exception as exc:  # the consumer may still be listening
                _offer(out, _Failure(exc), stop)


def _stop_thread(
    stop: threading.Event, thread: threading.Thread, out: queue.Queue[Any], wait_s: float | None
) -> None:
    """Stops a pinning thread: the one shutdown path (close, garbage collection, exit)."""
    stop.set()
    while True:  # drop pinned batches nobody will take, so their memory returns now
        try:
            out.get_nowait()
        except queue.Empty:
            break
    if thread is not threading.current_thread() and thread.ident is not None:
        thread.join(wait_s)


class PinningIterator:
    """Hands over the batches of ``source`` after ``pin`` ran on them in ONE background thread.

    The thread pulls a batch from ``source``, pins it and puts it into a queue of at
    most ``maxsize`` batches, so pinning (and loading, when ``source`` loads in the
    calling thread) overlaps with the consumer's compute. Order is preserved.

    Shutdown: :meth:`close`, exhaustion, garbage collection of the iterator (a
    ``weakref.finalize``) and interpreter exit all run :func:`_stop_thread`. The thread
    is a daemon and never references this object, so abandoning the iterator is enough.

    ``pin`` is chosen by the caller: the accelerator path passes :func:`pin_batch`;
    the CPU tests drive the same machinery with a plain copy function.

    ``lazy``: the thread starts at the first ``next()``, after the calling thread has
    run ``source.start()`` (when the source has one: a loader's epoch, whose workers
    must be started by the trainer's thread, not by this short-lived one).
    """

    def __init__(
        self,
        source: Iterator[Any],
        pin: Callable[[Any], Any],
        *,
        maxsize: int,
        setup: Callable[[], None] | None = None,
        length: int | None = None,
        lazy: bool = False,
    ) -> None:
        if not isinstance(maxsize, int) or maxsize < 1:
            raise AssertionError(f"the pin queue needs room for a batch, got maxsize={maxsize!r}")
        self._queue: queue.Queue[Any] = queue.Queue(maxsize)
        self._stop = threading.Event()
        self._length = length
        self._done = False
        self.ended = False  # the consumer received the source's StopIteration
        self._pulls = _Pulls()
        self._delivered = 0
        self._thread = threading.Thread(
            target=_pin_loop,
            args=(source, pin, setup, self._queue, self._stop, self._pulls),
            name="stoker-pin-memory",
            daemon=True,
        )
        self._source = source
        self._finalizer = weakref.finalize(
            self, _stop_thread, self._stop, self._thread, self._queue, PIN_JOIN_TIMEOUT_S
        )
        if not lazy:
            self._thread.start()

    def __iter__(self) -> PinningIterator:
        return self

    def __len__(self) -> int:
        if self._length is None:
            raise TypeError("this iterator's source has no length")
        return self._length

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        if self._thread.ident is None:
            start = getattr(self._source, "start", None)
            if callable(start):
                start()
            self._thread.start()
        while True:
            try:
                item = self._queue.get(timeout=_PIN_POLL_S)
                break
            except queue.Empty:
                if self._thread.is_alive():
                    continue
                try:  # the thread may have put its last item just before exiting
                    item = self._queue.get_nowait()
                    break
                except queue.Empty:
                    self.close()
                    if self._stop.is_set():
                        raise StopIteration from None
                    raise AssertionError(
                        "the pinning thread exited without ending the stream"
                    ) from None
        if isinstance(item, _End):
            self.ended = True
            self.close()
            raise StopIteration
        if isinstance(item, _Failure):
            self._delivered += item.pulled
            raise item.error
        self._delivered += 1
        return item

    @property
    def read_ahead(self) -> int:
        """The most batches it holds undelivered: its queue's, and one being pinned."""
        return self._queue.maxsize + 1

    @property
    def started(self) -> bool:
        """Whether the thread has started (at the first ``next()``, when lazy)."""
        return self._thread.ident is not None

    @contextlib.contextmanager
    def paused(self) -> Iterator[int]:
        """Holds the thread between two pulls; yields how many pulled batches are not delivered.

        While paused, the source's own progress counts exactly the pulled batches, so
        the loader's ``state_dict`` can subtract the ones still waiting here.
        """
        with self._pulls.lock:
            yield self._pulls.count - self._delivered

    def close(self, *, wait_s: float | None = PIN_JOIN_TIMEOUT_S) -> None:
        """Stops the thread (it closes the source); safe to call twice.

        Args:
            wait_s: how long to wait for the thread to finish the batch it is loading
                (``None``: until it has).
        """
        self._done = True
        if self._finalizer.detach() is not None:
            _stop_thread(self._stop, self._thread, self._queue, wait_s)
            if self._thread.ident is None:  # never started: the source is still ours to close
                close = getattr(self._source, "close", None)
                if callable(close):
                    close()
