"""``stoker.torch``: a drop-in replacement for ``torch.utils.data.DataLoader``.

This is the one stoker module that imports torch. Change one import in a training
script::

    from stoker.torch import DataLoader  # was: from torch.utils.data import DataLoader

and the loop gets torch batches, value for value and type for type the batches torch's
loader yields (see :class:`DataLoader` for the few documented differences), from
stoker's engine: workers write batches into shared memory and every numpy array
becomes a tensor over that memory with ``torch.from_numpy`` (no copy).

Randomness follows torch's: with ``generator=None`` the loader's base seed, from which
every epoch's shuffle, worker seeds and augmentation seeds derive, is drawn from torch's
global generator when the loader is built, so ``torch.manual_seed(0)`` at the top of the
script makes the run reproducible, as it does with torch.

``pin_memory=True`` pins in one background thread; see :class:`DataLoader`.
"""

from __future__ import annotations

import collections.abc
import contextlib
import copy
import queue
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import numpy as np
import torch

from stoker.collate import default_collate
from stoker.loader import DataLoader as _CoreDataLoader

__all__ = ["DataLoader"]

T = TypeVar("T")

# The dtypes torch.from_numpy accepts (torch/csrc/utils/tensor_numpy.cpp).
_TORCH_DTYPES = frozenset(
    np.dtype(name)
    for name in (
        "float64", "float32", "float16", "complex64", "complex128", "int64", "int32",
        "int16", "int8", "uint64", "uint32", "uint16", "uint8", "bool",
    )
)  # fmt: skip
_PIN_ALIGN_BYTES = 64  # every tensor carved out of a pinned buffer starts on a cache line
_PIN_POLL_S = 0.1  # how often the pinning thread and its consumer check for a stop
_PIN_JOIN_TIMEOUT_S = 10.0  # how long an abandoned iterator waits for its thread to finish a batch


# --------------------------------------------------------------------------- tree walking


def _rebuild(data: Any, convert: Callable[[Any], Any]) -> Any:
    """``data`` with ``convert`` applied to each element, rebuilt the way torch rebuilds it.

    The container rules are ``torch.utils.data._utils.pin_memory.pin_memory``'s: a
    mutable mapping or sequence is shallow-copied and updated (so subclasses keep their
    extra attributes), a namedtuple or tuple keeps its type, and a container that
    cannot be rebuilt becomes a ``dict`` / ``list``.
    """
    if isinstance(data, collections.abc.Mapping):
        try:
            if isinstance(data, collections.abc.MutableMapping):
                clone = copy.copy(data)
                clone.update({k: convert(v) for k, v in data.items()})
                return clone
            return type(data)({k: convert(v) for k, v in data.items()})  # type: ignore[call-arg]
        except TypeError:
            return {k: convert(v) for k, v in data.items()}
    if isinstance(data, tuple):
        if hasattr(data, "_fields"):  # namedtuple
            return type(data)(*(convert(v) for v in data))
        return type(data)(convert(v) for v in data)
    try:
        if isinstance(data, collections.abc.MutableSequence):
            items = copy.copy(data)
            for i, v in enumerate(data):
                items[i] = convert(v)
            return items
        return type(data)([convert(v) for v in data])  # type: ignore[call-arg]
    except TypeError:
        return [convert(v) for v in data]


def _is_container(data: Any) -> bool:
    return isinstance(data, (collections.abc.Mapping, collections.abc.Sequence)) and not isinstance(
        data, (str, bytes, bytearray, memoryview, range, np.ndarray, torch.Tensor)
    )


def _array_to_tensor(array: np.ndarray) -> Any:
    """A tensor over ``array``'s memory; a copy when torch cannot share it without a warning."""
    dtype = array.dtype
    native = dtype.newbyteorder("=") if not dtype.isnative else dtype
    if native not in _TORCH_DTYPES:
        return array  # strings, objects, datetimes, long doubles: torch has no such tensor
    strides_ok = all(s >= 0 and s % dtype.itemsize == 0 for s in array.strides)
    if not (array.flags.writeable and dtype.isnative and strides_ok):
        # torch warns about read-only arrays and refuses negative strides and foreign
        # byte order; a private, contiguous, native copy has none of these problems
        array = np.array(array, dtype=native, order="C", copy=True)
    return torch.from_numpy(array)


def _to_tensors(data: Any, *, torch_strings: bool, in_sequence: bool = False) -> Any:
    """Every numpy array and numeric numpy scalar in the batch tree, as torch tensors.

    With ``torch_strings`` a list of strings that sits directly in a list, tuple or
    namedtuple becomes a tuple: torch's ``default_collate`` builds those from
    ``zip(*batch)`` and returns them as it built them, where stoker's returns lists.
    """
    if isinstance(data, np.ndarray):
        return _array_to_tensor(data)
    if isinstance(data, (np.number, np.bool_)):
        converted = _array_to_tensor(np.asarray(data))
        return data if isinstance(converted, np.ndarray) else converted
    if not _is_container(data):
        return data
    if (
        torch_strings
        and in_sequence
        and type(data) is list
        and data
        and all(isinstance(v, (str, bytes)) for v in data)
    ):
        return tuple(data)
    child_in_sequence = not isinstance(data, collections.abc.Mapping)
    return _rebuild(
        data, lambda v: _to_tensors(v, torch_strings=torch_strings, in_sequence=child_in_sequence)
    )


def _draw_torch_seed() -> int:
    """One non-negative int64 from torch's global generator, drawn as torch's loader draws it."""
    return int(torch.empty((), dtype=torch.int64).random_().item())


# --------------------------------------------------------------------------- pinning


def _allocate_pinned(nbytes: int) -> Any:
    """``nbytes`` of page-locked host memory from torch's caching host allocator."""
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


def _pin_batch(batch: Any, allocate: Callable[[int], Any] = _allocate_pinned) -> Any:
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
    tensors: dict[int, Any] = {}
    _collect_pinnable(batch, tensors)
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
    return (
        type(t) is torch.Tensor
        and t.layout == torch.strided
        and t.device.type == "cpu"
        and not t.is_quantized
        and not t.is_pinned()
    )


def _collect_pinnable(data: Any, found: dict[int, Any]) -> None:
    if isinstance(data, torch.Tensor):
        if _carvable(data):
            found[id(data)] = data
    elif _is_container(data):
        values = data.values() if isinstance(data, collections.abc.Mapping) else data
        for v in values:
            _collect_pinnable(v, found)


def _replace_pinned(data: Any, views: dict[int, Any]) -> Any:
    if isinstance(data, torch.Tensor):
        view = views.get(id(data))
        if view is not None:
            return view
        if data.device.type == "cpu" and not data.is_pinned():
            return data.pin_memory()  # sparse, quantized or subclassed: torch's own way
        return data
    if isinstance(data, (str, bytes)):
        return data
    if _is_container(data):
        return _rebuild(data, lambda v: _replace_pinned(v, views))
    if hasattr(data, "pin_memory"):  # a custom batch type, as torch allows
        return data.pin_memory()
    return data


def _accelerator_pin_function() -> tuple[Callable[[Any], Any], Callable[[], None]] | str:
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

    return _pin_batch, setup


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
    the thread (``_PinningIterator.paused``) cannot deadlock with it.
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


class _PinningIterator:
    """Hands over the batches of ``source`` after ``pin`` ran on them in ONE background thread.

    The thread pulls a batch from ``source``, pins it and puts it into a queue of at
    most ``maxsize`` batches, so pinning (and loading, when ``source`` loads in the
    calling thread) overlaps with the consumer's compute. Order is preserved.

    Shutdown: :meth:`close`, exhaustion, garbage collection of the iterator (a
    ``weakref.finalize``) and interpreter exit all run :func:`_stop_thread`. The thread
    is a daemon and never references this object, so abandoning the iterator is enough.

    ``pin`` is chosen by the caller: the accelerator path passes :func:`_pin_batch`;
    the CPU tests drive the same machinery with a plain copy function.
    """

    def __init__(
        self,
        source: Iterator[Any],
        pin: Callable[[Any], Any],
        *,
        maxsize: int,
        setup: Callable[[], None] | None = None,
        length: int | None = None,
    ) -> None:
        if not isinstance(maxsize, int) or maxsize < 1:
            raise AssertionError(f"the pin queue needs room for a batch, got maxsize={maxsize!r}")
        self._queue: queue.Queue[Any] = queue.Queue(maxsize)
        self._stop = threading.Event()
        self._length = length
        self._done = False
        self._pulls = _Pulls()
        self._delivered = 0
        self._thread = threading.Thread(
            target=_pin_loop,
            args=(source, pin, setup, self._queue, self._stop, self._pulls),
            name="stoker-pin-memory",
            daemon=True,
        )
        self._finalizer = weakref.finalize(
            self, _stop_thread, self._stop, self._thread, self._queue, _PIN_JOIN_TIMEOUT_S
        )
        self._thread.start()

    def __iter__(self) -> _PinningIterator:
        return self

    def __len__(self) -> int:
        if self._length is None:
            raise TypeError("this iterator's source has no length")
        return self._length

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
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
            self.close()
            raise StopIteration
        if isinstance(item, _Failure):
            self._delivered += item.pulled
            raise item.error
        self._delivered += 1
        return item

    @contextlib.contextmanager
    def paused(self) -> Iterator[int]:
        """Holds the thread between two pulls; yields how many pulled batches are not delivered.

        While paused, the source's own progress counts exactly the pulled batches, so
        the loader's ``state_dict`` can subtract the ones still waiting here.
        """
        with self._pulls.lock:
            yield self._pulls.count - self._delivered

    def close(self, *, wait_s: float | None = _PIN_JOIN_TIMEOUT_S) -> None:
        """Stops the thread (it closes the source); safe to call twice.

        Args:
            wait_s: how long to wait for the thread to finish the batch it is loading
                (``None``: until it has).
        """
        self._done = True
        if self._finalizer.detach() is not None:
            _stop_thread(self._stop, self._thread, self._queue, wait_s)


# --------------------------------------------------------------------------- the loader


class DataLoader(_CoreDataLoader[T]):
    """``torch.utils.data.DataLoader`` on stoker's engine: same arguments, torch batches.

    Takes torch ``Dataset`` / ``IterableDataset`` objects, torch samplers and
    ``torch.Generator`` as they are, and every stoker option after them (keyword-only,
    see :class:`stoker.DataLoader`). Each numpy array and numeric numpy scalar in a
    batch becomes a tensor sharing its memory (``torch.from_numpy``; read-only,
    byte-swapped or negatively strided arrays are copied first); strings, Python
    numbers, tensors and other objects pass through. Arrays whose dtype torch has no
    tensor for (strings, objects, datetimes) stay numpy arrays.

    Randomness: with ``generator=None`` the loader's base seed (which seeds the default
    shuffle, the workers and the random scopes of every epoch) is drawn from torch's
    global generator when the loader is built, so ``torch.manual_seed(s)`` before it
    reproduces a run, as with torch, and :meth:`state_dict` resumes it. Unlike torch's,
    iterating does not draw from the global generator again. The shuffled order itself
    is stoker's (pass a ``torch.Generator`` to get torch's exact order).

    ``pin_memory=True``: a background thread copies each batch into page-locked memory
    (one pinned block per batch from torch's caching host allocator), so that
    ``batch.to(device, non_blocking=True)`` overlaps with compute. At most
    ``prefetch_factor`` (2 without workers) pinned batches wait ahead of the loop. With
    ``num_workers=0`` that thread also loads the batches. Without an accelerator the
    loader says so once and does no pinning, as torch does.

    Known differences from torch's batches: a batch of mixed ``int`` and ``float``
    samples is float64 (torch: float32), and with a custom ``collate_fn`` numpy
    arrays it returns are converted as well (torch would leave them numpy).

    Example:
        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> from stoker.torch import DataLoader
        >>> ds = TensorDataset(torch.arange(6), torch.arange(6) * 10)
        >>> [y.tolist() for x, y in DataLoader(ds, batch_size=4)]
        [[0, 10, 20, 30], [40, 50]]
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Iterable[Any] | None = None,
        batch_sampler: Iterable[list[Any]] | None = None,
        num_workers: int = 0,
        collate_fn: Callable[[Any], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: Any = None,
        **options: Any,
    ) -> None:
        seeded_by_torch = generator is None
        if seeded_by_torch:
            # torch's loader draws its seeds from the global generator; ours draws one
            # base seed from it, here, so the run follows torch.manual_seed and the
            # loader's state (which records that seed) resumes it exactly
            generator = _draw_torch_seed()
        super().__init__(
            dataset,
            batch_size,
            shuffle,
            sampler,
            batch_sampler,
            num_workers,
            collate_fn,
            pin_memory,
            drop_last,
            timeout,
            worker_init_fn,
            multiprocessing_context,
            generator,
            **options,
        )
        if seeded_by_torch:
            self.generator = None  # as the caller passed it; the drawn seed is in use already
        self._torch_strings = self.collate_fn is default_collate
        self._pin_warned = True  # the core's numpy-only notice does not apply here
        self._pin_notice_given = False
        self._pinning: weakref.ref[_PinningIterator] | None = None

    def _deliver(self, batch: Any) -> Any:
        return _to_tensors(batch, torch_strings=self._torch_strings)

    def __iter__(self) -> Iterator[T]:
        self._stop_pinning()
        iterator = super().__iter__()
        if not self.pin_memory:
            return iterator
        chosen = _accelerator_pin_function()
        if isinstance(chosen, str):
            if not self._pin_notice_given:
                self._pin_notice_given = True
                msg = (
                    f"pin_memory=True: {chosen}, so batches are not pinned. "
                    "Pass pin_memory=False to silence this notice."
                )
                warnings.warn(msg, UserWarning, stacklevel=2)
            return iterator
        pin, setup = chosen
        pinning = _PinningIterator(
            iterator,
            pin,
            maxsize=self.prefetch_factor or 2,
            setup=setup,
            length=_length_or_none(self),
        )
        self._pinning = weakref.ref(pinning)
        return pinning

    def _stop_pinning(self) -> None:
        """Stops the previous epoch's pinning thread before a new epoch touches the workers."""
        previous = self._pinning() if self._pinning is not None else None
        self._pinning = None
        if previous is not None:
            # workers the next epoch reuses, or a dataset it reads in this process, must not
            # be touched by two threads: wait for the old thread to let go of them
            shared = self.persistent_workers or self.num_workers == 0
            previous.close(wait_s=None if shared else _PIN_JOIN_TIMEOUT_S)

    def state_dict(self) -> dict[str, Any]:
        """:meth:`stoker.DataLoader.state_dict`, counting only the batches the loop received.

        With ``pin_memory=True`` the pinning thread reads ahead; the batches it holds
        (pinned or being pinned) have not been handed out, so a resumed loader loads
        them again.
        """
        pinning = self._pinning() if self._pinning is not None else None
        progress = getattr(self, "_progress", None)
        if pinning is None or progress is None:
            return super().state_dict()
        with pinning.paused() as held:
            if held == 0:
                return super().state_dict()
            yielded, done = progress.yielded, progress.done
            progress.yielded, progress.done = yielded - held, False
            try:
                return super().state_dict()
            finally:
                progress.yielded, progress.done = yielded, done

    def close(self) -> None:
        """Stops the pinning thread and persistent workers; safe to call twice."""
        self._stop_pinning()
        super().close()


def _length_or_none(loader: _CoreDataLoader[Any]) -> int | None:
    try:
        return len(loader)
    except TypeError:
        return None
