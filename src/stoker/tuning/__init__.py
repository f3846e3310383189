"""Tuning the input pipeline: sweep loader settings and find the knee.

``stoker bench`` and ``stoker demo`` are built on this package; see docs/tuning.md.
"""

from __future__ import annotations

from stoker.tuning.background_load import BackgroundLoad
from stoker.tuning.sweep import (
    KNEE_FRACTION,
    SweepPoint,
    SweepProgress,
    SweepResult,
    batch_nbytes,
    default_workers,
    memory_estimate,
    sweep,
)

__all__ = [
    "BackgroundLoad",
    "KNEE_FRACTION",
    "SweepPoint",
    "SweepProgress",
    "SweepResult",
    "batch_nbytes",
    "default_workers",
    "memory_estimate",
    "sweep",
]
