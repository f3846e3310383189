"""The demo's images, built once in a cache folder and reused: JPEG files in class folders,
and the same images as packed shards."""

from __future__ import annotations

import io
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from stoker.cli.demo.config import DemoConfig

__all__ = ["DemoData", "build", "cache_root"]


def cache_root(explicit: str | None) -> str:
    if explicit:
        return explicit
    base = os.environ.get("STOKER_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "stoker"
    )
    return os.path.join(base, "demo")


def _photo(rng: np.random.Generator, grid: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """A photo-like picture: smooth colour waves plus sensor-like noise (~80 KB at 500x375)."""
    yy, xx = grid
    fx, fy, phase = rng.uniform(0.01, 0.08, 3).astype(np.float32)
    waves = np.stack([np.sin(xx * fx + yy * (fy * c) + phase * c) for c in (1, 2, 3)], axis=-1)
    noise = rng.integers(-20, 21, waves.shape, dtype=np.int16)
    return np.clip((waves * 100 + 128).astype(np.int16) + noise, 0, 255).astype(np.uint8)


@dataclass(frozen=True, slots=True)
class DemoData:
    folder: str  # images/<class>/<n>.jpg
    packed: str  # the same images as packed shards
    paths: list[str]
    labels: list[int]
    built_s: float  # 0 when reused from the cache


def build(root: str, config: DemoConfig, say: Callable[[str], None]) -> DemoData:
    """The demo images (and their packed copy) in ``root``; built once, then reused."""
    from PIL import Image

    from stoker.formats.packed import PackedWriter

    home = os.path.join(root, config.name)
    folder, packed = os.path.join(home, "images"), os.path.join(home, "packed")
    classes = [f"class_{c:02d}" for c in range(config.classes)]
    paths = [
        os.path.join(folder, classes[i % config.classes], f"{i:05d}.jpg")
        for i in range(config.images)
    ]
    labels = [i % config.classes for i in range(config.images)]
    if os.path.isfile(os.path.join(packed, "manifest.json")) and all(
        os.path.isfile(p) for p in paths
    ):
        return DemoData(folder, packed, paths, labels, 0.0)
    start = time.perf_counter()
    say(
        f"building {config.images} synthetic {config.width}x{config.height} JPEGs "
        f"in {home} (once) ..."
    )
    os.makedirs(root, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix=f".{config.name}-", dir=root)
    try:
        rng = np.random.default_rng(0)
        grid = np.mgrid[0 : config.height, 0 : config.width].astype(np.float32)
        with PackedWriter(os.path.join(scratch, "packed"), classes=classes) as writer:
            for path, label in zip(paths, labels, strict=True):
                relative = os.path.relpath(path, folder)
                target = os.path.join(scratch, "images", relative)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                buffer = io.BytesIO()
                Image.fromarray(_photo(rng, (grid[0], grid[1]))).save(
                    buffer, format="JPEG", quality=90
                )
                with open(target, "wb") as f:
                    f.write(buffer.getvalue())
                writer.add((buffer.getvalue(), label), key=relative)
        shutil.rmtree(home, ignore_errors=True)
        os.replace(scratch, home)  # atomic: a half-built cache is never taken for a whole one
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return DemoData(folder, packed, paths, labels, time.perf_counter() - start)
