"""The DataLoader's argument rules: torch's, with torch's words first and stoker's advice after.

:func:`check_arguments` validates every argument of :class:`stoker.DataLoader` before the
loader builds anything and returns them normalised in one frozen :class:`Arguments`:
integers as ``int`` (numpy integers are accepted, as torch accepts them), ``"auto"``
resolved to a starting count with a flag saying it is tuned, a start-method name
resolved to a context. Each message begins with the phrase torch's loader uses for the
same mistake, so code and tests that match torch's messages keep working, and goes on
to say what to do.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import multiprocessing.context
import os
import warnings
from typing import Any

from stoker._proc import usable_cpus
from stoker._validate import check_bool, check_choice, check_int, check_seconds
from stoker.datasets import is_iterable_dataset
from stoker.engine.ray_workers import ray_options

__all__ = ["Arguments", "check_arguments", "warn_excessive_workers"]

WORKER_MODES = ("process", "thread", "auto", "ray")  # or a stoker.RayWorkers
ON_WORKER_DEATH = ("raise", "restart")
ON_ERROR = ("raise", "skip")


@dataclasses.dataclass(frozen=True, slots=True)
class Arguments:
    """The loader's arguments after :func:`check_arguments`."""

    iterable: bool
    batch_size: int | None
    shuffle: bool | None
    drop_last: bool
    num_workers: int
    tune_workers: bool
    prefetch_factor: int | None
    tune_prefetch: bool
    timeout: float
    multiprocessing_context: Any
    persistent_workers: bool
    in_order: bool
    copy_batches: bool
    worker_threads: int | None
    memory_budget: int | None
    compact_dataset: bool


def check_arguments(
    dataset: Any,
    *,
    batch_size: Any,
    shuffle: Any,
    sampler: Any,
    batch_sampler: Any,
    num_workers: Any,
    collate_fn: Any,
    drop_last: Any,
    timeout: Any,
    worker_init_fn: Any,
    multiprocessing_context: Any,
    prefetch_factor: Any,
    persistent_workers: Any,
    pin_memory: Any,
    in_order: Any,
    worker_mode: Any,
    on_worker_death: Any,
    copy_batches: Any,
    worker_threads: Any,
    on_error: Any,
    memory_budget: Any,
    compact_dataset: Any = False,
) -> Arguments:
    """Validates a DataLoader's arguments in torch's order; returns them normalised."""
    iterable = is_iterable_dataset(dataset)
    tune_workers = isinstance(num_workers, str) and num_workers == "auto"
    tune_prefetch = isinstance(prefetch_factor, str) and prefetch_factor == "auto"
    if tune_workers:
        num_workers = max(1, usable_cpus() // 2) if not iterable else usable_cpus()
    num_workers = check_int(
        "num_workers", num_workers, minimum=0,
        message="num_workers option should be non-negative (an integer, or 'auto')",
        hint="use num_workers=0 to load in the main process, or 'auto' to let stoker tune it",
    )  # fmt: skip
    timeout = check_seconds(
        "timeout",
        timeout,
        message="timeout option should be non-negative (seconds)",
        hint="0 waits forever",
    )
    if tune_prefetch:
        if num_workers == 0:
            msg = (
                "prefetch_factor='auto' tunes background workers' buffers; pass num_workers > "
                "0 or 'auto'"
            )
            raise ValueError(msg)
        prefetch_factor = 2
    elif prefetch_factor is not None:
        if num_workers == 0:
            msg = (
                "prefetch_factor option could only be specified in multiprocessing: "
                f"prefetch_factor={prefetch_factor!r} applies to background workers. Pass "
                "num_workers > 0, or leave prefetch_factor unset (None)."
            )
            raise ValueError(msg)
        prefetch_factor = check_int("prefetch_factor", prefetch_factor, minimum=1)
    elif num_workers > 0:
        prefetch_factor = 2
    persistent_workers = check_bool("persistent_workers", persistent_workers)
    if persistent_workers and num_workers == 0:
        msg = (
            "persistent_workers option needs num_workers > 0: pass num_workers > 0, or "
            "persistent_workers=False"
        )
        raise ValueError(msg)
    multiprocessing_context = _check_context(multiprocessing_context, num_workers)
    check_bool("pin_memory", pin_memory)
    in_order = check_bool("in_order", in_order)
    copy_batches = check_bool("copy_batches", copy_batches)
    if ray_options(worker_mode) is None:
        check_choice("worker_mode", worker_mode, WORKER_MODES)
    check_choice("on_worker_death", on_worker_death, ON_WORKER_DEATH)
    check_choice("on_error", on_error, ON_ERROR)
    if worker_init_fn is not None and not callable(worker_init_fn):
        msg = f"worker_init_fn must be callable (it receives the worker id), got {worker_init_fn!r}"
        raise TypeError(msg)
    if collate_fn is not None and not callable(collate_fn):
        msg = f"collate_fn must be callable (it receives a list of samples), got {collate_fn!r}"
        raise TypeError(msg)
    if worker_threads is not None:
        worker_threads = check_int(
            "worker_threads", worker_threads, minimum=1, hint="or None to leave thread pools alone"
        )
    if memory_budget is not None:
        memory_budget = check_int(
            "memory_budget",
            memory_budget,
            minimum=1,
            hint="bytes, or None for a quarter of available memory",
        )

    if iterable and on_error == "skip":
        msg = (
            f"on_error='skip' leaves bad samples of a map-style dataset out by index, and "
            f"{type(dataset).__name__} is an IterableDataset, whose samples have no index to skip. "
            "Handle bad records inside the stream: stoker's stream readers (TextLines, JsonLines, "
            "TarShards) take on_error='skip' themselves."
        )
        raise ValueError(msg)
    if iterable:
        for name, value in (
            ("shuffle", shuffle),
            ("sampler", sampler),
            ("batch_sampler", batch_sampler),
        ):
            given = value not in (None, False) if name == "shuffle" else value is not None
            if given:
                msg = (
                    f"DataLoader with IterableDataset: expected unspecified {name} option, but "
                    f"got {name}={value!r}. The dataset's own iterator decides the order: "
                    "shuffle inside it (stoker's readers take shuffle_buffer=N, and "
                    "stoker.ShuffleBuffer(dataset, size) wraps any iterable dataset), or use a "
                    "map-style dataset."
                )
                raise ValueError(msg)
    else:
        if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
            msg = (
                f"dataset must be map-style (define __getitem__ and __len__) or an "
                f"IterableDataset (define __iter__), got {type(dataset).__name__}"
            )
            raise TypeError(msg)
        shuffle = bool(shuffle)

    if sampler is not None and shuffle:
        msg = (
            "sampler option is mutually exclusive with shuffle: the sampler already decides the "
            "order. Drop shuffle=True, or pass a shuffling sampler such as RandomSampler."
        )
        raise ValueError(msg)
    if batch_sampler is not None:
        if batch_size != 1 or shuffle or sampler is not None or drop_last:
            msg = (
                "batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, "
                "and drop_last: the batch sampler already decides batch size, order and the last "
                "batch. Leave those four at their defaults."
            )
            raise ValueError(msg)
        batch_size, drop_last = None, False
    elif batch_size is None:
        if drop_last:
            msg = (
                "batch_size=None option disables auto-batching and is mutually exclusive with "
                "drop_last=True: there is nothing to drop. Pass a batch_size, or drop_last=False."
            )
            raise ValueError(msg)
    else:
        batch_size = check_int(
            "batch_size", batch_size, minimum=1, hint="or None to load unbatched samples"
        )
    drop_last = check_bool("drop_last", drop_last)
    return Arguments(
        iterable=iterable,
        batch_size=batch_size,
        shuffle=shuffle,
        drop_last=drop_last,
        num_workers=num_workers,
        tune_workers=tune_workers and not iterable,
        prefetch_factor=prefetch_factor,
        tune_prefetch=tune_prefetch,
        timeout=timeout,
        multiprocessing_context=multiprocessing_context,
        persistent_workers=persistent_workers,
        in_order=in_order,
        copy_batches=copy_batches,
        worker_threads=worker_threads,
        memory_budget=memory_budget,
        compact_dataset=check_bool("compact_dataset", compact_dataset),
    )


def _check_context(context: Any, num_workers: int) -> Any:
    if context is None:
        return None
    if num_workers == 0:
        msg = (
            "multiprocessing_context can only be used with multi-process loading (num_workers > "
            f"0), but got num_workers=0 and multiprocessing_context={context!r}: pass "
            "num_workers > 0, or leave multiprocessing_context unset"
        )
        raise ValueError(msg)
    if isinstance(context, str):
        methods = multiprocessing.get_all_start_methods()
        if context not in methods:
            msg = (
                "multiprocessing_context option should specify a valid start method in "
                f"{methods!r}, but got multiprocessing_context={context!r}"
            )
            raise ValueError(msg)
        return multiprocessing.get_context(context)
    if not isinstance(context, multiprocessing.context.BaseContext):
        msg = (
            "multiprocessing_context option should be a valid context object or a string "
            "specifying the start method ('fork', 'forkserver', 'spawn'), but got "
            f"multiprocessing_context={context!r}"
        )
        raise TypeError(msg)
    return context


def warn_excessive_workers(num_workers: int, *, stacklevel: int = 3) -> None:
    """Warns, as torch's loader does, when more workers are asked for than CPUs may run them."""
    if num_workers <= 1:
        return
    cpus = usable_cpus()
    if num_workers <= cpus:
        return
    where = "this process may use" if hasattr(os, "sched_getaffinity") else "this machine has"
    msg = (
        f"This DataLoader will create {num_workers} worker processes in total, more than the "
        f"{cpus} CPUs {where}. Please be aware that excessive worker creation might get "
        f"DataLoader running slow or even freeze: lower num_workers to {cpus} or fewer, or pass "
        "num_workers='auto' to let stoker find the best count."
    )
    warnings.warn(msg, UserWarning, stacklevel=stacklevel)
