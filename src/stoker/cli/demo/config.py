"""The demo's sizes: the full run, and ``--quick``."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DemoConfig"]

_DATASET_VERSION = 1  # bump when the synthetic images change, so old caches are rebuilt


@dataclass(frozen=True, slots=True)
class DemoConfig:
    """The demo's sizes.

    Example:
        >>> DemoConfig.full().batch_size, DemoConfig.quick().images
        (32, 96)
    """

    images: int  # JPEG files in the dataset (one epoch covers warm-up + timed batches)
    width: int  # source image size
    height: int
    size: int  # the square the pipeline resizes to
    classes: int
    batch_size: int
    warmup: int  # batches per run not timed (worker start-up, pipeline fill)
    batches: int  # timed batches per run
    step_ms: float  # simulated accelerator time per training step
    workers: int
    rounds: int  # each stage runs this many times per library, the order alternating

    @classmethod
    def full(cls) -> DemoConfig:
        return cls(images=1024, width=500, height=375, size=160, classes=10, batch_size=32,
                   warmup=2, batches=30, step_ms=20.0, workers=2, rounds=3)  # fmt: skip

    @classmethod
    def quick(cls) -> DemoConfig:
        return cls(images=96, width=128, height=96, size=48, classes=4, batch_size=16,
                   warmup=1, batches=5, step_ms=5.0, workers=2, rounds=1)  # fmt: skip

    def describe(self) -> str:
        return (
            f"{self.images} JPEGs of {self.width}x{self.height} -> {self.size}x{self.size}, "
            f"batch {self.batch_size}"
        )

    @property
    def name(self) -> str:
        return f"v{_DATASET_VERSION}-{self.images}x{self.width}x{self.height}-c{self.classes}"
