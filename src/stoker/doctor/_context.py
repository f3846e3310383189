"""What every check reads, and what the earlier checks learn for the later ones.

Each check is a function of one :class:`Context`: the dataset, the caller's
:class:`Options`, and the facts found so far (the length, the sample, which field holds
the image and which the label, the labels seen). A check adds its findings with
:meth:`Context.add`. Internal to :mod:`stoker.doctor`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from stoker.doctor._values import FieldPath
from stoker.doctor.report import FAIL, Finding


@dataclass(frozen=True, slots=True)
class Options:
    """The caller's settings, validated (see :func:`stoker.doctor.check`)."""

    batch_size: int
    num_batches: int
    stats_samples: int
    num_workers: int
    index: int
    seed: int
    files: str = "decode"  # how the files check reads each file: decode, verify or none
    raw_images: bool = False  # the images are decoded by stoker for the check, not the user's


@dataclass(frozen=True, slots=True)
class Normalisation:
    """The statistics check's result: the field, and its mean and std for ``Normalize``."""

    field: str
    mean: tuple[float, ...]
    std: tuple[float, ...]


@dataclass(slots=True)
class Context:
    """The dataset and options, plus what the checks have found so far."""

    dataset: Any
    options: Options
    iterable: bool  # an IterableDataset: no index, maybe no length
    findings: list[Finding] = field(default_factory=list)
    length: int | None = None  # the length check's
    sample: Any = None  # the sample check's: the sample at options.index (or the first)
    label_path: FieldPath | None = None  # the sample check's: the label field
    image_path: FieldPath | None = None  # the sample check's: the field statistics are about
    labels: list[int] = field(default_factory=list)  # labels of the samples the stats pass read
    batch_labels: list[int] = field(default_factory=list)  # labels in the batches check's batches
    normalisation: Normalisation | None = None  # the stats check's

    def add(
        self, check: str, status: str, message: str, details: Sequence[str] = (), **data: Any
    ) -> None:
        self.findings.append(Finding(check, status, message, tuple(details), data))

    def add_raised(self, check: str, doing: str, exc: Exception) -> None:
        """A failure: ``doing`` (``"loading batches of 8"``) raised ``exc``."""
        name = type(exc).__name__
        self.add(check, FAIL, f"{doing} raised {name}: {exc}", error=name)

    def loader(self, dataset: Any, **kwargs: Any) -> Any:
        """A :class:`stoker.DataLoader` over ``dataset`` with the caller's workers and seed."""
        from stoker.loader import DataLoader

        if self.options.num_workers:
            kwargs.update(num_workers=self.options.num_workers, worker_mode="thread")
        # never draw a seed from the caller's global RNG
        kwargs.setdefault("generator", self.options.seed)
        return DataLoader(dataset, **kwargs)

    def take(self, loader: Any) -> list[Any]:
        """The first ``num_batches`` batches of one epoch of ``loader``."""
        iterator = iter(loader)
        try:
            return list(itertools.islice(iterator, self.options.num_batches))
        finally:
            close = getattr(iterator, "close", None)
            if callable(close):
                close()
