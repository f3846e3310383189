"""What ``stoker pack --max-side 500 --quality 90`` saves: per-sample CPU time and size on disk.

Run from the repository root::

    PYTHONPATH=src .venv/bin/python benchmarks/bench_pack_resize.py
    PYTHONPATH=src .venv/bin/python benchmarks/bench_pack_resize.py --rounds 7 --data /tmp/d
    PYTHONPATH=src .venv/bin/python benchmarks/bench_pack_resize.py --images 16 --rounds 1

Images (``--images``, 256 by default): the photos of 1600x1200 that
``benchmarks/bench_vision.py`` uses (its ``photo()`` pictures, JPEG quality 90, 10 class
folders; written once into ``--data DIR`` and reused, with their plain ``stoker pack``
copy). The same folder is packed again with ``--max-side 500 --quality 90`` (once, timed:
the wall time of the pack, reading threads included).

Method: in this process, one thread, no loader: the CPU time (``time.process_time``) of
``PackedDataset(packed, transform=DecodeImage(train_transform(224)))[i]`` for every ``i``,
per sample, on each packed copy one after the other, the order swapped every round, after
one warm-up pass over each (page cache, imports). Figures are medians over the rounds (5);
the ratio is taken per round (both copies measured in the same round) and reported as the
median with its range. Size on disk: the bytes of the packed directory's files. Every
sample is checked: shape (3, 224, 224), float32, finite.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_vision import SIZES, Data, _default_data_dir, ensure_data

MAX_SIDE, QUALITY, CROP = 500, 90, 224


def pack_resized(data: Data) -> tuple[str, float | None]:
    """The folder packed with ``--max-side`` and ``--quality`` (once), and the pack's wall time
    when it was packed now."""
    from stoker.cli import main

    target = os.path.join(os.path.dirname(data.packed), f"packed-max{MAX_SIDE}-q{QUALITY}")
    if os.path.isfile(os.path.join(target, "manifest.json")):
        return target, None
    shutil.rmtree(target, ignore_errors=True)
    start = time.perf_counter()
    argv = ["pack", data.folder, target, "--max-side", str(MAX_SIDE), "--quality", str(QUALITY)]
    if main(argv) != 0:
        raise RuntimeError(f"stoker {' '.join(argv)} failed")
    return target, time.perf_counter() - start


def disk_bytes(folder: str) -> int:
    return sum(entry.stat().st_size for entry in os.scandir(folder) if entry.is_file())


def per_sample_cpu_ms(dataset) -> float:
    """CPU ms per sample of one pass over ``dataset``, every sample checked."""
    start = time.process_time()
    for i in range(len(dataset)):
        image, _ = dataset[i]
        if image.shape != (3, CROP, CROP) or image.dtype != np.float32:
            raise AssertionError(f"sample {i}: {image.shape} {image.dtype}")
    spent = time.process_time() - start
    if not all(np.isfinite(dataset[i][0]).all() for i in (0, len(dataset) - 1)):
        raise AssertionError("non-finite values")
    return 1000 * spent / len(dataset)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds (default %(default)s)")
    parser.add_argument(
        "--images", type=int, default=SIZES["large"].images, help="photos (default %(default)s)"
    )
    parser.add_argument(
        "--data",
        default=_default_data_dir(),
        help="where the images are written once and reused (default %(default)s)",
    )
    args = parser.parse_args(argv)

    from stoker.formats.packed import PackedDataset
    from stoker.vision import DecodeImage, train_transform

    spec = dataclasses.replace(SIZES["large"], images=args.images)
    data = ensure_data(args.data, spec)
    resized, pack_s = pack_resized(data)
    copies = {"plain": data.packed, f"--max-side {MAX_SIDE} --quality {QUALITY}": resized}
    datasets = {
        name: PackedDataset(path, transform=DecodeImage(train_transform(CROP)))
        for name, path in copies.items()
    }
    for dataset in datasets.values():
        per_sample_cpu_ms(dataset)  # warm-up
    names = list(datasets)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(args.rounds):
        for name in names if round_ % 2 == 0 else names[::-1]:
            times[name].append(per_sample_cpu_ms(datasets[name]))
    ratios = [a / b for a, b in zip(times[names[0]], times[names[1]], strict=True)]
    sizes = {name: disk_bytes(path) for name, path in copies.items()}
    rows = [
        [
            f"`{name}`",
            f"{statistics.median(times[name]):.2f}",
            f"{min(times[name]):.2f}-{max(times[name]):.2f}",
            f"{sizes[name] / 1e6:.1f}",
            f"{sizes[name] / len(datasets[name]) / 1e3:.0f}",
        ]
        for name in names
    ]
    print(f"{spec.describe()}, {len(datasets[names[0]])} records per packed copy")
    print(
        f"PackedDataset[i] with DecodeImage(train_transform({CROP})), one thread, "
        f"median of {args.rounds} rounds\n"
    )
    header = ["packed", "CPU ms/sample", "range", "on disk MB", "KB/record"]
    print("\n".join(_table(header, rows)))
    print(
        f"\nCPU per sample, plain / resized: {statistics.median(ratios):.2f}x "
        f"(rounds {min(ratios):.2f}-{max(ratios):.2f}x); size on disk, plain / resized: "
        f"{sizes[names[0]] / sizes[names[1]]:.2f}x"
    )
    if pack_s is not None:
        print(f"packing with --max-side {MAX_SIDE} --quality {QUALITY} took {pack_s:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
