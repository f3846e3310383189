"""The datasets that ``bench_engine.py`` loads, one per workload.

Every dataset is a plain map-style class (``__getitem__`` and ``__len__``, no
``__getitems__``), written the way a torch user writes one, so that
``torch.utils.data.DataLoader`` and ``stoker.DataLoader`` are handed the *same* object
and do the same per-sample work. Nothing here imports torch or stoker. Each declares
``thread_safe = True`` (it is a pure function of the index), which lets stoker's
default ``worker_mode="auto"`` try thread workers; other loaders ignore it.

Workloads:

- ``TinyDataset``: two Python numbers per sample; measures per-batch overhead.
- ``LargeArrayDataset``: one 3x256x256 float32 array per sample (768 KiB); measures
  how batches move between processes.
- ``CpuTransformDataset``: ~1.5 ms of single-threaded numpy (FFT filtering) per sample;
  measures how well the work is spread over the workers.
- ``JpegDataset``: decode a 256x256 JPEG with Pillow, random 224 crop, random flip,
  normalise to float32 CHW; the usual image-classification input pipeline.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile

import numpy as np

__all__ = [
    "CpuTransformDataset",
    "JpegDataset",
    "JpegFolder",
    "LargeArrayDataset",
    "TinyDataset",
    "write_jpeg_folder",
]

_IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32) * 255
_IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32) * 255


class TinyDataset:
    """Sample ``i`` is ``(i, float(i))``: two Python numbers.

    Example:
        >>> TinyDataset(4)[3]
        (3, 3.0)
    """

    thread_safe = True  # a pure function of the index: stoker may run it in threads

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[int, float]:
        return index, float(index)


class LargeArrayDataset:
    """Sample ``i`` is a float32 array of ``shape`` taken from a small precomputed pool.

    The pool keeps the per-sample cost at zero, so only collation and transport count.

    Example:
        >>> LargeArrayDataset(8, shape=(3, 4, 4))[5].shape
        (3, 4, 4)
    """

    thread_safe = True  # a pure function of the index: stoker may run it in threads

    def __init__(self, length: int, shape: tuple[int, ...] = (3, 256, 256), pool: int = 4) -> None:
        self.length = length
        rng = np.random.default_rng(0)
        self.pool = [rng.standard_normal(shape, dtype=np.float32) for _ in range(pool)]

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> np.ndarray:
        return self.pool[index % len(self.pool)]


class CpuTransformDataset:
    """Sample ``i`` is ``(image, label)`` after ``steps`` rounds of FFT filtering.

    Each round is a low-pass filter in the frequency domain (``rfft2`` / ``irfft2``, which
    numpy runs on one thread), a ``tanh`` and a rescale, on a 3x64x64 float32 image: about
    0.16 ms per round on this machine, so the default 10 rounds cost ~1.6 ms per sample.
    No BLAS call is involved, so the work is single-threaded whatever the thread settings.

    Example:
        >>> image, label = CpuTransformDataset(4, steps=1)[2]
        >>> image.shape, image.dtype, label
        ((3, 64, 64), dtype('float32'), 2)
    """

    thread_safe = True  # a pure function of the index: stoker may run it in threads

    def __init__(self, length: int, size: int = 64, steps: int = 10, pool: int = 8) -> None:
        self.length = length
        self.size = size
        self.steps = steps
        rng = np.random.default_rng(1)
        self.pool = [rng.standard_normal((3, size, size), dtype=np.float32) for _ in range(pool)]
        window = np.outer(np.hanning(size), np.hanning(size)).astype(np.float32)
        self.kernel = np.fft.rfft2(window)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        x = self.pool[index % len(self.pool)]
        shape = (self.size, self.size)
        for _ in range(self.steps):
            x = np.fft.irfft2(np.fft.rfft2(x) * self.kernel, s=shape).astype(np.float32)
            x = np.tanh(x)
            x = x / (np.abs(x).max() + np.float32(1e-6))
        return x, index


class JpegDataset:
    """Sample ``i`` is ``(image, label)``: file ``i % len(paths)`` decoded and augmented.

    Decode with Pillow, random ``crop``-pixel square crop, random horizontal flip,
    normalise with the ImageNet mean and standard deviation, HWC uint8 -> CHW float32.
    Randomness comes from Python's ``random`` module, which both loaders seed in every
    worker.

    Example:
        >>> folder = write_jpeg_folder(2, size=64)
        >>> image, label = JpegDataset(folder.paths, 4, crop=56)[3]
        >>> image.shape, image.dtype, label
        ((3, 56, 56), dtype('float32'), 3)
        >>> folder.remove()
    """

    thread_safe = True  # a pure function of the index: stoker may run it in threads

    def __init__(self, paths: list[str], length: int, crop: int = 224) -> None:
        self.paths = list(paths)
        self.length = length
        self.crop = crop

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        from PIL import Image

        with Image.open(self.paths[index % len(self.paths)]) as image:
            pixels = np.asarray(image.convert("RGB"))
        height, width, _ = pixels.shape
        top = random.randrange(height - self.crop + 1)
        left = random.randrange(width - self.crop + 1)
        pixels = pixels[top : top + self.crop, left : left + self.crop]
        if random.random() < 0.5:
            pixels = pixels[:, ::-1]
        out = (pixels.astype(np.float32) - _IMAGENET_MEAN) / _IMAGENET_STD
        return np.ascontiguousarray(out.transpose(2, 0, 1)), index


class JpegFolder:
    """A temporary folder of JPEG files; :meth:`remove` deletes it (safe to call twice)."""

    def __init__(self, root: str, paths: list[str]) -> None:
        self.root = root
        self.paths = paths

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def write_jpeg_folder(count: int, size: int = 256, quality: int = 90, seed: int = 0) -> JpegFolder:
    """Writes ``count`` photo-like JPEGs (smooth colour waves plus noise) to a temp folder.

    Waves plus sensor-like noise compress to ~27 KB at 256x256, quality 90, about
    what a photo of that size does; pure noise would be larger and slower to decode,
    flat colour smaller and faster.
    """
    from PIL import Image

    root = tempfile.mkdtemp(prefix="stoker-bench-jpeg-")
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    paths = []
    for i in range(count):
        fx, fy, phase = rng.uniform(0.01, 0.08, 3)
        waves = np.stack([np.sin(xx * fx + yy * fy * c + phase * c) for c in (1, 2, 3)], axis=-1)
        pixels = (waves * 0.5 + 0.5) * 200 + rng.normal(0, 12, (size, size, 3))
        path = os.path.join(root, f"{i:05d}.jpg")
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(
            path, format="JPEG", quality=quality
        )
        paths.append(path)
    return JpegFolder(root, paths)
