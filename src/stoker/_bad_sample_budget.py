"""The bad-sample budget of ``DataLoader(on_error="skip", max_errors=...)``.

The loader records every batch's attempted and skipped samples here; past ``max_errors``
the budget raises :class:`~stoker.TooManyBadSamples` with a summary. What users see of
bad samples (:class:`~stoker.bad_samples.SkippedSample`, ``loader.error_report()``) is in
:mod:`stoker.bad_samples`.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from stoker._errors import TooManyBadSamples
from stoker._validate import check_int, is_int
from stoker.bad_samples import ErrorReport, SkippedSample

__all__ = ["BadSampleBudget", "check_max_errors"]

logger = logging.getLogger("stoker")


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

    def record(
        self, attempted: int, skipped: tuple[SkippedSample, ...] | list[SkippedSample]
    ) -> None:
        self.attempted += attempted
        for sample in skipped:
            self.skipped.append(sample)
            logger.warning("skipped a bad sample at %s", sample.describe())
        if skipped and len(self.skipped) > self.allowed():
            report = ErrorReport(self.skipped, self.attempted)
            msg = (
                f"stopping: {len(self.skipped)} bad samples exceed "
                f"max_errors={self.max_errors!r}.\n{report}\nFix or remove the broken files "
                "(stoker doctor helps), or raise max_errors."
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
    """``max_errors`` checked: ``None``, a count (int >= 0) or a fraction in (0, 1).

    Raises:
        TypeError: ``max_errors`` is none of these kinds.
        ValueError: a negative count, or a fraction outside (0, 1).
    """
    if max_errors is None:
        return None
    if is_int(max_errors):
        return check_int("max_errors", max_errors, message="max_errors must be >= 0")
    if not isinstance(max_errors, (float, np.floating)):
        msg = (
            "max_errors must be None, a count (int >= 0) or a fraction in (0, 1), got "
            f"{max_errors!r}"
        )
        raise TypeError(msg)
    if not 0 < max_errors < 1:
        msg = (
            f"max_errors={max_errors!r}: a float is a fraction of the samples attempted and must "
            "lie in (0, 1); pass an int for a count"
        )
        raise ValueError(msg)
    return float(max_errors)
