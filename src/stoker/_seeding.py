"""Turning the seed-like arguments users pass into reproducible random streams.

Every sampler and ``random_split`` accepts ``generator=`` as one of

* ``None``: a base seed is drawn once, at construction, from numpy's global RNG, so
  ``np.random.seed`` / :func:`stoker.seed_everything` make the run reproducible;
* an ``int``: the base seed itself;
* a ``numpy.random.Generator``: a base seed is drawn from it once, at construction;
* a ``torch.Generator``: torch's own algorithm is used with that generator, so the
  result equals ``torch.utils.data`` value for value (and the generator advances the
  way torch advances it).

With the first three, the random stream of epoch ``e`` is a pure function of
``(base_seed, e)`` (see :func:`epoch_rng`): an epoch can be regenerated, skipped to,
or resumed in O(1) state, and the result does not depend on whether torch is
installed.
"""

from __future__ import annotations

import sys
from typing import Any, Union

import numpy as np

__all__ = ["SeedLike", "derive_rng", "epoch_rng", "is_torch_generator", "resolve_base_seed"]

SeedLike = Union[int, np.random.Generator, "Any", None]  # Any: torch.Generator, never imported here

_SEED_BOUND = 2**63


def is_torch_generator(obj: object) -> bool:
    """True when ``obj`` is a ``torch.Generator``; never imports torch."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Generator)


def resolve_base_seed(generator: object, *, argument: str = "generator") -> int:
    """Returns the base seed for ``generator`` (``None``, int or numpy Generator).

    Raises:
        TypeError: ``generator`` is none of the accepted kinds (a torch.Generator must
            be handled by the caller before calling this).
    """
    if generator is None:
        return int(np.random.randint(0, 2**62, dtype=np.int64))
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


def epoch_rng(base_seed: int, epoch: int, *stream: int) -> np.random.Generator:
    """The numpy Generator for ``epoch`` (and optional sub-stream ids) of ``base_seed``."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([base_seed, epoch, *stream])))


def derive_rng(generator: object) -> np.random.Generator:
    """A one-off numpy Generator from any seed-like value (a torch.Generator included).

    For a torch.Generator a 63-bit seed is drawn from it with ``torch.randint``.
    """
    if is_torch_generator(generator):
        import torch

        seed = int(torch.randint(0, 2**62, (), dtype=torch.int64, generator=generator).item())
        return epoch_rng(seed, 0)
    return epoch_rng(resolve_base_seed(generator), 0)
