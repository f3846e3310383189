"""The public :class:`DataLoader`: arguments, validation, iteration.

The loader wires the classic PyTorch data pipeline::

    Dataset -> Sampler -> BatchSampler -> (fetch) -> collate_fn -> batch

Its signature and argument rules are torch.utils.data.DataLoader's, so a training
script can switch by changing one import; the messages say what to change.
"""

from __future__ import annotations

import logging
import math
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

import numpy as np

from stoker._bad_sample_budget import BadSampleBudget
from stoker._loader_arguments import check_arguments, warn_excessive_workers
from stoker._proc import usable_cpus
from stoker._resume import (
    STATE_VERSION,
    Progress,
    check_state,
    draws_unrecorded,
    epoch_owner,
    global_generators,
    mid_epoch_state,
    restore_global_generators,
    skip_batches,
)
from stoker._state_capture import holds_state
from stoker._thread_safety import is_thread_safe, warn_shared_handles
from stoker._validate import check_int
from stoker.bad_samples import ErrorReport
from stoker.collate import default_collate, default_convert
from stoker.engine.autotune import AutoTuner, available_memory
from stoker.engine.boot import Booted, boot
from stoker.engine.messages import WorkerSpec
from stoker.engine.mode_trial import ModeTrial
from stoker.engine.multi_worker import MultiWorkerIterator, next_epoch_streams
from stoker.engine.plan import EpochHooks, EpochPlan
from stoker.engine.pool import Pool, PoolState, WorkerPool
from stoker.engine.ray_workers import RayPool, RayWorkers, ray_options
from stoker.engine.single_process import SingleProcessIterator
from stoker.engine.stream_state import start_state
from stoker.profiling.copy_on_read import (
    compact_large_containers,
    find_large_containers,
    start_method,
    warning_text,
)
from stoker.profiling.stats import LoaderStats, StatsRecorder
from stoker.samplers import BatchSampler, RandomSampler, SequentialSampler
from stoker.seeding import _derive_epoch_seed, _is_torch_generator, _resolve_base_seed

__all__ = ["DataLoader"]

_log = logging.getLogger("stoker")

T = TypeVar("T")

# Attributes that define the batch stream; changing them after construction would
# silently desynchronise the loader from its samplers, so torch forbids it and so do we.
_FROZEN_AFTER_INIT = frozenset(
    {"batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers"}
)


class DataLoader(Generic[T]):
    """Iterates over batches of a dataset: torch's DataLoader over a numpy core.

    Args:
        dataset: a map-style dataset (anything with ``__getitem__`` and ``__len__``,
            optionally ``__getitems__`` for batched fetch) or an iterable dataset
            (:class:`stoker.IterableDataset` or ``torch.utils.data.IterableDataset``).
        batch_size: samples per batch; ``None`` disables batching (each item is one
            sample passed through ``default_convert``).
        shuffle: reshuffle every epoch (map-style only).
        sampler: where indices come from; mutually exclusive with ``shuffle``.
        batch_sampler: yields whole index batches; mutually exclusive with
            ``batch_size``, ``shuffle``, ``sampler`` and ``drop_last``.
        num_workers: background workers; 0 loads in the main process; ``"auto"``
            starts with half the cores and adds workers while they cut the consumer's
            wait, up to the cores this process may use (see :mod:`stoker.engine.autotune`).
        collate_fn: merges a list of samples into a batch (default:
            :func:`stoker.default_collate`).
        pin_memory: pin batches for fast host-to-device copies (torch only).
        drop_last: drop the last, incomplete batch.
        timeout: seconds to wait for a worker's batch (0: no limit).
        worker_init_fn: called in every worker with its id before it fetches.
        multiprocessing_context: ``"fork"``, ``"forkserver"``, ``"spawn"`` or a context.
        generator: seeds shuffling (int, ``numpy.random.Generator`` or ``torch.Generator``).
        prefetch_factor: batches loaded in advance per worker (default 2 with workers);
            ``"auto"`` grows it while the consumer finds the buffer empty.
        persistent_workers: keep workers alive between epochs.
        pin_memory_device: accepted for compatibility; the current accelerator is used.
        in_order: deliver batches in sampler order (``False``: as soon as ready).
        worker_mode: ``"auto"`` (default), ``"process"`` or ``"thread"`` workers.
            ``"auto"`` measures threads against processes while the
            first epoch runs and keeps the faster, for a map-style dataset (and
            transforms and collate_fn) that declares ``thread_safe = True`` and no
            ``worker_init_fn``; anything else gets processes. See docs/worker-modes.md.
            ``"ray"`` or a :class:`stoker.RayWorkers` runs them as Ray actors, on this
            machine or a cluster (docs/ray.md).
        on_worker_death: ``"raise"`` (default) or ``"restart"`` a worker that died
            and re-issue its batches.
        copy_batches: copy each batch out of shared memory before returning it. By
            default batches are zero-copy views of a shared-memory slot that is reused
            once nothing references the batch any more; copying frees the slot at once.
        on_error: ``"raise"`` (default) stops at a sample whose fetch raises;
            ``"skip"`` leaves it out of its batch, logs it and records it in
            :meth:`error_report` (see :mod:`stoker.bad_samples`).
        max_errors: with ``on_error="skip"``, how many bad samples to tolerate: an
            int, a fraction of the samples attempted (default ``0.01``: one in a
            hundred), or ``None`` for no limit. Past it the loader raises
            :class:`~stoker.bad_samples.TooManyBadSamples` with a summary.
        memory_budget: bytes that batches in flight and shared-memory slots may hold
            (default: a quarter of the memory available at construction). The slot pool
            is sized within it from the measured batch size, and autotuning never grows
            past it.
        worker_threads: cap on BLAS / OpenMP / torch threads inside each process
            worker (default 1, so N workers do not oversubscribe the cores); ``None``
            leaves the libraries' defaults.
        compact_dataset: before process workers start, replace the dataset's large
            lists and tuples of strings, bytes or records (attributes, two levels deep)
            with :func:`stoker.compact.compact` of them, which workers share instead of
            copying. Off by default, since it changes the dataset object: those
            attributes become read-only sequences. Without it such attributes are
            only warned about (see :mod:`stoker.profiling.copy_on_read`).

    Example:
        >>> import numpy as np
        >>> from stoker import ArrayDataset, DataLoader
        >>> ds = ArrayDataset(np.arange(10), np.arange(10) * 2)
        >>> [x.tolist() for x, y in DataLoader(ds, batch_size=4)]
        [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    """

    # The samplers the loader builds when none is given (stoker.torch builds ones that
    # frameworks recognise as torch's).
    _random_sampler_cls: Any = RandomSampler
    _sequential_sampler_cls: Any = SequentialSampler
    _batch_sampler_cls: Any = BatchSampler

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
        worker_mode: str | RayWorkers = "auto",
        on_worker_death: str = "raise",
        copy_batches: bool = False,
        worker_threads: int | None = 1,
        on_error: str = "raise",
        max_errors: int | float | None = 0.01,
        memory_budget: int | None = None,
        compact_dataset: bool = False,
    ) -> None:
        args = check_arguments(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle,
            sampler=sampler,
            batch_sampler=batch_sampler,
            num_workers=num_workers,
            collate_fn=collate_fn,
            drop_last=drop_last,
            timeout=timeout,
            worker_init_fn=worker_init_fn,
            multiprocessing_context=multiprocessing_context,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            pin_memory=pin_memory,
            in_order=in_order,
            worker_mode=worker_mode,
            on_worker_death=on_worker_death,
            copy_batches=copy_batches,
            worker_threads=worker_threads,
            on_error=on_error,
            memory_budget=memory_budget,
            compact_dataset=compact_dataset,
        )
        budget = BadSampleBudget(max_errors) if on_error == "skip" else None
        iterable, batch_size, shuffle, drop_last = (
            args.iterable,
            args.batch_size,
            args.shuffle,
            args.drop_last,
        )
        num_workers, prefetch_factor = args.num_workers, args.prefetch_factor
        if not args.tune_workers:
            warn_excessive_workers(num_workers)
        if worker_mode == "thread":
            warn_shared_handles(dataset, num_workers)

        if sampler is None and batch_sampler is not None:
            sampler = getattr(batch_sampler, "sampler", None)  # a BatchSampler's own, for set_epoch
        if sampler is None and not iterable:
            sampler = (
                self._random_sampler_cls(dataset, generator=generator)
                if shuffle
                else self._sequential_sampler_cls(dataset)
            )
        if batch_size is not None and batch_sampler is None and not iterable:
            batch_sampler = self._batch_sampler_cls(sampler, batch_size, drop_last)  # type: ignore[arg-type]

        self._iterable = iterable
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory
        self.pin_memory_device = pin_memory_device
        self.timeout = args.timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = args.multiprocessing_context
        self.generator = generator
        self.persistent_workers = args.persistent_workers
        self.in_order = args.in_order
        self.ray_workers = ray_options(worker_mode)  # where Ray actors run, or None
        self.worker_mode = "ray" if self.ray_workers is not None else worker_mode
        self.on_worker_death = on_worker_death
        self.copy_batches = args.copy_batches
        self.worker_threads = args.worker_threads
        self.on_error = on_error
        self.max_errors = max_errors
        self._bad_samples = budget
        self._stats = StatsRecorder(num_workers)
        self.memory_budget = (
            args.memory_budget if args.memory_budget is not None else available_memory() // 4
        )
        self._memory_budget_given = args.memory_budget is not None
        self.compact_dataset = args.compact_dataset
        self._copy_on_read_checked = False
        self._autotune_flags = (args.tune_workers, args.tune_prefetch)
        self._mode_trial: ModeTrial | None = None
        self._auto_refused: str | None = None  # worker_mode="auto" without a trial: why
        self._epoch = 0
        self._left_epoch: int | None = (
            None  # the epoch sampler's epoch as the last __iter__ left it
        )
        # generator=None: the base seed is drawn when the first epoch starts, so building a
        # loader leaves the global random generators as it found them (as torch's does)
        self._seed: int | None = (
            0
            if _is_torch_generator(generator)
            else None
            if generator is None
            else _resolve_base_seed(generator)
        )
        self._seed_drawn_at: int | None = None  # the epoch whose start drew the base seed
        self._torch_seed: tuple[int, int] | None = (
            None  # a torch.Generator's last base seed, its epoch
        )
        self._skip_each_epoch = (
            0  # batches every epoch starts after (see _skip_batches_every_epoch)
        )
        self._length_reported: int | None = None  # len() of an IterableDataset loader, once asked
        self._progress: Progress | None = None
        self._engine: weakref.ref[Any] | None = None  # the epoch's engine iterator (its streams)
        self._start_state_warned = False
        self._resume: dict[str, Any] | None = None
        self._pool: Pool | None = None
        self._autotuner: AutoTuner | None = None
        self._live_pool: weakref.ref[Pool] | None = None
        self._pool_finalizer: weakref.finalize | None = None
        self._pool_booted: Booted | None = None  # persistent workers iter() started, unused yet
        self.collate_fn = collate_fn or (
            default_collate if self._auto_collation else default_convert
        )
        self._pin_warned = False
        self._initialized = True

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _FROZEN_AFTER_INIT and self.__dict__.get("_initialized", False):
            msg = (
                f"{name} cannot be changed after the DataLoader is built; "
                "build a new DataLoader with the value you want"
            )
            raise ValueError(msg)
        super().__setattr__(name, value)

    def _fresh_seed(self) -> int:
        """The base seed of a loader built with ``generator=None`` (from numpy's global RNG)."""
        return _resolve_base_seed(None)

    def _base_seed(self) -> int:
        """The loader's base seed, drawn now if the loader was built with ``generator=None``."""
        if self._seed is None:
            self._seed = self._fresh_seed()
        return self._seed

    @property
    def _engine_collate(self) -> Callable[[Any], Any]:
        """The collate the engine runs (stoker.torch hands out tensors after it)."""
        return self.collate_fn

    @property
    def _auto_collation(self) -> bool:
        return self.batch_sampler is not None or (self.batch_size is not None and self._iterable)

    @property
    def _index_sampler(self) -> Iterable[Any]:
        return self.batch_sampler if self.batch_sampler is not None else self.sampler  # type: ignore[return-value]

    def __len__(self) -> int:
        """Batches per epoch, as torch defines it.

        For an iterable dataset this is ``len(dataset)`` divided by the batch size
        (rounded up, or down with ``drop_last``) and needs the dataset to define
        ``__len__``.
        """
        if self._iterable:
            try:
                length = len(self.dataset)
            except TypeError:
                msg = (
                    f"len(DataLoader) needs the IterableDataset to define __len__; "
                    f"{type(self.dataset).__name__} does not"
                )
                raise TypeError(msg) from None
            if self.batch_size is not None:
                length = (
                    length // self.batch_size
                    if self.drop_last
                    else math.ceil(length / self.batch_size)
                )
            self._length_reported = (
                length  # the epochs started from now on warn past it, as torch's
            )
            return length
        return max(0, len(self._index_sampler) - self._skip_each_epoch)  # type: ignore[arg-type]

    def _skip_batches_every_epoch(self, batches: int) -> None:
        """Every epoch starts after its first ``batches`` batches, which are never loaded.

        The batches that follow keep their place in the epoch, and so their samples'
        random seeds: what a framework's "skip the first n batches" means when it
        resumes an epoch. ``len(loader)`` counts the batches still delivered.
        """
        batches = check_int("batches", batches, minimum=0)
        if self._iterable and batches:
            raise ValueError("an IterableDataset loader cannot skip batches without reading them")
        self._skip_each_epoch = batches

    def __iter__(self) -> Iterator[T]:
        """An iterator over one epoch; its workers start now, the epoch at its first ``next()``.

        As torch's ``iter()`` does, it starts the workers a new epoch needs (so a failing
        ``worker_init_fn`` raises here, and the workers are ready by the first ``next()``).
        The epoch itself is decided at the first ``next()``: its number, the sampler's
        order, the first tasks. So ``iter(loader)`` followed by ``set_epoch(e)`` on the
        sampler (the order frameworks such as Lightning use) gives epoch ``e``, even with
        workers (see :mod:`stoker.engine.boot`).
        """
        if self.pin_memory and not self._pin_warned:
            self._pin_warned = True
            _warn_pin_memory()
        return _EpochIterator(self)

    def _reusable_pool(self) -> bool:
        """Whether the next epoch runs on the persistent workers that are running now."""
        return (
            self.persistent_workers
            and self._pool is not None
            and self._pool.state is PoolState.RUNNING
            # worker_mode="auto" may have decided on another kind at the last epoch's end
            and (self.worker_mode != "auto" or self._pool.mode == self._worker_kind())
        )

    def _boot(self) -> Booted | None:
        """``iter()``: starts the workers the next epoch needs and runs their worker_init_fn.

        Nothing when the epoch reuses running persistent workers or has none. The epoch and
        seed the workers start with are the ones the first ``next()`` will decide unless
        something changes in between (see :meth:`_expected_start`).
        """
        if self.num_workers == 0 or self._reusable_pool():
            return None
        self._worker_mode_trial()  # worker_mode="auto" picks the kind the epoch starts with
        expected = self._expected_start()
        pool = self._new_pool()
        booted = Booted(pool, *(expected or (None, None)))
        if self.persistent_workers:
            if self._pool_finalizer is not None:
                self._pool_finalizer()
            self._pool = pool
            self._pool_finalizer = weakref.finalize(self, pool.shutdown)
            self._autotuner = self._new_autotuner()
            self._pool_booted = booted
        if expected is not None:
            boot(pool, *expected, timeout_s=float(self.timeout))
        return booted

    def _expected_start(self) -> tuple[int, int] | None:
        """The epoch and seed the next epoch's start would decide now, drawing nothing.

        The draws the start makes (a base seed from a torch.Generator, from the global
        generators with ``generator=None``) are made on copies of their states. None
        where that cannot be done (a generator on an accelerator).
        """
        resume = self._resume
        if resume is not None:
            epoch = resume["epoch"]
        else:
            owner = epoch_owner(self._index_sampler) if not self._iterable else None
            epoch = self._followed_epoch(owner)
        try:
            if not _is_torch_generator(self.generator):
                base = resume["seed"] if resume is not None else self._seed
                if base is None:
                    base = _without_draws(self._fresh_seed)
                return epoch, _derive_epoch_seed(base, epoch)
            if resume is not None:
                draw = resume.get("torch_draw", True)
                torch_seed = (
                    (resume["torch_seed"], resume["torch_seed_epoch"])
                    if resume.get("torch_seed") is not None
                    else None
                )
                state = resume.get("generator")
            else:
                draw, torch_seed, state = True, self._torch_seed, None
            if draw or torch_seed is None:
                torch_seed = (_peek_torch_base_seed(self.generator, state), epoch)
        except Exception:  # a generator whose state cannot be copied: the workers wait
            return None
        return epoch, _torch_epoch_seed(torch_seed, epoch)

    def _begin_epoch(self, booted: Booted | None = None) -> Iterator[Any]:
        """Starts an epoch and returns the iterator that loads it (at the first ``next()``).

        ``booted``: the workers ``iter()`` started for it (see :meth:`_boot`).
        """
        if (
            booted is None
            and self._pool_booted is not None
            and self._pool is self._pool_booted.pool
        ):
            booted = self._pool_booted  # persistent workers an earlier iter() started
        self._pool_booted = None
        if booted is not None and booted.pool.state is not PoolState.RUNNING:
            booted = None
        reuse_pool = self._reusable_pool()
        # torch draws a base seed for every new iterator, except that persistent workers keep
        # theirs: a persistent pool that worker_mode="auto" swaps for another kind carries it
        carried = (
            booted is None
            and self.persistent_workers
            and self._pool is not None
            and self._pool.state is PoolState.RUNNING
        )
        try:
            progress, index_iter, first_position = self._start_epoch(new_pool=not carried)
        except BaseException:
            if booted is not None and not self.persistent_workers:
                booted.pool.shutdown()
            raise
        trial = self._worker_mode_trial()
        if booted is not None and (
            progress.done
            or not booted.fits(progress.epoch, progress.seed)
            or booted.pool.mode != self._worker_kind()
        ):
            # the epoch or its seed changed after iter() (a set_epoch, a draw from the
            # generator): worker_init_fn ran with another seed, so fresh workers start
            if not (self.persistent_workers and progress.done):
                booted.pool.shutdown()  # (a persistent pool is kept for the next epoch)
            reuse_pool = False
            booted = None
        if progress.done:
            return iter(())  # a state saved after the epoch's last batch: its end
        hooks = EpochHooks(
            deliver=self._deliver,
            record_bad_samples=self._bad_samples.record if self._bad_samples is not None else None,
            workers_changed=self._workers_changed,
            replace_pool=self._replace_pool if trial is not None else None,
        )
        if self.num_workers == 0:
            single = SingleProcessIterator(
                self._worker_spec(), hooks, progress=progress, index_iter=index_iter,
                first_position=first_position, stats=self._stats, take_backs=self._take_backs(),
            )  # fmt: skip
            self._engine = weakref.ref(single)
            return single
        if not self.persistent_workers:
            pool = booted.pool if booted is not None else self._new_pool()
            self._live_pool = weakref.ref(pool)  # for stats(); the iterator owns it
            self._autotuner = self._new_autotuner()
        else:
            if not reuse_pool:
                if self._pool_finalizer is not None:
                    self._pool_finalizer()  # a running pool of the kind "auto" left behind
                self._pool = self._new_pool()
                self._pool_finalizer = weakref.finalize(self, self._pool.shutdown)
                self._autotuner = self._new_autotuner()
            pool = self._pool
        multi = MultiWorkerIterator(
            self._epoch_plan(),
            hooks,
            pool,
            owns_pool=not self.persistent_workers,
            progress=progress,
            index_iter=index_iter,
            first_position=first_position,
            stats=self._stats,
            autotuner=self._autotuner,
            mode_trial=trial,
        )
        self._engine = weakref.ref(multi)
        return multi

    def _take_backs(self) -> int:
        """Deliveries a state may have to take back (stoker.torch's pinning thread reads ahead)."""
        return 0

    def _worker_mode_trial(self) -> ModeTrial | None:
        """worker_mode="auto": the measurement of threads against processes, while it runs."""
        if self.worker_mode != "auto" or self.num_workers == 0:
            return None
        if self._mode_trial is None and self._auto_refused is None:
            self._auto_refused = self._threads_refused()
            if not self._auto_refused:
                self._mode_trial = ModeTrial()
        trial = self._mode_trial
        return trial if trial is not None and trial.chosen is None else None

    def _threads_refused(self) -> str:
        """Why worker_mode="auto" may not run threads here ("" when it may)."""
        if self._iterable:
            return "an IterableDataset's streams are split by worker process"
        if self.worker_init_fn is not None:
            return "worker_init_fn may set up per-process state"
        if not is_thread_safe(self.dataset):
            return f"{type(self.dataset).__name__} does not declare thread_safe = True"
        collate = self._engine_collate
        if collate not in (default_collate, default_convert) and not is_thread_safe(collate):
            return "collate_fn does not declare thread_safe = True"
        return ""

    def _worker_kind(self) -> str:
        """The kind of workers a new pool gets: worker_mode, or what "auto" runs now."""
        if self.worker_mode != "auto":
            return self.worker_mode
        if self._mode_trial is not None:
            return self._mode_trial.chosen or self._mode_trial.current
        return "process"

    def _replace_pool(self, kind: str) -> Pool:
        """worker_mode="auto" switches kinds mid-epoch: a new pool; a persistent old one stops."""
        pool = self._new_pool(kind)
        if self.persistent_workers:
            if self._pool_finalizer is not None:
                self._pool_finalizer()
            self._pool = pool
            self._pool_finalizer = weakref.finalize(self, pool.shutdown)
        else:
            self._live_pool = weakref.ref(pool)
        return pool

    def _epoch_plan(self) -> EpochPlan:
        """How the engine runs this epoch; fixed when it starts."""
        return EpochPlan(
            iterable=self._iterable,
            auto_collation=self._auto_collation,
            in_order=self.in_order,
            timeout_s=float(self.timeout),
            restart_dead_workers=self.on_worker_death == "restart",
            copy_batches=self.copy_batches,
            prefetch_factor=self.prefetch_factor,  # type: ignore[arg-type]
            memory_budget=self.memory_budget,
            budget_is_users=self._memory_budget_given,
            dataset_name=type(self.dataset).__name__,
            dataset_has_len=self._iterable and _has_len(self.dataset),
            batches=None if self._iterable else _epoch_batches(self),
            take_backs=self._take_backs(),
        )

    def _workers_changed(self, num_workers: int, prefetch_factor: int) -> None:
        """The autotuner added a worker or raised the prefetch: the loader reports it."""
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor

    # -- epochs, seeds and resumable state --------------------------------------------
    def _start_epoch(self, *, new_pool: bool) -> tuple[Progress, Iterator[Any] | None, int]:
        """Decides the epoch, tells the sampler, records the start state, skips resumed batches.

        ``new_pool``: this epoch starts workers (or has none), so a torch.Generator gives
        a fresh base seed, as torch's loader draws one for every new iterator.
        """
        owner = epoch_owner(self._index_sampler) if not self._iterable else None
        resume, self._resume = self._resume, None
        skip, ahead = 0, ()
        draw = new_pool
        if resume is not None:
            epoch, skip, ahead = resume["epoch"], resume["batches"], resume.get("ahead", ())
            draw = self._restore_randomness(resume, draw)
        else:
            epoch = self._epoch = self._followed_epoch(owner)
            skip = self._skip_each_epoch
        if owner is not None:
            owner.set_epoch(epoch)
        if resume is not None and not self._iterable:
            try:
                _check_resumed_place(resume, _epoch_batches(self))
            except ValueError:
                self._resume = resume  # the loader stays where it was
                raise
        self._epoch = epoch + 1
        set_epoch = getattr(self.dataset, "set_epoch", None)
        if callable(set_epoch) and self.num_workers == 0:
            set_epoch(epoch)
        start: dict[str, Any] = {}
        sampler_state = getattr(self._index_sampler, "state_dict", None)
        if callable(sampler_state):
            start["sampler"] = sampler_state()
        if _is_torch_generator(self.generator):
            start["generator"] = self.generator.get_state()
            start["torch_draw"] = draw
        progress = Progress(
            epoch=epoch, seed=self._epoch_seed(epoch, draw=draw), start=start,
            yielded=skip + len(ahead), floor=skip, ahead=set(ahead),
        )  # fmt: skip
        self._progress = progress
        if self._iterable:
            if resume is not None and ("stream" in resume or "workers" in resume):
                self._resume_stream(resume, progress)
            elif skip:
                msg = (
                    f"this state is {skip} batches into epoch {epoch} of an IterableDataset but "
                    "holds no state of its stream to resume from; pass what state_dict() returned"
                )
                raise ValueError(msg)
            return progress, None, progress.samples
        self._pin_global_draws(resume, progress)
        index_iter, first_position = skip_batches(self._index_sampler, skip, self._auto_collation)
        if owner is not None:
            self._left_epoch = owner.epoch
        return progress, index_iter, first_position

    def _pin_global_draws(self, resume: Mapping[str, Any] | None, progress: Progress) -> None:
        """A sampler without a state of its own draws from the global generators: their states
        as its epoch starts are recorded, and a resumed epoch replays the sampler under the
        saved ones (the generators stay as the sampler leaves them, as in the saved run)."""
        if resume is not None and resume.get("globals") is not None:
            restore_global_generators(resume["globals"], self._index_sampler)
            progress.start["globals"] = resume["globals"]
        elif draws_unrecorded(self._index_sampler):
            progress.start["globals"] = global_generators(self._index_sampler)

    def _followed_epoch(self, owner: Any) -> int:
        """The epoch a new (not resumed) epoch starts as: the loader's next one, or the
        sampler's, if the user called its ``set_epoch`` since the last epoch started."""
        if owner is not None and self._left_epoch is not None and owner.epoch != self._left_epoch:
            return owner.epoch  # type: ignore[no-any-return]
        return self._epoch

    def _restore_randomness(self, resume: Mapping[str, Any], draw: bool) -> bool:
        """Puts the seeds, the sampler and the generator back as ``resume`` saved them.

        Returns whether a torch.Generator draws a base seed for the resumed epoch.
        """
        if resume.get("drew_seed") and self._seed is None:
            # the saved run drew its seed from the global generator when this epoch started
            # (or when the state was taken before it): draw it again, so that what draws
            # from that generator next (torch's RandomSampler without a generator, a
            # dataset's own draws) sees the same sequence as in the saved run
            self._fresh_seed()
        self._seed = resume["seed"]
        self._seed_drawn_at = resume["epoch"] if resume.get("drew_seed") else None
        if resume.get("sampler") is not None:
            self._index_sampler.load_state_dict(resume["sampler"])  # type: ignore[union-attr]
        if resume.get("generator") is not None:
            self.generator.set_state(resume["generator"])
        if resume.get("torch_seed") is not None:
            self._torch_seed = (resume["torch_seed"], resume["torch_seed_epoch"])
            draw = resume["torch_draw"]
        return draw

    def _resume_stream(self, resume: Mapping[str, Any], progress: Progress) -> None:
        """Gives each shard of the stream the state it opens from (see _stream_state).

        A state saved with ``num_workers=0`` resumes with 1 worker and the other way round:
        both read the one shard of the stream, in the same order with the same seeds. A
        state of the main process's dataset before its iteration began (an epoch's start)
        resumes with any number of workers: they copy the dataset it is loaded into.
        """
        if "workers" in resume:
            workers = resume["workers"]
            saved, streams, next_worker = (
                workers["num_workers"],
                dict(workers["streams"]),
                workers["next"],
            )
        else:
            saved, streams, next_worker = 0, {0: resume["stream"]}, 0
        if saved != self.num_workers and {saved, self.num_workers} != {0, 1}:
            if saved == 0 and _before_iter(streams[0]):
                self.dataset.load_state_dict(streams[0]["dataset"])  # the workers copy it
                return
            streams, next_worker = self._regrouped_streams(resume, saved, streams), 0
        progress.resume_streams = streams
        progress.next_worker = next_worker
        replayed = {w: s["taken"] for w, s in streams.items() if _replays(s)}
        if replayed:
            where = (
                ", ".join(f"worker {w}: {n}" for w, n in sorted(replayed.items()))
                if self.num_workers
                else f"the stream: {replayed[0]}"
            )
            self._note(
                f"resume: {type(self.dataset).__name__} keeps no state, so the resumed epoch "
                f"replays the {sum(replayed.values())} samples delivered before the state was "
                f"saved ({where}) and drops them"
            )

    def _regrouped_streams(
        self, resume: Mapping[str, Any], saved: int, streams: Mapping[int, Any]
    ) -> dict[int, Any]:
        """A stream's state saved by ``saved`` workers, for this loader's other worker count.

        Only a dataset that knows which records each old worker's stream delivered can
        regroup (stoker's file readers: :mod:`stoker.streams._regroup`); every new worker
        opens from the same state and skips them. Any other stream is refused.
        """
        regroup = getattr(self.dataset, "_regrouped_state", None)
        if not callable(regroup) or any(
            s.get("iterator") is not None or s.get("replay") for s in streams.values()
        ):
            raise ValueError(self._worker_count_refusal(resume, saved, streams))
        state = regroup(
            {w: (s.get("dataset"), bool(s.get("ended"))) for w, s in streams.items()}, saved
        )
        self._note(
            f"resume: {type(self.dataset).__name__}'s state was saved by a loader with "
            f"num_workers={saved}, and this one has {self.num_workers}: the records its "
            "streams delivered are skipped, each other record of the epoch is read once, in "
            "this loader's order"
        )
        entry = {"dataset": state, "iterator": None, "taken": 0, "ended": False, "replay": False}
        return {w: dict(entry) for w in range(max(self.num_workers, 1))}

    def _worker_count_refusal(
        self, resume: Mapping[str, Any], saved: int, streams: Mapping[int, Any]
    ) -> str:
        if resume["batches"] == 0 and all(_before_iter(s) for s in streams.values()):
            return (
                f"this state was saved at the start of epoch {resume['epoch']} by a loader whose "
                f"{saved} persistent workers each held their own copy of "
                f"{type(self.dataset).__name__}, with its own state, and this one has "
                f"num_workers={self.num_workers}: each copy resumes in its own worker. Pass "
                f"num_workers={saved}, or save the state before the workers start to change it."
            )
        return (
            f"this state was saved mid-epoch by a loader with num_workers={saved}, and this "
            f"one has num_workers={self.num_workers}: each worker of an IterableDataset "
            f"reads its own shard of the stream, and {type(self.dataset).__name__} cannot say "
            "which records each shard delivered, so it resumes only with the same number of "
            "workers (or with 0 and 1 workers, which read the same single shard). Pass "
            f"num_workers={saved}, or save at an epoch boundary to change it; stoker's file "
            "readers (TextLines, JsonLines, TarShards) resume with any number."
        )

    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands, to resume exactly there with :meth:`load_state_dict`.

        Valid at any point: mid-epoch (with or without workers, in order or not), at an
        epoch boundary, after the last batch. Small (no batch is stored: the place the
        epoch has reached, and with ``in_order=False`` the few batches delivered beyond
        it). With a map-style dataset the number of workers may differ when it is loaded.
        A mid-epoch state of an IterableDataset holds each stream's state (its dataset's
        and its iterator's ``state_dict()``, or, with neither, the count of samples it
        delivered, which a resumed loader replays) and resumes with the same number of
        process workers, or moves between ``num_workers=0`` and ``1`` (one shard either
        way); any other change raises a ``ValueError`` naming both numbers
        (``docs/streams.md``). With workers, taking it asks each worker for its stream's
        state. Custom samplers take part by implementing ``state_dict`` / ``load_state_dict``.
        """
        return self._state(held=0)

    def _state(self, *, held: int, finished: bool | None = None) -> dict[str, Any]:
        """:meth:`state_dict`, as if the last ``held`` deliveries had not reached the loop.

        ``finished``: whether the loop has seen the epoch's ``StopIteration`` (default: what
        the loader's iterator saw; a pinning thread that reads ahead says for its consumer).
        Until it has, a state after the last batch is the end of this epoch: the resumed
        ``iter()`` yields nothing and the one after it starts the next epoch.
        """
        if self._resume is not None:
            return dict(self._resume)
        progress = self._progress
        if finished is None:
            finished = progress is not None and progress.finished
        finished = progress is not None and held == 0 and finished
        torch_generator = _is_torch_generator(self.generator)
        if progress is None or finished:
            state: dict[str, Any] = {"epoch": self._epoch, "batches": 0}
            sampler_state = getattr(self._index_sampler, "state_dict", None)
            state["sampler"] = sampler_state() if callable(sampler_state) else None
            if self._seed is None and not torch_generator:
                # pin the seed the next epoch will use, drawn now as its start would draw it
                # (after the sampler's state, which may draw the sampler's seed)
                self._seed_drawn_at = self._epoch
                self._base_seed()
            if not self._iterable and draws_unrecorded(self._index_sampler):
                # what a sampler drawing from them would find if the next epoch started now
                state["globals"] = global_generators(self._index_sampler)
            state["generator"] = self.generator.get_state() if torch_generator else None
            # the next epoch draws a base seed unless persistent workers carry this one on
            state["torch_draw"] = not (
                self._pool is not None and self._pool.state is PoolState.RUNNING
            )
        else:
            state = mid_epoch_state(progress, held)
        if self._iterable:  # what the stream needs, whenever the state is taken
            state.update(self._stream_state(progress, held, at_start=progress is None or finished))
        if torch_generator and self._torch_seed is not None:
            state["torch_seed"], state["torch_seed_epoch"] = self._torch_seed
        else:
            del state["torch_draw"]
        state["seed"] = self._seed
        if self._seed_drawn_at is not None and self._seed_drawn_at == state["epoch"]:
            state["drew_seed"] = True
        state["version"] = STATE_VERSION
        return state

    def _stream_state(
        self, progress: Progress | None, held: int, *, at_start: bool
    ) -> dict[str, Any]:
        """Where an iterable dataset's streams stand (NOTE [ Stream states ] in
        :mod:`stoker.engine.stream_state`), for :meth:`state_dict`.

        Mid-epoch: each stream's state after the last of its batches you received (not the
        batches loaded ahead), asked of the workers now, and the worker whose batch comes
        next. ``at_start`` (the next epoch's start): what the next epoch's streams open
        from, the dataset's own state now (the main process's, or each persistent worker's).
        """
        owner = type(self.dataset).__name__
        threads = self.num_workers > 0 and self.worker_mode == "thread"
        if threads and at_start:
            return {}  # the next epoch's threads iterate the dataset object as it is then
        if threads and holds_state(self.dataset):
            msg = (
                "cannot save a mid-epoch state of this IterableDataset loader: its "
                f"{self.num_workers} thread workers share one {owner} object, so it holds one "
                "place for all of them; use process workers. Save at an epoch boundary, or "
                "resume streams from a dataset that implements state_dict / load_state_dict "
                "(stoker's stream readers do)."
            )
            raise ValueError(msg)
        if at_start:
            streams, next_worker = self._start_streams(), 0
        else:
            streams, next_worker = self._running_streams(progress, held)  # type: ignore[arg-type]
        if any(_replays(s) for s in streams.values()):
            self._note(
                f"state_dict: {owner} has no state_dict / load_state_dict, nor has the iterator "
                "its __iter__ returns, so this state only counts the samples each stream "
                "delivered: resuming from it replays them and drops them. Give the dataset or "
                "its iterator state_dict / load_state_dict to resume without reading them again."
            )
        if self.num_workers == 0:
            return {"stream": streams[0]} if 0 in streams else {}
        if at_start and not streams:
            return {}
        return {
            "workers": {"num_workers": self.num_workers, "streams": streams, "next": next_worker}
        }

    def _start_streams(self) -> dict[int, Any]:
        """What the next epoch's streams open from (see _stream_state), by worker."""
        if self.num_workers == 0:
            try:
                state = start_state(self.dataset)
            except Exception as exc:  # a state_dict() that needs a running iteration
                if not self._start_state_warned:
                    self._start_state_warned = True
                    name = type(self.dataset).__name__
                    _log.warning(
                        "state_dict: %s.state_dict() raised %s (%s) before its iteration began, "
                        "so this state holds no state of %s: a loader resumed from it starts "
                        "%s as it is built",
                        name, type(exc).__name__, exc, name, name,
                    )  # fmt: skip
                return {}
            return {} if state is None else {0: state}
        pool = self._pool
        if self.persistent_workers and pool is not None and pool.state is PoolState.RUNNING:
            return next_epoch_streams(pool, self._epoch)
        return {}  # the next epoch's workers copy the dataset as it is then

    def _running_streams(self, progress: Progress, held: int) -> tuple[dict[int, Any], int]:
        """Each stream's state now, from the live engine or what it kept when it closed."""
        if progress.done and held == 0 and self.num_workers:
            # the engine saw the epoch's end, the loop not yet (a pinning thread ran ahead):
            # every stream ended; persistent workers' copies carry their state on
            return self._ended_streams(), 0
        with progress.stream_lock:
            taken_back = progress.taken_back_streams
            if progress.done and taken_back is not None:
                # ... and the pinning thread still holds ``held`` batches: the workers were
                # asked where their streams stood before them as the epoch ended
                if isinstance(taken_back, BaseException):
                    raise taken_back
                if held not in taken_back:
                    raise AssertionError(f"cannot take back {held} deliveries of an ended epoch")
                return taken_back[held]
            kept = progress.kept_streams
            if kept is None:
                engine = self._engine() if self._engine is not None else None
                if engine is None:
                    raise AssertionError("the epoch's engine is gone and kept no stream state")
                return engine.stream_states(held)
        if isinstance(kept, BaseException):
            raise kept
        if held:
            raise AssertionError(f"cannot take back {held} deliveries of a closed epoch")
        return kept

    def _ended_streams(self) -> dict[int, Any]:
        """Every worker's stream at its end: what the next epoch starts from, and no more."""
        copies = self._start_streams() if self.persistent_workers else {}
        ended = {"dataset": None, "iterator": None, "taken": 0, "ended": True, "replay": False}
        return {w: {**ended, **copies.get(w, {}), "ended": True} for w in range(self.num_workers)}

    def _note(self, text: str) -> None:
        """A note for stats() and the log, once: what a state or a resume costs."""
        if self._stats.note(text):
            _log.warning("%s", text)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Makes the next ``iter(loader)`` continue from ``state`` (see :meth:`state_dict`)."""
        self._resume = check_state(state, self._index_sampler)
        self._progress = None
        if self._iterable and self._pool is not None:
            # each stream opens from the loaded state in a new worker, as in a new loader (the
            # running workers' copies of the dataset hold where their streams went since)
            self.close()

    def stats(self) -> LoaderStats:
        """Time per stage, throughput, bytes in flight and the slowest work so far.

        See :mod:`stoker.profiling.stats` for the stages. Cheap enough to leave on.
        """
        pool = self._pool
        if pool is None and self._live_pool is not None:
            pool = self._live_pool()
        if pool is not None and pool.state is not PoolState.RUNNING:
            pool = None
        in_flight = pool.slots.nbytes if (pool is not None and pool.slots is not None) else 0
        tuner = self.__dict__.get("_autotuner")
        pids = dict(pool.pids) if (pool is not None and pool.mode == "process") else None
        history = [*(tuner.history if tuner is not None else ()), *self._mode_history()]
        out = self._stats.snapshot(in_flight, history, pids)
        out.worker_mode = pool.mode if pool is not None else ""
        return out

    def _mode_history(self) -> list[str]:
        """What worker_mode="auto" measured and chose, for stats()."""
        if self._mode_trial is not None:
            return list(self._mode_trial.history)
        if self._auto_refused:
            return [f"worker_mode auto: processes, since {self._auto_refused}"]
        return []

    def error_report(self) -> ErrorReport:
        """Every sample skipped so far under ``on_error="skip"`` (empty otherwise).

        Prints as a summary; iterate it for :class:`~stoker.bad_samples.SkippedSample`
        records (index, source file, exception type and message, traceback tail).
        """
        if self._bad_samples is None:
            return ErrorReport([], 0)
        return self._bad_samples.report()

    def _epoch_seed(self, epoch: int, *, draw: bool) -> int:
        """The epoch's seed: keys every random scope and each worker's own seed.

        With a torch.Generator one int64 is drawn from it as torch's loader draws its
        base seed (before the sampler draws), so shuffled orders equal torch's in every
        epoch: each epoch draws, except with persistent workers, which draw once, when
        they start. An epoch that does not draw derives its seed from the last draw.
        """
        if not _is_torch_generator(self.generator):
            if self._seed is None:
                self._seed_drawn_at = epoch
            return _derive_epoch_seed(self._base_seed(), epoch)
        if draw or self._torch_seed is None:
            self._torch_seed = (_draw_torch_base_seed(self.generator), epoch)
        return _torch_epoch_seed(self._torch_seed, epoch)

    def _new_autotuner(self) -> AutoTuner | None:
        tune_workers, tune_prefetch = self._autotune_flags
        if not (tune_workers or tune_prefetch):
            return None
        if self.__dict__.get("_autotuner") is not None and not self.persistent_workers:
            return self._autotuner  # keep what earlier epochs learned
        return AutoTuner(
            tune_workers,
            tune_prefetch,
            max_workers=self._max_workers(),
            memory_budget=self.memory_budget,
        )

    def _max_workers(self) -> int:
        """How far ``num_workers="auto"`` may grow: this machine's cores, or the Ray cluster's."""
        if self.ray_workers is not None:
            return self.ray_workers.max_actors()
        return usable_cpus()

    def _deliver(self, batch: Any) -> Any:
        """The last step before a batch reaches the user (stoker.torch converts to tensors)."""
        return batch

    def _pool_worker_init_fn(self) -> Callable[[int], None] | None:
        """What every worker of a new pool runs first (stoker.torch adds datapipe sharding)."""
        return self.worker_init_fn

    def _new_pool(self, kind: str | None = None) -> Pool:
        kind = kind or self._worker_kind()
        if self.ray_workers is not None:
            return RayPool(self._worker_spec(), self.num_workers, self.ray_workers, self._stats)
        if kind == "process" and not self._copy_on_read_checked:
            self._copy_on_read_checked = True
            self._check_copy_on_read()
        return WorkerPool(self._worker_spec(), self.num_workers, kind, self.multiprocessing_context)

    def _check_copy_on_read(self) -> None:
        """Warns about (or compacts) dataset attributes each process worker would copy."""
        found = find_large_containers(self.dataset)
        if self.compact_dataset and found:
            done = set(compact_large_containers(found))
            found = [container for container in found if container.where not in done]
            if done:
                _log.info("compact_dataset: compacted %s", ", ".join(sorted(done)))
        method = start_method(self.multiprocessing_context)
        for container in found:
            warnings.warn(warning_text(container, method), UserWarning, stacklevel=5)

    def _worker_spec(self) -> WorkerSpec:
        """What to load: the dataset, how to batch it, how a worker starts."""
        return WorkerSpec(
            dataset=self.dataset,
            iterable=self._iterable,
            auto_collation=self._auto_collation,
            collate_fn=self._engine_collate,
            batch_size=self.batch_size,
            drop_last=self.drop_last,
            worker_init_fn=self._pool_worker_init_fn(),
            num_workers=self.num_workers,
            threads=self.worker_threads,
            skip_errors=self._bad_samples is not None,
            segment_prefix=None,
        )

    def close(self) -> None:
        """Stops the running epoch and persistent workers, frees their shared memory; safe
        to call twice, and from another thread (a ``next()`` waiting there raises
        StopIteration).

        Iterators of non-persistent loaders also clean up when exhausted, closed or
        garbage collected; see NOTE [ Shutdown ] in :mod:`stoker.engine.pool`.
        """
        engine = self._engine() if self._engine is not None else None
        close_epoch = getattr(engine, "close", None)
        if close_epoch is not None:
            close_epoch()  # the running epoch too: a next() waiting in another thread ends
        if self._pool_finalizer is not None:
            self._pool_finalizer()
        self._pool = None

    def __enter__(self) -> DataLoader[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"DataLoader(dataset={type(self.dataset).__name__}, batch_size={self.batch_size}, "
            f"num_workers={self.num_workers}, worker_mode={self.worker_mode!r})"
        )


class _EpochIterator:
    """What ``iter(loader)`` returns: its workers start now, the epoch at its first ``next()``.

    Until then nothing about the epoch is decided: its number (so a ``set_epoch`` call
    after ``iter()`` still counts), the sampler's order, the tasks. ``close()`` before the
    first ``next()`` stops the workers it started and leaves the loader's epoch untouched.
    """

    __slots__ = (
        "__weakref__", "_booted", "_closed", "_inner", "_length", "_loader", "_lock",
        "_processes", "_progress", "_stop_booted", "_yielded",
    )  # fmt: skip

    def __init__(self, loader: DataLoader[Any]) -> None:
        self._loader = loader
        self._inner: Any = None
        self._closed = False
        self._yielded = 0
        self._length = loader._length_reported
        self._processes: list[Any] | None = None
        self._progress: Progress | None = None  # the epoch's, once it started
        # one next() at a time: threads sharing the iterator take turns, each batch once
        self._lock = threading.Lock()
        self._stop_booted: weakref.finalize | None = None
        self._booted = loader._boot()
        if self._booted is not None and not loader.persistent_workers:
            # workers this iterator owns until its epoch takes them (or it is dropped unused)
            self._stop_booted = weakref.finalize(self, self._booted.pool.shutdown)

    def __iter__(self) -> _EpochIterator:
        return self

    def __next__(self) -> Any:
        with self._lock:
            return self._next()

    def _next(self) -> Any:
        inner = self._inner
        if inner is None:
            if self._closed:
                raise StopIteration
            inner = self._begin()
        try:
            batch = next(inner)
        except StopIteration:
            if self._progress is not None:
                self._progress.finished = True
            self._check_length_at_end()
            raise
        self._yielded += 1
        if self._length is not None and self._yielded > self._length:
            _warn_longer_than_len(self._loader, self._length, self._yielded)
        return batch

    def _check_length_at_end(self) -> None:
        """An IterableDataset with a length, read by several workers, that yielded more than
        its length said: its workers duplicated it (said at the end, when nobody asked len())."""
        loader = self._loader
        if self._length is not None or not loader._iterable or loader.num_workers < 2:
            return
        try:
            length = len(loader)
        except TypeError:
            return
        if self._yielded > length:
            _warn_longer_than_len(loader, length, self._yielded, asked=False)

    def __len__(self) -> int:
        return len(self._loader)

    @property
    def _workers(self) -> list[Any]:
        """torch's name for its iterator's worker processes (``multiprocessing.Process``).

        Code written for torch's loader reads it right after ``iter()``, when torch's
        workers have started; reading it starts this epoch's workers too.
        """
        if self._processes is None:
            self.start()
            start_all = getattr(self._inner, "start_all_workers", None)
            if start_all is not None:
                start_all()
            pool = getattr(self._inner, "_pool", None)
            self._processes = pool.processes() if pool is not None else []
        return self._processes

    def start(self) -> None:
        """Starts the epoch now, in the calling thread, without loading a batch.

        Workers are started by the thread that starts the epoch and are tied to it, so
        a helper thread that consumes this iterator (stoker.torch's pinning thread)
        has the trainer's thread start it first.
        """
        with self._lock:
            if self._inner is None and not self._closed:
                self._begin()

    def _begin(self) -> Any:
        """Starts the epoch: its engine iterator, and the progress its end is recorded in."""
        loader = self._loader
        booted, self._booted = self._booted, None
        if self._stop_booted is not None:
            self._stop_booted.detach()  # the epoch's iterator owns the workers now
            self._stop_booted = None
        inner = self._inner = loader._begin_epoch(booted)
        self._progress = loader._progress
        return inner

    def close(self) -> None:
        """Stops the epoch (its workers, unless persistent); safe to call twice."""
        self._closed = True
        if self._stop_booted is not None:
            self._stop_booted()
        close = getattr(self._inner, "close", None)
        if close is not None:
            close()


def _before_iter(stream: Mapping[str, Any]) -> bool:
    """A stream's state that is only its dataset's, from before its iteration began."""
    return (
        stream.get("iterator") is None
        and not stream.get("taken")
        and not stream.get("ended")
        and not stream.get("replay")
    )


def _replays(stream: Mapping[str, Any]) -> bool:
    """A stream's state that resumes by drawing its delivered samples again."""
    return bool(stream.get("replay")) and not stream.get("ended") and stream.get("taken", 0) > 0


def _epoch_batches(loader: DataLoader[Any]) -> int | None:
    """Batches in a map-style epoch (skipped ones included), or None without a length."""
    try:
        return len(loader._index_sampler)  # type: ignore[arg-type]
    except TypeError:
        return None


def _check_resumed_place(resume: Mapping[str, Any], batches: int | None) -> None:
    """Refuses a state whose place is past the end of the epoch it resumes."""
    if batches is None:
        return
    last = max([resume["batches"], *(b + 1 for b in resume.get("ahead", ()))])
    if last > batches:
        msg = (
            f"the loader state is {resume['batches']} batches into epoch {resume['epoch']}"
            + (f" (and delivered batches {resume['ahead']})" if resume.get("ahead") else "")
            + f", but this loader's epoch has {batches} batches: the state was saved by a "
            "loader over another dataset, sampler or batch size, or edited. Build the loader "
            "as the saved one was built."
        )
        raise ValueError(msg)


def _has_len(dataset: Any) -> bool:
    try:
        len(dataset)
    except Exception:
        return False
    return True


def _warn_longer_than_len(
    loader: DataLoader[Any], length: int, fetched: int, *, asked: bool = True
) -> None:
    """torch's warning: an IterableDataset loader yields more than ``len(loader)`` said.

    ``asked=False``: nobody asked ``len()``; the epoch just ended with more batches than it.
    """
    dataset = loader.dataset
    shard = (
        "each worker iterates all of it unless its __iter__ shards it by worker (stoker.sharding "
        "splits files, then records, by rank and worker)."
    )
    if not asked:
        msg = (
            f"IterableDataset {dataset} has {len(dataset)} samples ({length} batches), but its "
            f"{loader.num_workers} workers delivered {fetched} batches this epoch: {shard}"
        )
    else:
        if loader.batch_size in (None, 1):
            msg = (
                f"Length of IterableDataset {dataset} was reported to be {length} (when accessing "
                f"len(dataloader)), but {fetched} samples have been fetched. "
            )
        else:
            msg = (
                f"len(dataloader) of IterableDataset {dataset} was reported to be {length} "
                f"batches, but {fetched} batches have been fetched. "
            )
        if loader.num_workers > 0:
            msg += (
                "For multiprocessing data-loading, this could be caused by not properly "
                f"configuring the IterableDataset replica at each worker: {shard}"
            )
        else:
            msg += "The dataset's __len__ does not match what its __iter__ yields."
    warnings.warn(msg, UserWarning, stacklevel=3)


def _without_draws(draw: Callable[[], int]) -> int:
    """What ``draw()`` returns, with numpy's and torch's global generators left as they were."""
    numpy_state = np.random.get_state()
    torch = sys.modules.get("torch")
    torch_state = torch.random.get_rng_state() if torch is not None else None
    try:
        return draw()
    finally:
        np.random.set_state(numpy_state)
        if torch_state is not None:
            torch.random.set_rng_state(torch_state)


def _torch_epoch_seed(torch_seed: tuple[int, int], epoch: int) -> int:
    """Epoch ``epoch``'s seed from a torch.Generator's last base seed and the epoch it was
    drawn for: that seed itself, or one derived from it for a later epoch."""
    seed, drawn_at = torch_seed
    return seed if epoch == drawn_at else _derive_epoch_seed(seed, epoch)


def _peek_torch_base_seed(generator: Any, state: Any = None) -> int:
    """The base seed :func:`_draw_torch_base_seed` would draw from ``generator`` (from
    ``state``, when given), drawn from a copy."""
    import torch

    copy = torch.Generator(device=generator.device)
    copy.set_state(generator.get_state() if state is None else state)
    seed = _draw_torch_base_seed(copy)
    assert seed is not None
    return seed


def _draw_torch_base_seed(generator: Any) -> int | None:
    """Advances a torch.Generator exactly as torch's loader iterator does; returns the draw.

    torch draws one int64 "base seed" from the loader's generator every epoch, before
    the sampler runs; doing the same keeps shuffled orders equal to torch's.
    """
    if not _is_torch_generator(generator):
        return None
    import torch

    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


def _warn_pin_memory() -> None:
    msg = (
        "pin_memory=True has no effect on stoker.DataLoader: it returns numpy batches, and only "
        "torch tensors can be pinned. Use stoker.torch.DataLoader to get pinned torch tensors."
    )
    warnings.warn(msg, UserWarning, stacklevel=3)
