"""What the stages load: the naive JPEG dataset, packed records decoded by
stoker.vision, and a batch-level MixUp collate."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["MixUpCollate", "NaiveJpegDataset", "decode_packed"]

_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


class NaiveJpegDataset:
    """The baseline: open the file, decode with Pillow, resize, normalise, CHW.

    Example:
        >>> ds = NaiveJpegDataset(["a.jpg"], [0], size=32)
        >>> len(ds)
        1
    """

    def __init__(self, paths: list[str], labels: list[int], size: int) -> None:
        self.paths = paths
        self.labels = labels
        self.size = size

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        from PIL import Image

        with Image.open(self.paths[index]) as image:
            image = image.convert("RGB").resize((self.size, self.size), Image.BILINEAR)
        pixels = np.asarray(image, dtype=np.float32) * np.float32(1 / 255)
        chw = ((pixels - _MEAN) / _STD).transpose(2, 0, 1)
        return np.ascontiguousarray(chw), self.labels[index]


def decode_packed(size: int, normalise: bool) -> Callable[[Any], Any]:
    """The record transform for packed ``(jpeg bytes, label)`` records: stoker.vision's
    :class:`~stoker.vision.DecodeImage`, resizing to ``size`` x ``size``, CHW.

    ``normalise=False`` keeps the image uint8 (CHW) for a batch-level collate to normalise.

    Example:
        >>> type(decode_packed(32, normalise=False)).__name__
        'DecodeImage'
    """
    from stoker.vision import (
        IMAGENET_MEAN,
        IMAGENET_STD,
        Compose,
        DecodeImage,
        Normalize,
        Resize,
        ToCHW,
    )

    steps: list[Callable[[Any], Any]] = [Resize((size, size))]
    if normalise:
        steps.append(Normalize(IMAGENET_MEAN, IMAGENET_STD))
    steps.append(ToCHW())
    return DecodeImage(Compose(steps))


class MixUpCollate:
    """A batch-level collate: stack uint8 CHW images, normalise to float32 and MixUp, at once.

    MixUp (Zhang et al., 2018) blends each image with another of the batch,
    ``lam * x + (1 - lam) * x[perm]``, and the one-hot labels the same way, with ``lam``
    drawn from Beta(alpha, alpha). It needs the whole batch, so it belongs in the collate
    function, which runs in the workers. Normalisation is linear, so it is folded into
    the mixing: two multiply-adds over the uint8 batch. Randomness comes from
    ``numpy.random``, which stoker seeds per batch.

    Args:
        classes: the number of classes (labels become soft one-hot rows).
        alpha: the Beta distribution's parameter.
        as_torch: return torch tensors (for ``torch.utils.data``, whose workers move
            tensors through shared memory); stoker takes numpy arrays.

    Example:
        >>> collate = MixUpCollate(classes=3)
        >>> black = np.zeros((3, 4, 4), np.uint8)
        >>> images, targets = collate([(black, 0), (black, 2)])
        >>> images.shape, images.dtype, targets.shape, targets.sum(axis=1).round(3).tolist()
        ((2, 3, 4, 4), dtype('float32'), (2, 3), [1.0, 1.0])
    """

    def __init__(self, classes: int, alpha: float = 0.2, as_torch: bool = False) -> None:
        self.classes = classes
        self.alpha = alpha
        self.as_torch = as_torch
        self._scale = (1 / (255 * _STD)).reshape(1, 3, 1, 1)
        self._shift = (_MEAN / _STD).reshape(1, 3, 1, 1)

    def __call__(self, samples: list[tuple[np.ndarray, int]]) -> tuple[Any, Any]:
        pixels = np.stack([image for image, _ in samples])  # uint8 (N, 3, H, W)
        labels = np.fromiter((label for _, label in samples), dtype=np.int64, count=len(samples))
        n = len(samples)
        lam = np.float32(np.random.beta(self.alpha, self.alpha))
        perm = np.random.permutation(n)
        # lam * norm(x) + (1 - lam) * norm(x[perm]), with norm(x) = x * scale - shift
        images = np.multiply(pixels, self._scale * lam, dtype=np.float32)
        images += np.multiply(pixels[perm], self._scale * (1 - lam), dtype=np.float32)
        images -= self._shift
        targets = np.zeros((n, self.classes), dtype=np.float32)
        targets[np.arange(n), labels] = lam
        targets[np.arange(n), labels[perm]] += 1 - lam
        if self.as_torch:
            import torch

            return torch.from_numpy(images), torch.from_numpy(targets)
        return images, targets
