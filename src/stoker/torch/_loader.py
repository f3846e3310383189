"""``stoker.torch.DataLoader``: a ``torch.utils.data.DataLoader`` that runs on stoker's engine."""

from __future__ import annotations

import dataclasses
import inspect
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import torch.utils.data as tud
from torch.utils.data.dataloader import _DatasetKind

from stoker.collate import default_collate
from stoker.engine.boot import Booted
from stoker.loader import DataLoader as _CoreDataLoader
from stoker.torch import _datapipes
from stoker.torch._convert import to_tensors
from stoker.torch._pinning import PIN_JOIN_TIMEOUT_S, PinningIterator, accelerator_pin_function
from stoker.torch._rebuilds import StokerOptions, TorchCollate, take_up
from stoker.torch._samplers import BatchSampler, RandomSampler, SequentialSampler, draw_torch_seed

__all__ = ["DataLoader"]

T = TypeVar("T")


class DataLoader(_CoreDataLoader[T], tud.DataLoader):
    """``torch.utils.data.DataLoader`` on stoker's engine: same arguments, torch batches.

    It *is* a ``torch.utils.data.DataLoader`` (a subclass), so PyTorch Lightning,
    Hugging Face accelerate and any code that checks for or rebuilds a torch loader
    handles it as one, and the loader they rebuild is again a stoker loader with the
    same options (see :mod:`stoker.torch._rebuilds`). Iteration follows torch's: nothing
    starts (no epoch, no sampler read, no worker) until the first ``next()``.

    Takes torch ``Dataset`` / ``IterableDataset`` objects, torch samplers and
    ``torch.Generator`` as they are, and every stoker option after them (keyword-only,
    see :class:`stoker.DataLoader`). Each numpy array and numeric numpy scalar in a
    batch becomes a tensor sharing its memory (``torch.from_numpy``; read-only,
    byte-swapped or negatively strided arrays are copied first); strings, Python
    numbers, tensors and other objects pass through. Arrays whose dtype torch has no
    tensor for (strings, objects, datetimes) stay numpy arrays.

    Samplers: without ``sampler=`` the loader builds :mod:`stoker.torch`'s
    ``RandomSampler`` / ``SequentialSampler`` / ``BatchSampler``, stoker's samplers
    that are also instances of torch's, so frameworks recognise a shuffled loader.

    Randomness: with ``generator=None`` the loader's base seed (which seeds the workers
    and the random scopes of every epoch) and the shuffle's seed are drawn from torch's
    global generator when the first epoch starts (the first ``next()``), not when the
    loader is built: building one leaves torch's global generator as it was, so a model
    initialised after it gets the weights it gets with torch's loader. Calling
    ``torch.manual_seed(s)`` before the first epoch reproduces a run, as with torch, and
    :meth:`state_dict` resumes it. With a ``torch.Generator`` the shuffled order equals
    torch's, epoch for epoch, with or without persistent workers.

    ``pin_memory=True``: a background thread copies each batch into page-locked memory
    (one pinned block per batch from torch's caching host allocator), so that
    ``batch.to(device, non_blocking=True)`` overlaps with compute. At most
    ``prefetch_factor`` (2 without workers) pinned batches wait ahead of the loop. With
    ``num_workers=0`` that thread also loads the batches. Without an accelerator the
    loader says so once and does no pinning, as torch does.

    ``collate_fn`` reads back as a :class:`~stoker.torch._rebuilds.TorchCollate`
    wrapping the function passed (its ``collate`` attribute): called directly it
    returns torch batches.

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
        >>> isinstance(DataLoader(ds), torch.utils.data.DataLoader)
        True
    """

    _random_sampler_cls = RandomSampler
    _sequential_sampler_cls = SequentialSampler
    _batch_sampler_cls = BatchSampler

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Iterable[Any] | None = None,
        batch_sampler: Iterable[list[Any]] | None = None,
        num_workers: int | str = 0,
        collate_fn: Callable[[Any], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: Any = None,
        *,
        prefetch_factor: int | str | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        worker_mode: str = "auto",
        on_worker_death: str = "raise",
        copy_batches: bool = False,
        worker_threads: int | None = 1,
        on_error: str = "raise",
        max_errors: int | float | None = 0.01,
        memory_budget: int | None = None,
        compact_dataset: bool = False,
    ) -> None:
        # Every argument is named in the signature (no **kwargs): frameworks rebuild a
        # loader from the attributes whose names its __init__ takes.
        options = {
            "num_workers": num_workers,
            "prefetch_factor": prefetch_factor,
            "worker_mode": worker_mode,
            "on_worker_death": on_worker_death,
            "copy_batches": copy_batches,
            "worker_threads": worker_threads,
            "on_error": on_error,
            "max_errors": max_errors,
            "memory_budget": memory_budget,
            "compact_dataset": compact_dataset,
        }
        self._carried_seed: int | None = None
        if isinstance(collate_fn, TorchCollate):  # rebuilt from a stoker loader's arguments
            options = take_up(options, _OPTION_DEFAULTS, collate_fn.options)
            if generator is None:
                self._carried_seed = collate_fn.options.seed
            collate_fn = collate_fn.collate
        wanted = dict(options)
        datapipe = _datapipes.is_datapipe(dataset)
        if datapipe:  # torch's handling: shuffle= switches the graph's shufflers
            dataset, shuffle = _datapipes.prepare(dataset, shuffle), None
        super().__init__(
            dataset,
            batch_size,
            shuffle,
            sampler,
            batch_sampler,
            options.pop("num_workers"),
            collate_fn,
            pin_memory,
            drop_last,
            timeout,
            worker_init_fn,
            multiprocessing_context,
            generator,
            persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device,
            in_order=in_order,
            **options,
        )
        requested = StokerOptions(**wanted, seed=self._seed if generator is None else None)
        if datapipe and self.num_workers > 1 and self.worker_mode == "thread":
            msg = (
                "an IterDataPipe graph is sharded per worker, and thread workers share one graph: "
                "use worker_mode='auto' (the default, which gives an IterDataPipe processes) "
                "or 'process', or num_workers=1"
            )
            raise ValueError(msg)
        # torch's own attributes, which code written for torch's loader reads
        self._dataset_kind = _DatasetKind.Iterable if self._iterable else _DatasetKind.Map
        self._IterableDataset_len_called: int | None = None
        self.collate_fn = TorchCollate(
            self.collate_fn, torch_strings=self.collate_fn is default_collate, options=requested
        )
        self._pin_warned = True  # the core's numpy-only notice does not apply here
        self._pin_notice_given = False
        self._pinning: weakref.ref[PinningIterator] | None = None

    # -- what differs from the numpy loader -------------------------------------------
    def _fresh_seed(self) -> int:
        """``generator=None``: the base seed comes from torch's global generator (or the loader
        this one was rebuilt from)."""
        return self._carried_seed if self._carried_seed is not None else draw_torch_seed()

    def _base_seed(self) -> int:
        drawn = self._seed is None
        seed = super()._base_seed()
        collate = self.collate_fn
        if (
            drawn
            and isinstance(collate, TorchCollate)
            and collate.options.seed is None
            and self.generator is None
        ):
            # a loader rebuilt from this one from now on keeps the seed
            self.collate_fn = dataclasses.replace(
                collate, options=dataclasses.replace(collate.options, seed=seed)
            )
        return seed

    @property
    def _engine_collate(self) -> Callable[[Any], Any]:
        collate = self.collate_fn
        return collate.collate if isinstance(collate, TorchCollate) else collate

    def _deliver(self, batch: Any) -> Any:
        collate = self.collate_fn
        torch_strings = collate.torch_strings if isinstance(collate, TorchCollate) else False
        return to_tensors(batch, torch_strings=torch_strings)

    def _expected_start(self) -> tuple[int, int] | None:
        if isinstance(self.dataset, _datapipes.SeededDataPipe):
            return None  # the epoch's seed is drawn for the graph at its start
        return super()._expected_start()

    def _begin_epoch(self, booted: Booted | None = None) -> Iterator[Any]:
        dataset = self.dataset
        if isinstance(dataset, _datapipes.SeededDataPipe):
            # torch draws the graph's shared seed at every epoch; it becomes the epoch's seed,
            # which the workers receive with the epoch
            dataset.epoch_seed = self._datapipe_seed = _datapipes.draw_epoch_seed(self.generator)
            if self.num_workers == 0:
                _datapipes.shard_in_process(dataset)
        return super()._begin_epoch(booted)

    def _epoch_seed(self, epoch: int, *, draw: bool) -> int:
        seed = self.__dict__.pop("_datapipe_seed", None)
        return seed if seed is not None else super()._epoch_seed(epoch, draw=draw)

    def _pool_worker_init_fn(self) -> Callable[[int], None] | None:
        if isinstance(self.dataset, _datapipes.SeededDataPipe):
            return _datapipes.worker_init(self.worker_init_fn)
        return self.worker_init_fn

    def _get_iterator(self) -> Iterator[T]:
        """torch's hook for making an iterator: stoker's, started at its first ``next()``."""
        return self.__iter__()

    @property
    def _iterator(self) -> Any:
        """torch keeps persistent workers' iterator here; setting it to ``None`` stops them.

        Lightning resets loaders this way when a fit, validation or prediction ends, and
        code written for torch calls ``loader._iterator._shutdown_workers()``: both work.
        """
        pool = self._pool
        return _PersistentWorkers(self) if pool is not None and self.persistent_workers else None

    @_iterator.setter
    def _iterator(self, value: Any) -> None:
        if value is not None:
            msg = (
                "stoker.torch.DataLoader keeps its workers itself; only None can be assigned "
                "to _iterator"
            )
            raise ValueError(msg)
        self.close()

    # -- iteration with pinning ----------------------------------------------------------
    def __iter__(self) -> Iterator[T]:
        self._stop_pinning()
        iterator = super().__iter__()
        if not self.pin_memory:
            return iterator
        chosen = accelerator_pin_function()
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
        pinning = PinningIterator(
            iterator,
            pin,
            maxsize=self.prefetch_factor if isinstance(self.prefetch_factor, int) else 2,
            setup=setup,
            length=_length_or_none(self),
            lazy=True,
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
            previous.close(wait_s=None if shared else PIN_JOIN_TIMEOUT_S)

    def _take_backs(self) -> int:
        pinning = self._pinning() if self._pinning is not None else None
        return pinning.read_ahead if pinning is not None else 0

    def state_dict(self) -> dict[str, Any]:
        """:meth:`stoker.DataLoader.state_dict`, counting only the batches the loop received.

        With ``pin_memory=True`` the pinning thread reads ahead; the batches it holds
        (pinned or being pinned) have not been handed out, so a resumed loader loads
        them again.
        """
        pinning = self._pinning() if self._pinning is not None else None
        if pinning is None or self._progress is None or not pinning.started:
            # no thread has read ahead (an iterator not yet started belongs to the next
            # epoch: the state is where the last epoch's iterator left the loader)
            return super().state_dict()
        with pinning.paused() as held:
            return self._state(held=held, finished=pinning.ended)

    def close(self) -> None:
        """Stops the pinning thread and persistent workers; safe to call twice."""
        self._stop_pinning()
        super().close()


class _PersistentWorkers:
    """What ``loader._iterator`` is while persistent workers run (torch's handle on them)."""

    __slots__ = ("_loader",)

    def __init__(self, loader: DataLoader[Any]) -> None:
        self._loader = loader

    def _shutdown_workers(self) -> None:
        self._loader.close()


_OPTION_DEFAULTS = {
    name: parameter.default
    for name, parameter in inspect.signature(DataLoader.__init__).parameters.items()
    if parameter.default is not inspect.Parameter.empty
}


def _length_or_none(loader: _CoreDataLoader[Any]) -> int | None:
    try:
        return len(loader)
    except TypeError:
        return None
