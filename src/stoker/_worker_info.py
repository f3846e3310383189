"""``get_worker_info()``: which worker is running this code, if any."""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from typing import Any

__all__ = ["WorkerInfo", "get_worker_info"]

_local = threading.local()


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """What a dataset can learn about the worker it runs in.

    Attributes:
        id: the worker's index, ``0 <= id < num_workers``.
        num_workers: how many workers the loader runs.
        seed: the worker's seed (base seed + id); numpy and ``random`` are already
            seeded from it.
        dataset: this worker's copy of the dataset.

    Example:
        >>> from stoker import get_worker_info
        >>> get_worker_info() is None  # in the main process
        True
    """

    id: int
    num_workers: int
    seed: int
    dataset: Any


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
    """
    _local.info = info
    if info is None or not hasattr(_local, "consulted"):
        # a dataset that asked once (in worker_init_fn, say) has sharded itself for good
        _local.consulted = False
    if info is not None:
        _share_with_torch(info, owns_process)


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
        try:
            module._worker_info = module.WorkerInfo(
                id=info.id, num_workers=info.num_workers, seed=info.seed, dataset=info.dataset
            )
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
