"""Antialiased bilinear resizing: Pillow when it can, else a numpy version of Pillow's filter."""

from __future__ import annotations

import numpy as np

__all__ = ["check_backend", "resize"]


def check_backend(backend: str) -> str:
    if backend not in ("auto", "numpy", "pillow"):
        msg = f"backend must be 'auto', 'numpy' or 'pillow', got {backend!r}"
        raise ValueError(msg)
    return backend


def resize(
    image: np.ndarray, size: tuple[int, int], box: tuple[int, int, int, int] | None, backend: str
) -> np.ndarray:
    """Resizes ``image[box]`` (top, left, height, width) to ``size`` = (height, width).

    The crop is taken first, as torchvision does (Pillow's own ``box=`` would let the
    filter read pixels outside the box).
    """
    if box is not None:
        top, left, h, w = box
        image = image[top : top + h, left : left + w]
    pillow_ok = image.dtype == np.uint8 and (image.ndim == 2 or image.shape[2] in (1, 3))
    if backend == "pillow" and not pillow_ok:
        msg = (
            "backend='pillow' resizes uint8 images with 1 or 3 channels, "
            f"got {image.dtype} of shape {image.shape}"
        )
        raise ValueError(msg)
    if backend == "pillow" or (backend == "auto" and pillow_ok):
        try:
            from PIL import Image
        except ImportError:
            if backend == "pillow":
                raise
        else:
            squeeze = image.ndim == 3 and image.shape[2] == 1
            pil = Image.fromarray(np.ascontiguousarray(image[:, :, 0] if squeeze else image))
            out = np.array(pil.resize((size[1], size[0]), Image.Resampling.BILINEAR))  # writable
            return out[:, :, None] if squeeze else out
    return _resize_numpy(image, size)


def _resize_numpy(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Separable antialiased bilinear (triangle filter stretched when shrinking), as Pillow does."""
    integer = image.dtype == np.uint8
    out = image.astype(np.float32)
    for axis, target in ((1, size[1]), (0, size[0])):  # Pillow's order: horizontal, then vertical
        if out.shape[axis] != target:
            out = _resample_axis(out, axis, target)
            if integer:  # Pillow keeps 8 bits between the passes
                np.clip(np.rint(out, out=out), 0, 255, out=out)
    return out.astype(np.uint8) if integer else out


def _resample_axis(image: np.ndarray, axis: int, out_size: int) -> np.ndarray:
    in_size = image.shape[axis]
    indices, weights = _bilinear_taps(in_size, out_size)
    out = np.zeros((*image.shape[:axis], out_size, *image.shape[axis + 1 :]), dtype=np.float32)
    shape = [1] * image.ndim
    shape[axis] = out_size
    for k in range(indices.shape[1]):
        out += np.take(image, indices[:, k], axis=axis) * weights[:, k].reshape(shape)
    return out


def _bilinear_taps(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Per output pixel, the input indices and normalised triangle-filter weights (Pillow's)."""
    scale = in_size / out_size
    support = max(scale, 1.0)  # the triangle's half-width, stretched when downscaling
    centers = (np.arange(out_size) + 0.5) * scale
    first = np.clip((centers - support + 0.5).astype(np.int64), 0, in_size)
    last = np.clip((centers + support + 0.5).astype(np.int64), 0, in_size)
    taps = int((last - first).max())
    indices = first[:, None] + np.arange(taps)[None, :]
    weights = np.maximum(0.0, 1.0 - np.abs((indices - centers[:, None] + 0.5) / support))
    weights[indices >= last[:, None]] = 0.0
    weights /= weights.sum(axis=1, keepdims=True)
    return np.minimum(indices, in_size - 1), weights.astype(np.float32)
