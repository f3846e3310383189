"""Seeding: one seed makes a run repeatable, whatever ``num_workers`` and ``worker_mode``.

The whole story, from the top of a training script to the draws inside a sample.

One call at the top of a script
    :func:`seed_everything` seeds Python's ``random``, numpy's legacy global generator
    (``np.random.*``) and, when torch is installed, torch's generators on the CPU and
    every accelerator (it imports torch only when it runs, never when stoker is imported).
    A loader built with ``generator=None`` draws its base seed from numpy's global
    generator (``stoker.DataLoader``) or torch's (``stoker.torch.DataLoader``), so after
    this call its shuffles repeat too.

``generator=``: a loader's, a sampler's and ``random_split``'s seed
    Each accepts one of

    * ``None``: a base seed is drawn from numpy's global generator (so ``np.random.seed``
      or :func:`seed_everything` makes the run reproducible);
    * an ``int``: the base seed itself;
    * a ``numpy.random.Generator``: a base seed is drawn from it once, at construction;
    * a ``torch.Generator``: torch's own algorithm runs on that generator, so the result
      equals ``torch.utils.data`` value for value (and the generator advances the way
      torch advances it).

    With the first three, the random stream of epoch ``e`` is a pure function of
    ``(base_seed, e)`` (:func:`epoch_rng`): an epoch can be regenerated, skipped to, or
    resumed from a few integers, and the result does not depend on whether torch is
    installed. Each epoch of a loader gets an epoch seed derived the same way; a worker's
    seed is that epoch seed plus the worker's id, as in torch
    (``get_worker_info().seed``).

Augmentations that do not depend on the workers
    While stoker loads a sample, every draw from a *global* random number generator
    (numpy's ``np.random.*``, Python's ``random.*``, torch's ``torch.rand`` and friends)
    is served by a generator seeded from ``(epoch seed, position of the sample in the
    epoch, its index)``, owned by the loading thread. So the same seed gives the same
    augmentations whether the sample is loaded in the main process, in worker 3 of 4, or
    in a thread; different epochs differ; and the trainer's own global generators are
    never touched by loading. A collate function draws from a generator seeded from the
    batch's position instead. Outside loading, the global functions behave exactly as
    before.

    The position keeps a sample that an epoch visits twice (sampling with replacement)
    from drawing the same augmentation twice; the index keeps the ranks of a distributed
    job, which load different samples at the same positions with the same seed, from
    drawing the same augmentations for them, while ranks that load the same samples
    (tensor-parallel groups) still draw alike.

    For new code, :func:`sample_rng` hands out the per-sample ``numpy.random.Generator``
    directly. Code that imported a global function by name (``from numpy.random import
    rand``) before the first loader iterated, or that makes its own unseeded generator
    (``np.random.default_rng()``), is not covered: draw from :func:`sample_rng`.

``worker_init_fn`` and seeding
    A process worker seeds Python's ``random``, numpy's global generator and torch's CPU
    generator with its seed before ``worker_init_fn`` runs and at every epoch, so there
    ``torch.initial_seed() == get_worker_info().seed``, as in torch. A generator that
    ``worker_init_fn`` seeds in a process worker (``np.random.seed`` / ``set_state``,
    ``random.seed`` / ``setstate``, ``torch.manual_seed`` / ``torch.seed``) is left to it
    in that worker: stoker no longer reseeds it, and its draws follow that seed, as with
    torch, so they depend on which worker loads a sample. The generators it does not seed
    keep their per-sample streams; to keep augmentations independent of the workers, do
    not seed in ``worker_init_fn``. Thread workers share the trainer's generators, so
    there seeding changes nothing here (stoker warns; ``get_worker_info().rng`` holds the
    worker's own generators).

Example:
    >>> import numpy as np
    >>> from stoker import DataLoader, sample_rng, seed_everything
    >>> class Noisy:
    ...     def __len__(self):
    ...         return 4
    ...     def __getitem__(self, i):
    ...         return i + sample_rng().normal(), np.random.rand()
    >>> _ = seed_everything(0)
    >>> first = [b[0].tolist() for b in DataLoader(Noisy(), batch_size=2, shuffle=True)]
    >>> _ = seed_everything(0)
    >>> first == [b[0].tolist() for b in DataLoader(Noisy(), batch_size=2, shuffle=True)]
    True
"""

from __future__ import annotations

import os
import random
import sys
from typing import Any

import numpy as np

from stoker._validate import check_bool, is_int
from stoker.engine.random_scopes import current_scope

__all__ = ["epoch_rng", "sample_rng", "seed_everything"]

_MAX_SEED = 2**32 - 1  # numpy's legacy global generator takes seeds in [0, 2**32 - 1]
_SEED_BOUND = 2**63  # seeds drawn from a numpy Generator, or for sample_rng outside loading
_DRAWN_SEED_BOUND = 2**62  # the seeds stoker draws (base, epoch) lie in [0, 2**62)
_TORCH_SEED_MASK = 0xFFFF_FFFF_FFFF_FFFF  # torch.Generator.manual_seed takes 64-bit seeds


# -- one call at the top of a script -----------------------------------------------


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
        >>> from stoker.seeding import seed_everything
        >>> a = (seed_everything(7), np.random.rand())
        >>> b = (seed_everything(7), np.random.rand())
        >>> a == b
        True
    """
    seed = _check_global_seed(seed)
    deterministic_cudnn = check_bool("deterministic_cudnn", deterministic_cudnn)
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


def _check_global_seed(seed: Any) -> int:
    """``seed`` as an int, once it is one that every global generator takes."""
    if not is_int(seed):
        msg = f"seed must be an int in [0, {_MAX_SEED}], got {type(seed).__name__}: {seed!r}"
        raise TypeError(msg)
    if not 0 <= seed <= _MAX_SEED:
        msg = (
            f"seed must be in [0, {_MAX_SEED}] (numpy's global generator takes no other), "
            f"got {seed}; reduce it, for example with seed % 2**32"
        )
        raise ValueError(msg)
    return int(seed)


def _import_torch() -> Any:
    """torch, or None when it is not installed (it is imported here, lazily)."""
    try:
        import torch
    except ImportError:
        return None
    return torch


# -- the generator of the sample being loaded --------------------------------------


def sample_rng() -> np.random.Generator:
    """The ``numpy.random.Generator`` of the sample (or batch) being loaded.

    Seeded from the loader's seed, the epoch and the sample's position, so the values it
    gives do not depend on ``num_workers`` or ``worker_mode``. Each call within one sample
    returns a generator at the same starting point, so call it once per sample and keep
    the result. Outside a loader it returns a generator seeded from numpy's global RNG.

    Example:
        >>> import numpy as np
        >>> from stoker.seeding import sample_rng
        >>> class Noisy:
        ...     def __len__(self):
        ...         return 4
        ...     def __getitem__(self, i):
        ...         return i + sample_rng().normal()
    """
    scope = current_scope()
    if scope is None:
        return np.random.default_rng(np.random.randint(0, _SEED_BOUND, dtype=np.int64))
    return np.random.Generator(np.random.PCG64(scope.key))


# -- from generator= to epoch streams ----------------------------------------------


def epoch_rng(base_seed: int, epoch: int, *stream: int) -> np.random.Generator:
    """The numpy Generator of ``epoch`` (and optional sub-stream ids) of ``base_seed``.

    A pure function of its arguments: the same ones give the same stream in every
    process, with or without torch. stoker's samplers and datasets shuffle each epoch
    with it, and it serves an ``IterableDataset`` that shuffles its own shards per epoch.

    Args:
        base_seed: a non-negative int (a sampler's ``base_seed``, for one).
        epoch: the epoch, a non-negative int.
        *stream: further non-negative ints that pick independent streams of one epoch.

    Example:
        >>> from stoker.seeding import epoch_rng
        >>> epoch_rng(7, 0).permutation(5).tolist() == epoch_rng(7, 0).permutation(5).tolist()
        True
    """
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([base_seed, epoch, *stream])))


def _is_torch_generator(obj: object) -> bool:
    """True when ``obj`` is a ``torch.Generator``; never imports torch."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Generator)


def _resolve_base_seed(generator: object, *, argument: str = "generator") -> int:
    """Returns the base seed for ``generator`` (``None``, int or numpy Generator).

    Raises:
        TypeError: ``generator`` is none of the accepted kinds (a torch.Generator must
            be handled by the caller before calling this).
        ValueError: ``generator`` is a negative int.
    """
    if generator is None:
        return int(np.random.randint(0, _DRAWN_SEED_BOUND, dtype=np.int64))
    if isinstance(generator, (bool, np.bool_)):
        raise TypeError(
            f"{argument} must be an int seed, a numpy.random.Generator or a torch.Generator, "
            f"got the bool {generator!r}"
        )
    if isinstance(generator, (int, np.integer)):
        seed = int(generator)
        if seed < 0:
            raise ValueError(f"{argument} must be a non-negative int seed, got {seed}")
        return seed
    if isinstance(generator, np.random.Generator):
        return int(generator.integers(0, _SEED_BOUND))
    msg = (
        f"{argument} must be an int seed, a numpy.random.Generator or a torch.Generator, "
        f"got {type(generator).__name__}: {generator!r}"
    )
    raise TypeError(msg)


def _derive_rng(generator: object) -> np.random.Generator:
    """A one-off numpy Generator from any seed-like value (a torch.Generator included).

    For a torch.Generator a 63-bit seed is drawn from it with ``torch.randint``.
    """
    if _is_torch_generator(generator):
        import torch

        seed = int(
            torch.randint(0, _DRAWN_SEED_BOUND, (), dtype=torch.int64, generator=generator).item()
        )
        return epoch_rng(seed, 0)
    return epoch_rng(_resolve_base_seed(generator), 0)


# -- a loader's epoch seeds and its workers' seeds ---------------------------------


def _derive_epoch_seed(base_seed: int, epoch: int) -> int:
    """A loader's seed of ``epoch``: keys every random scope and each worker's seed."""
    return int(epoch_rng(base_seed, epoch).integers(0, _DRAWN_SEED_BOUND))


def _worker_seed(epoch_seed: int, worker_id: int) -> int:
    """A worker's seed for an epoch: the epoch's seed plus the worker's id, as in torch."""
    return epoch_seed + worker_id


def _seed_worker_globals(seed: int, skip: frozenset[str] = frozenset()) -> None:
    """Seeds a process worker's global generators with its seed, except those in ``skip``.

    Python's ``random``, numpy's global generator and, when torch is loaded, torch's CPU
    generator; ``skip`` names those that ``worker_init_fn`` seeded (``"python"``,
    ``"numpy"``, ``"torch"``), which are left to it.
    """
    if "python" not in skip:
        random.seed(seed)
    if "numpy" not in skip:
        np.random.seed(seed % 2**32)
    torch = sys.modules.get("torch")
    if torch is not None and "torch" not in skip:
        # the CPU generator only: torch.manual_seed also wakes CUDA (ms)
        torch.default_generator.manual_seed(seed & _TORCH_SEED_MASK)
