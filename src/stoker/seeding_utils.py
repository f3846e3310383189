"""``seed_everything``: one call at the top of a script to make a run repeatable.

It seeds every global random number generator a training script usually draws from:
Python's ``random``, numpy's legacy global generator (``np.random.*``) and, when torch
is installed, torch's generators on the CPU and every accelerator. torch is imported
here only when this function runs, never when stoker is imported.
"""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np

from stoker._validate import check_bool, is_int

__all__ = ["seed_everything"]

_MAX_SEED = 2**32 - 1  # numpy's legacy global generator takes seeds in [0, 2**32 - 1]


def _import_torch() -> Any:
    """torch, or None when it is not installed (it is imported here, lazily)."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def seed_everything(seed: int, *, deterministic_cudnn: bool = True) -> int:
    """Seeds Python's ``random``, numpy's and torch's global generators with ``seed``.

    Also sets ``PYTHONHASHSEED`` for child processes started afterwards (it cannot
    change the hash seed of the running interpreter). With torch installed, seeds the
    CPU generator and those of every accelerator (``torch.manual_seed``), and with
    ``deterministic_cudnn`` sets ``torch.backends.cudnn.deterministic = True`` and
    ``torch.backends.cudnn.benchmark = False``, so cuDNN picks the same convolution
    algorithms every run (at some speed cost). It does not call
    ``torch.use_deterministic_algorithms``, which makes nondeterministic operations
    raise; call it yourself if you want that guarantee.

    A stoker loader with ``generator=None`` draws its seeds from numpy's global
    generator (``stoker.DataLoader``) or torch's (``stoker.torch.DataLoader``), so
    both repeat their shuffles after this call.

    Args:
        seed: an int in ``[0, 2**32 - 1]`` (the range every one of these generators takes).
        deterministic_cudnn: set cuDNN's deterministic flags (ignored without torch).

    Returns:
        ``seed``, so that ``seed = seed_everything(args.seed)`` can log it.

    Raises:
        TypeError: ``seed`` is not an int, or ``deterministic_cudnn`` not a bool.
        ValueError: ``seed`` is outside ``[0, 2**32 - 1]``.

    Example:
        >>> import numpy as np

from stoker._validate import check_bool, is_int
        >>> from stoker.seeding_utils import seed_everything
        >>> a = (seed_everything(7), np.random.rand())
        >>> b = (seed_everything(7), np.random.rand())
        >>> a == b
        True
    """
    if not is_int(seed):
        msg = f"seed must be an int in [0, {_MAX_SEED}], got {type(seed).__name__}: {seed!r}"
        raise TypeError(msg)
    if not 0 <= seed <= _MAX_SEED:
        msg = (
            f"seed must be in [0, {_MAX_SEED}] (numpy's global generator takes no other), "
            f"got {seed}; reduce it, for example with seed % 2**32"
        )
        raise ValueError(msg)
    deterministic_cudnn = check_bool("deterministic_cudnn", deterministic_cudnn)
    seed = int(seed)
    random.seed(seed)
    np.random.seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)
    torch = _import_torch()
    if torch is not None:
        torch.manual_seed(seed)  # the CPU generator and every accelerator's (lazily)
        if deterministic_cudnn:
            torch.backends.cudnn.deterministic = True
            torch.backends.cudnn.benchmark = False
    return seed
