"""Bad samples: skip and report them instead of losing a day of training.

With ``DataLoader(on_error="skip")`` a sample whose fetch or decode raises is left out of
its batch (the batch is returned one sample shorter; a batch whose every sample failed
is not returned at all), logged on the ``stoker`` logger with its index, its source (the
file, when the dataset can say: a ``describe_sample(index)`` method, or the exception's
``filename``) and the exception, and kept in :meth:`DataLoader.error_report`. Past the
``max_errors`` budget the loader stops with :class:`TooManyBadSamples`, whose message
summarises what went wrong. A ``collate_fn`` that fails is not a bad sample: it raises.

Example:
    >>> from stoker import DataLoader
    >>> class Flaky:
    ...     def __len__(self):
    ...         return 6
    ...     def __getitem__(self, i):
    ...         if i == 3:
    ...             raise ValueError("truncated file")
    ...         return i
    >>> loader = DataLoader(Flaky(), batch_size=3, on_error="skip", max_errors=2)
    >>> [b.tolist() for b in loader]
    [[0, 1, 2], [4, 5]]
    >>> [s.index for s in loader.error_report()]
    [3]
"""

from __future__ import annotations

import logging
import math
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from stoker._errors import TooManyBadSamples
from stoker._validate import check_int, is_int

__all__ = ["BadSampleBudget", "ErrorReport", "SkippedSample", "TooManyBadSamples", "skipped_sample"]

logger = logging.getLogger("stoker")


@dataclass(frozen=True, slots=True)
class SkippedSample:
    """One sample that was left out: where it came from and what went wrong."""

    index: Any
    source: str | None
    error_type: str
    message: str
    traceback: str
    epoch: int = -1

    def describe(self) -> str:
        where = f" ({self.source})" if self.source else ""
        return f"index {self.index!r}{where}: {self.error_type}: {self.message}"


def skipped_sample(dataset: Any, index: Any, exc: BaseException, epoch: int = -1) -> SkippedSample:
    """Builds the record of a failed sample, asking the dataset where it came from."""
    source = None
    describe = getattr(dataset, "describe_sample", None)
    if callable(describe):
        try:
            source = str(describe(index))
        except Exception:  # the description is a courtesy; never let it mask the real error
            source = None
    if source is None:
        filename = getattr(exc, "filename", None)
        source = str(filename) if filename else None
    tail = "".join(traceback.format_exception(exc)[-3:]).strip()
    return SkippedSample(index, source, type(exc).__name__, str(exc), tail, epoch)


class ErrorReport:
    """Every sample skipped so far (``loader.error_report()``); prints as a summary."""

    def __init__(self, skipped: list[SkippedSample], attempted: int) -> None:
        self.skipped = list(skipped)
        self.attempted = attempted

    def __len__(self) -> int:
        return len(self.skipped)

    def __iter__(self) -> Iterator[SkippedSample]:
        return iter(self.skipped)

    def __getitem__(self, i: int) -> SkippedSample:
        return self.skipped[i]

    def __str__(self) -> str:
        if not self.skipped:
            return f"no bad samples in {self.attempted} attempted"
        kinds = Counter(s.error_type for s in self.skipped)
        lines = [
            f"{len(self.skipped)} bad sample(s) skipped out of {self.attempted} attempted: "
            + ", ".join(f"{n} {kind}" for kind, n in kinds.most_common())
        ]
        lines += [f"  {s.describe()}" for s in self.skipped[:10]]
        if len(self.skipped) > 10:
            lines.append(f"  ... and {len(self.skipped) - 10} more (loader.error_report() lists all)")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"ErrorReport(skipped={len(self.skipped)}, attempted={self.attempted})"


class BadSampleBudget:
    """Counts attempted and skipped samples and enforces ``max_errors``.

    ``max_errors``: ``None`` (no limit), an int (that many bad samples in all), or a
    fraction in (0, 1) (that share of the samples attempted so far, and always at least
    one: ``0.01`` allows one bad sample in every hundred).
    """

    def __init__(self, max_errors: int | float | None) -> None:
        self.max_errors = check_max_errors(max_errors)
        self.skipped: list[SkippedSample] = []
        self.attempted = 0

    def record(self, attempted: int, skipped: tuple[SkippedSample, ...] | list[SkippedSample]) -> None:
        self.attempted += attempted
        for sample in skipped:
            self.skipped.append(sample)
            logger.warning("skipped a bad sample at %s", sample.describe())
        if skipped and len(self.skipped) > self.allowed():
            report = ErrorReport(self.skipped, self.attempted)
            msg = (
                f"stopping: {len(self.skipped)} bad samples exceed max_errors={self.max_errors!r}.\n"
                f"{report}\nFix or remove the broken files (stoker doctor helps), or raise max_errors."
            )
            raise TooManyBadSamples(msg)

    def allowed(self) -> float:
        limit = self.max_errors
        if limit is None:
            return math.inf
        if isinstance(limit, float):
            return max(1, math.floor(limit * self.attempted))
        return limit

    def report(self) -> ErrorReport:
        return ErrorReport(self.skipped, self.attempted)


def check_max_errors(max_errors: Any) -> int | float | None:
    if max_errors is None:
        return None
    if is_int(max_errors):
        return check_int("max_errors", max_errors, message="max_errors must be >= 0")
    if not isinstance(max_errors, (float, np.floating)):
        msg = f"max_errors must be None, a count (int >= 0) or a fraction in (0, 1), got {max_errors!r}"
        raise TypeError(msg)
    if not 0 < max_errors < 1:
        msg = (
            f"max_errors={max_errors!r}: a float is a fraction of the samples attempted and must lie "
            "in (0, 1); pass an int for a count"
        )
        raise ValueError(msg)
    return float(max_errors)
