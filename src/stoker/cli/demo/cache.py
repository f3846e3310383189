"""The demo's images, built once in a cache folder and reused: JPEG files in class folders,
and the same images as packed shards."""

from __future__ import annotations

import errno
import io
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from stoker._proc import pid_exists
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
    """The demo images (and their packed copy) in ``root``; built once, then reused.

    Safe when several demos start at once: each builds in a private folder
    (``.<name>.build-<pid>-*``) and publishes it with one atomic rename. A run that finds
    the cache published by another uses it, and a published cache is never deleted, so a
    run reading it never sees its files disappear. Private folders left by runs that died
    are removed once their process is gone.
    """
    home = os.path.join(root, config.name)
    folder, packed = os.path.join(home, "images"), os.path.join(home, "packed")
    classes = [f"class_{c:02d}" for c in range(config.classes)]
    paths = [
        os.path.join(folder, classes[i % config.classes], f"{i:05d}.jpg")
        for i in range(config.images)
    ]
    labels = [i % config.classes for i in range(config.images)]

    def data(built_s: float) -> DemoData:
        return DemoData(folder, packed, paths, labels, built_s)

    if _complete(home, paths):
        return data(0.0)
    import PIL.Image  # noqa: F401 - a missing Pillow fails before anything is written

    start = time.perf_counter()
    say(
        f"building {config.images} synthetic {config.width}x{config.height} JPEGs "
        f"in {home} (once) ..."
    )
    os.makedirs(root, exist_ok=True)
    _remove_abandoned(root, config.name)
    scratch = tempfile.mkdtemp(prefix=f"{_private_prefix(config.name)}{os.getpid()}-", dir=root)
    try:
        _write(scratch, config, classes, paths, labels, folder)
        _publish(scratch, home, paths, config.name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # gone already once published
    return data(time.perf_counter() - start)


def _complete(home: str, paths: list[str]) -> bool:
    return os.path.isfile(os.path.join(home, "packed", "manifest.json")) and all(
        os.path.isfile(p) for p in paths
    )


def _private_prefix(name: str) -> str:
    return f".{name}.build-"


def _write(
    scratch: str,
    config: DemoConfig,
    classes: list[str],
    paths: list[str],
    labels: list[int],
    folder: str,
) -> None:
    """Writes the JPEG files and their packed copy into ``scratch``."""
    from PIL import Image

    from stoker.formats.packed import PackedWriter

    rng = np.random.default_rng(0)
    grid = np.mgrid[0 : config.height, 0 : config.width].astype(np.float32)
    with PackedWriter(os.path.join(scratch, "packed"), classes=classes) as writer:
        for path, label in zip(paths, labels, strict=True):
            relative = os.path.relpath(path, folder)
            target = os.path.join(scratch, "images", relative)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            buffer = io.BytesIO()
            Image.fromarray(_photo(rng, (grid[0], grid[1]))).save(buffer, format="JPEG", quality=90)
            with open(target, "wb") as f:
                f.write(buffer.getvalue())
            writer.add((buffer.getvalue(), label), key=relative)


def _publish(scratch: str, home: str, paths: list[str], name: str) -> None:
    """Renames ``scratch`` to ``home`` in one step, unless another run published first.

    An incomplete ``home`` (left by an interrupted older build: nobody reads it) is first
    renamed aside, then deleted; a complete one is kept and used.
    """
    for _ in range(10):
        try:
            os.rename(scratch, home)  # atomic; fails if home exists and is not empty
            return
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        if _complete(home, paths):
            return  # another run won the race: use its cache; ours is removed by the caller
        aside = tempfile.mkdtemp(
            prefix=f"{_private_prefix(name)}{os.getpid()}-", dir=os.path.dirname(home)
        )
        try:
            os.rename(home, os.path.join(aside, "old"))
        except FileNotFoundError:
            pass  # another run moved it first
        finally:
            shutil.rmtree(aside, ignore_errors=True)
    msg = f"could not publish the demo images in {home}: it keeps changing"
    raise OSError(msg)


def _remove_abandoned(root: str, name: str) -> None:
    """Deletes private build folders whose process has exited (a run that was killed)."""
    prefix = _private_prefix(name)
    for entry in os.listdir(root):
        if not entry.startswith(prefix):
            continue
        pid = entry[len(prefix) :].partition("-")[0]
        if pid.isdigit() and int(pid) != os.getpid() and not pid_exists(int(pid)):
            shutil.rmtree(os.path.join(root, entry), ignore_errors=True)
