"""``stoker demo``: load a small synthetic dataset and show what came out and how fast."""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

__all__ = ["add_parser", "run"]


class SyntheticImages:
    """A map-style dataset of random uint8 images with a per-sample numpy transform.

    Each sample is ``(image float32[3, size, size], label int)``: the image is drawn
    from a per-index RNG (so it is the same every time), flipped, scaled to [0, 1] and
    normalised, like a light augmentation pipeline.
    """

    def __init__(self, length: int, size: int, num_classes: int = 10) -> None:
        self.length = length
        self.size = size
        rng = np.random.default_rng(0)
        self.labels = rng.integers(0, num_classes, size=length)
        self.mean = np.array([0.485, 0.456, 0.406], dtype=np.float32).reshape(3, 1, 1)
        self.std = np.array([0.229, 0.224, 0.225], dtype=np.float32).reshape(3, 1, 1)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        rng = np.random.default_rng(index)
        image = rng.integers(0, 256, size=(3, self.size, self.size), dtype=np.uint8)
        if index % 2:
            image = image[:, :, ::-1]
        scaled = image.astype(np.float32) * np.float32(1 / 255)
        return (scaled - self.mean) / self.std, int(self.labels[index])


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "demo",
        help="load a synthetic dataset and report throughput",
        description="Load a small synthetic image dataset with stoker and report what it "
        "loaded and how fast (and the same with torch.utils.data when torch is installed).",
    )
    parser.add_argument("--samples", type=int, default=4096, help="dataset length (default 4096)")
    parser.add_argument("--size", type=int, default=64, help="image side in pixels (default 64)")
    parser.add_argument("--batch-size", type=int, default=64, help="batch size (default 64)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs to time (default 2)")
    parser.set_defaults(run=run)


def _time_epochs(loader: Any, epochs: int) -> tuple[float, int, int]:
    start = time.perf_counter()
    batches = samples = 0
    for _ in range(epochs):
        for images, _labels in loader:
            batches += 1
            samples += len(images)
    return time.perf_counter() - start, batches, samples


def run(args: argparse.Namespace) -> int:
    from stoker import DataLoader

    dataset = SyntheticImages(args.samples, args.size)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, generator=0)
    images, labels = next(iter(loader))
    print(f"stoker demo: {len(dataset)} synthetic images of 3x{args.size}x{args.size}, batch {args.batch_size}")
    print(
        f"  first batch: images {images.dtype}{list(images.shape)} "
        f"mean {images.mean():+.3f} std {images.std():.3f}; labels {labels.dtype}{list(labels.shape)} "
        f"{labels[:8].tolist()}..."
    )
    elapsed, batches, samples = _time_epochs(loader, args.epochs)
    mb = samples * images[0].nbytes / 1e6
    print(
        f"  stoker.DataLoader (num_workers=0): {batches} batches in {elapsed:.2f} s = "
        f"{batches / elapsed:,.0f} batches/s, {samples / elapsed:,.0f} samples/s, {mb / elapsed:,.0f} MB/s"
    )
    try:
        import torch.utils.data
    except ImportError:
        print("  (install torch to compare with torch.utils.data.DataLoader)")
        return 0
    reference = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True)
    t_elapsed, t_batches, _ = _time_epochs(reference, args.epochs)
    print(
        f"  torch.utils.data.DataLoader (num_workers=0): {t_batches} batches in {t_elapsed:.2f} s = "
        f"{t_batches / t_elapsed:,.0f} batches/s; stoker/torch speed ratio {t_elapsed / elapsed:.2f}x"
    )
    return 0
