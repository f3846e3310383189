"""What a :class:`stoker.torch.DataLoader` keeps when a framework rebuilds it.

PyTorch Lightning and Hugging Face accelerate do not train on the loader they are given:
they read its attributes and build a new one (with a ``DistributedSampler``, a sharded
batch sampler, or the first batches skipped). Lightning calls the loader's own class
with its public attributes; accelerate calls ``torch.utils.data.DataLoader`` with torch's
arguments only. The one attribute both pass on is ``collate_fn``, so stoker.torch's
``collate_fn`` is a :class:`TorchCollate`: called by any torch loader it returns torch
batches (never stoker's numpy ones), and it carries the stoker options (worker mode,
error policy, memory budget, autotuning, the base seed) that a stoker loader rebuilt
from it takes up again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from stoker.torch._convert import to_tensors

__all__ = ["StokerOptions", "TorchCollate"]


@dataclasses.dataclass(frozen=True, slots=True)
class StokerOptions:
    """The options of a stoker.torch loader that torch's ``DataLoader`` has no argument for.

    ``num_workers`` / ``prefetch_factor`` hold ``"auto"`` when the loader tunes them
    (the rebuilt loader's attributes then hold the current counts); ``seed`` is the base
    seed a loader built with ``generator=None`` drew, so a rebuilt loader makes the same
    batches and augmentations instead of drawing a new one.
    """

    num_workers: int | str = 0
    prefetch_factor: int | str | None = None
    worker_mode: str = "auto"
    on_worker_death: str = "raise"
    copy_batches: bool = False
    worker_threads: int | None = 1
    on_error: str = "raise"
    max_errors: int | float | None = 0.01
    memory_budget: int | None = None
    compact_dataset: bool = False
    seed: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class TorchCollate:
    """A collate function that returns torch batches and carries a loader's stoker options.

    Args:
        collate: the collate stoker's engine runs (``stoker.default_collate`` or the
            user's ``collate_fn``).
        torch_strings: strings in a sequence come back as tuples, as from torch's
            ``default_collate`` (set when ``collate`` is stoker's default).
        options: the loader's stoker options.

    Example:
        >>> import torch
        >>> from stoker import default_collate
        >>> c = TorchCollate(default_collate, torch_strings=True, options=StokerOptions())
        >>> c([{"x": 1}, {"x": 2}])["x"]
        tensor([1, 2])
    """

    collate: Callable[[Any], Any]
    torch_strings: bool
    options: StokerOptions

    def __call__(self, samples: Any) -> Any:
        return to_tensors(self.collate(samples), torch_strings=self.torch_strings)

    @property
    def __wrapped__(self) -> Callable[[Any], Any]:
        return self.collate

    def __repr__(self) -> str:
        name = getattr(self.collate, "__qualname__", None) or repr(self.collate)
        return f"TorchCollate({name})"


def _is_auto(value: Any) -> bool:
    return isinstance(value, str) and value == "auto"


def take_up(
    passed: dict[str, Any], defaults: dict[str, Any], carried: StokerOptions
) -> dict[str, Any]:
    """The stoker options for a loader rebuilt from a :class:`TorchCollate`.

    An argument left at its default takes the carried value; an explicit one wins.
    A carried ``"auto"`` comes back whatever count the framework passed on, since that
    count is the tuner's current choice, not the user's.
    """
    chosen = dict(passed)
    for field in dataclasses.fields(StokerOptions):
        name = field.name
        if name == "seed" or name not in passed:
            continue
        value = getattr(carried, name)
        if _is_auto(value):  # num_workers or prefetch_factor
            if chosen.get("num_workers") != 0:
                chosen[name] = "auto"
        elif passed[name] is defaults[name] or passed[name] == defaults[name]:
            chosen[name] = value
    return chosen
