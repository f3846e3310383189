"""The training recipe in fewer passes: the crop drawn before decoding, the last steps in one.

A :class:`~stoker.vision.transforms.Compose` such as :func:`train_transform`'s runs each step
as its own pass over the image: decode the whole JPEG, crop and resize, flip (a copy),
normalise (a float32 copy, then two passes), transpose to CHW (another copy). Two things
make the same recipe cheaper without changing what it draws:

- **The tail in one pass** (:func:`split_tail`): a run of ``RandomHorizontalFlip``,
  ``Normalize`` and ``ToCHW`` at the end of a ``Compose`` becomes one write of the output:
  the flip and the transpose are views, and the float32 result is written once by the
  multiply and updated once by the add. The draws are the same, and so is every value, bit
  for bit.
- **The crop before the decode** (:func:`decode_cropped`): when the first step is a
  ``RandomResizedCrop`` and the image is a JPEG, the crop is drawn from the header's size
  (the same draws the step makes on the decoded image), and the JPEG is decoded at 1/2,
  1/4 or 1/8 scale whenever the crop, reduced so, is still at least the output size. The
  reduced decode (libjpeg-turbo's scaled IDCT, which averages the pixels it merges) costs a
  fraction of the full one: a 1600 x 1200 photo cropped to half its side decodes at 1/2,
  four times fewer pixels. The crop's region of the reduced image is then resized to the
  output in one pass (Pillow's antialiased bilinear). Where the crop is smaller than twice
  the output, the image is decoded at full size and the result is the step's, bit for bit.

``ImageFolder`` and ``DecodeImage`` take this path by themselves for stoker's transforms
(exact types, not subclasses, which may change what a step does); nothing to configure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stoker.vision import _resample
from stoker.vision.decode import _JPEG_MAGIC, MaxPixels, _simplejpeg, decode_image
from stoker.vision.transforms import (
    Compose,
    Normalize,
    RandomHorizontalFlip,
    RandomResizedCrop,
    ToCHW,
    _rng,
)

__all__ = ["Tail", "decode_cropped", "reduced_crop", "region_decoded", "split_tail"]


@dataclass(frozen=True, slots=True)
class Tail:
    """The last steps of a ``Compose`` (flip, normalise, CHW, each optional, in that order),
    applied in one pass; see the module docs."""

    flip: RandomHorizontalFlip | None
    normalize: Normalize | None
    chw: bool

    def applies_to(self, image: Any) -> bool:
        """Whether the one pass gives what the steps would (else they run one by one, and
        raise their own errors)."""
        if not (isinstance(image, np.ndarray) and image.ndim == 3):
            return False
        if self.normalize is None:
            return True
        means = len(self.normalize.mean)
        return means in (1, image.shape[2])

    def __call__(self, image: np.ndarray) -> np.ndarray:
        if self.flip is not None and _rng().random() < self.flip.p:
            image = image[:, ::-1]
            moved = True
        else:
            moved = False
        if self.chw:
            image = image.transpose(2, 0, 1)
            moved = True
        if self.normalize is None:
            return np.ascontiguousarray(image) if moved else image
        multiply, add = _coefficients(self.normalize, image.dtype)
        if self.chw:
            multiply, add = multiply[:, None, None], add[:, None, None]
        out = np.empty(image.shape, dtype=np.float32)
        if image.dtype == np.uint8:  # exact in float32: the same as astype, then *=
            np.multiply(image, multiply, out=out)
        else:  # another dtype converts first, as Normalize does, so every value is the same
            np.copyto(out, image, casting="unsafe")
            out *= multiply
        out += add
        return out


def _coefficients(normalize: Normalize, dtype: np.dtype[Any]) -> tuple[np.ndarray, np.ndarray]:
    """Normalize's float32 multiplier and addend for images of ``dtype`` (as it computes them)."""
    scale = normalize.scale
    factor = (1.0 / 255.0) if (scale or (scale is None and dtype == np.uint8)) else 1.0
    multiply = (factor / normalize.std).astype(np.float32)
    add = (-normalize.mean / normalize.std).astype(np.float32)
    return multiply, add


def split_tail(steps: Sequence[Callable[[Any], Any]]) -> tuple[int, Tail | None]:
    """Where the fusable tail of ``steps`` starts, and the tail (None: nothing to fuse).

    The tail is the longest run at the end of flip, then normalise, then CHW (each at most
    once, in that order) of stoker's own classes; one step alone is left as it is.
    """
    flip: RandomHorizontalFlip | None = None
    normalize: Normalize | None = None
    chw = False
    start = len(steps)
    order = [ToCHW, Normalize, RandomHorizontalFlip]  # from the end
    while start > 0 and order:
        kind = type(steps[start - 1])
        while order and order[0] is not kind:
            order.pop(0)
        if not order:
            break
        order.pop(0)
        start -= 1
        step = steps[start]
        if kind is ToCHW:
            chw = True
        elif kind is Normalize:
            normalize = step  # type: ignore[assignment]
        else:
            flip = step  # type: ignore[assignment]
    if len(steps) - start < 2:
        return len(steps), None
    return start, Tail(flip, normalize, chw)


def reduced_crop(crop: tuple[int, int, int, int], out: tuple[int, int]) -> int:
    """The largest of 8, 4, 2, 1 by which the ``(top, left, height, width)`` crop can be
    reduced and still be at least ``out`` = (height, width)."""
    for factor in (8, 4, 2):
        if crop[2] >= out[0] * factor and crop[3] >= out[1] * factor:
            return factor
    return 1


def _jpeg_size(raw: bytes) -> tuple[int, int] | None:
    """A JPEG's (height, width) from its header; None when it is not a JPEG simplejpeg reads."""
    if raw[:3] != _JPEG_MAGIC:
        return None
    simplejpeg = _simplejpeg(required=False)
    if simplejpeg is None:
        return None
    try:
        height, width, _, _ = simplejpeg.decode_jpeg_header(raw)
    except Exception:  # decode_image says what is wrong with it
        return None
    return int(height), int(width)


def decode_cropped(
    raw: bytes,
    crop_step: RandomResizedCrop,
    *,
    backend: str,
    full_size: bool,
    max_pixels: MaxPixels,
    source: str | None,
) -> np.ndarray:
    """Decodes ``raw`` and applies ``crop_step`` to it, drawing the crop before decoding a
    JPEG, at reduced scale where the crop allows (not with ``full_size``); see the module
    docs. Runs inside ``call_with_shared_rng``: it draws what ``crop_step`` would.

    Raises:
        ImageDecodeError: as :func:`decode_image`, naming ``source``.
    """
    size = _jpeg_size(raw)
    if size is None:  # the size is known once decoded: crop it as the step does
        image = decode_image(raw, backend=backend, max_pixels=max_pixels, source=source)
        return crop_step(image)  # type: ignore[no-any-return]
    height, width = size
    crop = crop_step.get_params(height, width, _rng())
    factor = 1 if full_size else reduced_crop(crop, crop_step.size)
    hint = (-(-height // factor), -(-width // factor)) if factor > 1 else None
    image = decode_image(raw, size_hint=hint, backend=backend, max_pixels=max_pixels, source=source)
    if image.shape[:2] == (height, width):  # full size (or the decoder could not reduce)
        return _resample.resize(image, crop_step.size, crop, crop_step.backend)
    return _resize_region(image, crop, (height, width), crop_step.size)


def _resize_region(
    image: np.ndarray,
    crop: tuple[int, int, int, int],
    full: tuple[int, int],
    out: tuple[int, int],
) -> np.ndarray:
    """Resizes the region of reduced ``image`` that ``crop`` (in full-size pixels of a
    ``full`` image) covers to ``out``, in one antialiased bilinear pass."""
    from PIL import Image

    top, left, h, w = crop
    sy, sx = image.shape[0] / full[0], image.shape[1] / full[1]
    box = (left * sx, top * sy, (left + w) * sx, (top + h) * sy)
    resized = Image.fromarray(image).resize((out[1], out[0]), Image.Resampling.BILINEAR, box=box)
    return np.asarray(resized)


def region_decoded(transform: Any) -> RandomResizedCrop | None:
    """The ``RandomResizedCrop`` a stoker ``Compose`` starts with, when its crop can be
    drawn before decoding (see the module docs); None otherwise."""
    if type(transform) is not Compose or not transform.transforms:
        return None
    first = transform.transforms[0]
    if type(first) is not RandomResizedCrop or first.backend == "numpy":
        return None
    return first
