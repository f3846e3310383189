"""stoker's samplers as torch's sampler classes, for code that checks ``isinstance``.

Training frameworks decide what to do with a loader by the type of its sampler:
PyTorch Lightning injects a ``DistributedSampler`` that shuffles only when the loader's
sampler ``isinstance(..., torch.utils.data.RandomSampler)``, and Hugging Face
accelerate shares one ``torch.Generator`` between processes by assigning it to such a
sampler's ``generator``. These classes are stoker's samplers (fast whole-epoch index
arrays, ``set_epoch``, ``state_dict``) that are also instances of torch's, and are what
:class:`stoker.torch.DataLoader` builds when it is given no sampler.

Randomness follows torch's: ``generator=None`` draws the sampler's seed from torch's
global generator when its first epoch starts, not when it is built (so building one
leaves torch's global generator alone, and ``torch.manual_seed`` before the first epoch
reproduces the order), and a ``torch.Generator`` gives torch's exact order.
"""

from __future__ import annotations

import torch.utils.data as tud

from stoker import samplers as _stoker

__all__ = ["BatchSampler", "RandomSampler", "SequentialSampler", "draw_torch_seed"]


def draw_torch_seed() -> int:
    """One non-negative int64 from torch's global generator, drawn as torch's loader draws it."""
    import torch

    return int(torch.empty((), dtype=torch.int64).random_().item())


class SequentialSampler(_stoker.SequentialSampler, tud.SequentialSampler):
    """:class:`stoker.samplers.SequentialSampler` that is a ``torch.utils.data.SequentialSampler``.

    Example:
        >>> list(SequentialSampler(range(3)))
        [0, 1, 2]
    """


class RandomSampler(_stoker.RandomSampler, tud.RandomSampler):
    """:class:`stoker.samplers.RandomSampler` that is a ``torch.utils.data.RandomSampler``.

    With ``generator=None`` the seed is drawn from torch's global generator.

    Example:
        >>> import torch
        >>> order = list(RandomSampler(range(5), generator=torch.Generator().manual_seed(0)))
        >>> reference = torch.utils.data.RandomSampler(
        ...     range(5), generator=torch.Generator().manual_seed(0)
        ... )
        >>> order == list(reference)
        True
    """

    def _fresh_seed(self) -> int:
        return draw_torch_seed()


class BatchSampler(_stoker.BatchSampler, tud.BatchSampler):
    """:class:`stoker.samplers.BatchSampler` that is a ``torch.utils.data.BatchSampler``.

    Example:
        >>> list(BatchSampler(SequentialSampler(range(5)), batch_size=2, drop_last=False))
        [[0, 1], [2, 3], [4]]
    """
