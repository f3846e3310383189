"""Per-channel mean and std, streamed sample by sample, for the ``stats`` check.

:class:`ChannelStats` merges each sample's per-channel figures into the running ones;
:class:`FieldStats` feeds it one field of every sample, splitting each by its layout
(channels of an image, elements of a short feature vector, or one overall channel) and
remembering whether the values look like 0-255 pixels. Internal to :mod:`stoker.doctor`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from stoker.doctor._values import is_image, layout

_MAX_FEATURES = 64  # a 1-D field up to this long gets a mean and std per element


class ChannelStats:
    """Per-channel count, mean and sum of squared deviations, merged sample by sample
    (Chan et al.'s parallel update, float64), so the pass streams."""

    def __init__(self) -> None:
        self.count = 0.0
        self.mean: np.ndarray | None = None
        self.m2: np.ndarray | None = None

    def add(self, x: np.ndarray) -> None:
        n = float(x.shape[1])
        mean = x.mean(axis=1)
        m2 = ((x - mean[:, None]) ** 2).sum(axis=1)
        if self.mean is None or self.m2 is None:
            self.count, self.mean, self.m2 = n, mean, m2
            return
        total = self.count + n
        delta = mean - self.mean
        self.mean = self.mean + delta * (n / total)
        self.m2 = self.m2 + m2 + delta**2 * (self.count * n / total)
        self.count = total

    @property
    def std(self) -> np.ndarray:
        if self.m2 is None:
            raise AssertionError("std asked of empty statistics")
        return np.sqrt(self.m2 / self.count)


class FieldStats:
    """The statistics of one field over many samples.

    A sample whose field is missing, empty, or has another channel count than the first
    is left out and counted in ``skipped``. ``pixels`` stays true while every value seen
    is an image in 0-255 (uint8, or floats up to 255 with a maximum above 2). ``low`` is
    the smallest value seen: below 0, the data had a mean subtracted already.
    """

    def __init__(self) -> None:
        self.channels = ChannelStats()
        self.seen = 0
        self.skipped = 0
        self.layout: str | None = None
        self.pixels = True
        self.low = float("inf")

    def add(self, array: np.ndarray | None) -> None:
        if array is None or array.size == 0:
            self.skipped += 1
            return
        this = stats_layout(array)
        x = as_channels(array, this)
        if self.channels.mean is not None and x.shape[0] != self.channels.mean.shape[0]:
            self.skipped += 1
            return
        self.layout = self.layout or this
        self.pixels = (
            self.pixels
            and this in ("CHW", "HWC", "HW")
            and (
                array.dtype == np.uint8
                or (array.min() >= 0 and array.max() <= 255 and array.max() > 2)
            )
        )
        self.channels.add(x)
        finite = x[np.isfinite(x)]
        if finite.size:
            self.low = min(self.low, float(finite.min()))
        self.seen += 1

    @property
    def scale(self) -> float:
        """What the figures are divided by for ``Normalize``: 255 for pixels, else 1."""
        return 255.0 if self.pixels else 1.0


def stats_layout(array: np.ndarray) -> str | None:
    """How statistics split ``array``: per channel of an image, per feature, or overall."""
    if is_image(array):
        return layout(array.shape)
    if array.ndim == 1 and len(array) <= _MAX_FEATURES:
        return "features"
    return None


def as_channels(array: np.ndarray, layout: str | None) -> np.ndarray:
    """``array`` as ``(channels, values)`` float64 rows."""
    x = array.astype(np.float64, copy=False)
    if layout == "features":
        return x.reshape(-1, 1)
    if layout == "CHW":
        return x.reshape(x.shape[0], -1)
    if layout == "HWC":
        return x.reshape(-1, x.shape[-1]).T
    return x.reshape(1, -1)


def format_values(values: Sequence[float]) -> str:
    """``[0.4850, 0.4560, 0.4060]``: figures as a list to paste."""
    return "[" + ", ".join(f"{v:.4f}" for v in values) + "]"
