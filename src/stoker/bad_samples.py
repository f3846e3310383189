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

import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from stoker._deprecated import Moved, moved_attribute
from stoker._errors import TooManyBadSamples
from stoker._printable import printable

__all__ = ["ErrorReport", "SkippedSample", "TooManyBadSamples", "skipped_sample"]


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
        where = f" ({printable(self.source)})" if self.source else ""
        return f"index {self.index!r}{where}: {self.error_type}: {printable(self.message)}"


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
            lines.append(
                f"  ... and {len(self.skipped) - 10} more (loader.error_report() lists all)"
            )
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"ErrorReport(skipped={len(self.skipped)}, attempted={self.attempted})"


_BUDGET_ADVICE = (
    "{name} is internal to stoker's DataLoader and now lives in stoker._bad_sample_budget, "
    "which may change without notice; pass on_error='skip' and max_errors= to the DataLoader "
    "and read loader.error_report() instead"
)

_MOVED = {
    name: Moved("stoker._bad_sample_budget", _BUDGET_ADVICE.format(name=name))
    for name in ("BadSampleBudget", "check_max_errors")
}


def __getattr__(name: str) -> Any:
    return moved_attribute(__name__, _MOVED, name)
