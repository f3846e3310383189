"""``get_worker_info()``: which worker is running this code, if any."""

from __future__ import annotations

import random
import sys
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["WorkerInfo", "WorkerRNG", "get_worker_info"]

_local = threading.local()
_SEED_MASK = 0xFFFF_FFFF_FFFF_FFFF  # torch.Generator.manual_seed takes 64-bit seeds


@dataclass(frozen=True, slots=True)
class WorkerRNG:
    """A thread worker's own random generators (``WorkerInfo.rng``).

    Thread workers share the trainer's global generators, so draws that must form a
    stream of the worker's own come from these, seeded from the worker's seed at the
    start of every epoch. For augmentations that do not depend on the number of
    workers, prefer :func:`stoker.sample_rng` or the global functions.

    Attributes:
        random_generator: a ``random.Random``.
        numpy_generator: a ``numpy.random.Generator``.
        torch_generator: a CPU ``torch.Generator``, or ``None`` while torch is not
            imported (stoker never imports it for you).

    Example:
        >>> from stoker import WorkerRNG
        >>> a, b = WorkerRNG.seeded(7), WorkerRNG.seeded(7)
        >>> a.numpy_generator.integers(100) == b.numpy_generator.integers(100)
        True
    """

    random_generator: random.Random
    numpy_generator: np.random.Generator
    torch_generator: Any = None

    @classmethod
    def seeded(cls, seed: int) -> WorkerRNG:
        torch = sys.modules.get("torch")
        torch_generator = (
            torch.Generator().manual_seed(seed & _SEED_MASK) if torch is not None else None
        )
        return cls(random.Random(seed), np.random.default_rng(seed), torch_generator)


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """What a dataset can learn about the worker it runs in (torch's ``WorkerInfo``).

    Attributes:
        id: the worker's index, ``0 <= id < num_workers``.
        num_workers: how many workers the loader runs.
        seed: the worker's seed this epoch: the epoch's base seed + ``id``. A process
            worker seeds Python's ``random``, numpy's global generator and torch's CPU
            generator with it before ``worker_init_fn`` runs and at the start of every
            epoch, so ``torch.initial_seed()`` returns it there.
        dataset: this worker's copy of the dataset.
        rng: a thread worker's own generators (:class:`WorkerRNG`); ``None`` in a
            process worker, whose global generators are its own.
        worker_method: ``"multiprocessing"`` (a process worker) or ``"thread"``.

    Example:
        >>> from stoker import get_worker_info
        >>> get_worker_info() is None  # in the main process
        True
    """

    id: int
    num_workers: int
    seed: int
    dataset: Any
    rng: WorkerRNG | None = None
    worker_method: str = "multiprocessing"


def get_worker_info() -> WorkerInfo | None:
    """The :class:`WorkerInfo` of the current worker, or ``None`` outside workers.

    Works for process and thread workers alike (it is thread-local). Inside stoker's
    workers, ``torch.utils.data.get_worker_info()`` answers the same (see
    :func:`_share_with_torch`), so torch datasets that shard themselves work unchanged.
    """
    info = getattr(_local, "info", None)
    if info is not None:
        _local.consulted = True
    return info


def _set_worker_info(info: WorkerInfo | None, *, owns_process: bool = False) -> None:
    """Engine-only: declares the calling thread a worker (``None`` to clear).

    ``owns_process``: the worker is a process of its own, so process-wide state (torch's
    worker-info global) may be set too; a thread worker shares it with the trainer.
    Whether the dataset consulted its worker info is remembered for the worker's whole
    life: a stream sharded once, in ``worker_init_fn``, stays sharded every epoch.
    """
    if info is None or getattr(_local, "info", None) is None:
        _local.consulted = False
    _local.info = info
    if info is not None:
        _share_with_torch(info, owns_process)


def worker_info_here() -> WorkerInfo | None:
    """Engine-only: this thread's worker info, without counting as the dataset consulting it."""
    return getattr(_local, "info", None)


def _consulted() -> bool:
    """Engine-only: whether this worker's dataset asked for its worker info yet."""
    return getattr(_local, "consulted", False)


def _share_with_torch(info: WorkerInfo, owns_process: bool) -> None:
    """Makes ``torch.utils.data.get_worker_info()`` answer with this worker's info.

    torch keeps the answer in one module global, which is right for a process worker (we
    set it) but not for thread workers; so ``get_worker_info`` in ``torch.utils.data`` is
    also replaced by one that asks stoker first (thread-local) and torch second. Code that
    bound torch's function by name before the first worker started (``from
    torch.utils.data import get_worker_info``) sees the global: exact in process workers.
    """
    module = sys.modules.get("torch.utils.data._utils.worker")
    if module is None:
        return
    if owns_process:
        fields = {
            "id": info.id,
            "num_workers": info.num_workers,
            "seed": info.seed,
            "dataset": info.dataset,
        }
        try:
            try:
                module._worker_info = module.WorkerInfo(
                    **fields, rng=info.rng, worker_method=info.worker_method
                )
            except TypeError:  # a torch before 2.13: no rng / worker_method fields
                module._worker_info = module.WorkerInfo(**fields)
        except (AttributeError, TypeError):  # a torch without this internal: rely on the wrapper
            pass
    public = sys.modules.get("torch.utils.data")
    original = getattr(module, "get_worker_info", None)
    if original is None or getattr(original, "__stoker_original__", None) is not None:
        return

    def torch_get_worker_info() -> Any:
        return get_worker_info() or original()

    torch_get_worker_info.__stoker_original__ = original  # type: ignore[attr-defined]
    torch_get_worker_info.__doc__ = original.__doc__
    module.get_worker_info = torch_get_worker_info
    if public is not None and getattr(public, "get_worker_info", None) is original:
        public.get_worker_info = torch_get_worker_info
