"""Thread workers share one dataset object: the common way that silently goes wrong.

With ``worker_mode="thread"`` several threads call the same dataset's ``__getitem__`` at
once. A dataset that reads through one open file handle (``seek`` then ``read``) gets the
threads' seeks and reads interleaved and returns bytes of the wrong sample, without any
error. :func:`shared_handles` looks for such handles among a dataset's attributes (a few
levels deep, a bounded number of objects); the loader warns when it finds one, unless the
dataset declares ``thread_safe = True``.
"""

from __future__ import annotations

import io
import sqlite3
import tarfile
import warnings
import zipfile
from typing import Any

__all__ = ["is_thread_safe", "shared_handles", "warn_shared_handles"]

_MAX_DEPTH = 3
_MAX_OBJECTS = 2000  # a dataset with a million attributes is not scanned whole at start-up
_STATEFUL = (io.IOBase, tarfile.TarFile, zipfile.ZipFile, sqlite3.Connection)
_STATEFUL_NAMES = {
    ("h5py._hl.files", "File"),
    ("h5py._hl.dataset", "Dataset"),
    ("lmdb", "Transaction"),
}


def is_thread_safe(obj: Any) -> bool:
    """Whether ``obj`` (a dataset, transform or collate function) declares itself thread-safe.

    Only ``thread_safe = True`` counts (a class attribute or a property): stoker's own
    datasets and transforms declare it where it holds, and a user's dataset declares it
    when several threads may call its ``__getitem__`` at once. ``worker_mode="auto"``
    runs threads only for what declares it; anything else gets processes.
    """
    try:
        return getattr(obj, "thread_safe", False) is True
    except Exception:  # a property that fails answers no
        return False


def _is_stateful_handle(value: Any) -> bool:
    if isinstance(value, _STATEFUL):
        return not getattr(value, "closed", False)
    kind = type(value)
    return (kind.__module__, kind.__qualname__) in _STATEFUL_NAMES


def shared_handles(dataset: Any) -> list[str]:
    """Paths (``dataset.f``, ``dataset.parts[0].file``) of open, stateful file handles."""
    found: list[str] = []
    seen: set[int] = set()
    stack: list[tuple[str, Any, int]] = [("dataset", dataset, 0)]
    while stack and len(seen) < _MAX_OBJECTS:
        path, value, depth = stack.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if _is_stateful_handle(value):
            found.append(f"{path} ({type(value).__name__})")
            continue
        if depth >= _MAX_DEPTH or isinstance(value, (str, bytes, int, float, type)):
            continue
        if isinstance(value, (list, tuple)):
            children = [(f"{path}[{i}]", v) for i, v in enumerate(value[:64])]
        elif isinstance(value, dict):
            children = [(f"{path}[{k!r}]", v) for k, v in list(value.items())[:64]]
        else:
            attributes = getattr(value, "__dict__", None)
            if not isinstance(attributes, dict):
                continue
            children = [(f"{path}.{k}", v) for k, v in attributes.items()]
        stack.extend((p, v, depth + 1) for p, v in reversed(children))
    return sorted(found)


def warn_shared_handles(dataset: Any, num_workers: int, *, stacklevel: int = 3) -> None:
    """Warns when thread workers would share an open file handle of ``dataset``."""
    if num_workers < 2 or is_thread_safe(dataset):
        return
    handles = shared_handles(dataset)
    if not handles:
        return
    listed = ", ".join(handles[:4]) + (f" and {len(handles) - 4} more" if len(handles) > 4 else "")
    msg = (
        f"worker_mode='thread' runs {num_workers} threads that call "
        f"{type(dataset).__name__}.__getitem__ at the same time, and it holds open file handles "
        f"they would share: {listed}. Interleaved seeks and reads return the wrong bytes without "
        "an error. Open the file per thread (for example in __getitem__, or keyed by "
        "threading.get_ident()), read with os.pread or mmap, use worker_mode='process', or, if "
        "access is safe, set thread_safe = True on the dataset."
    )
    warnings.warn(msg, UserWarning, stacklevel=stacklevel)
