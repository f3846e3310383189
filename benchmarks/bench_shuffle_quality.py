"""How well a shuffle buffer shuffles a sharded stream: rank correlation, for a few buffer sizes.

A stream of 100,000 records in 100 files of 1,000 (the shards of a corpus), read by
``TextLines`` with and without shuffled file order, through shuffle buffers of several
sizes. The figure is Spearman's rank correlation between a record's place in the files
and its place in the epoch: 1.0 is the files' order, 0.0 is what a full shuffle gives
(within about +-0.003 at this size). Also the median distance a record moves, and the share
of records delivered right after their neighbour in the files (local order kept: 0 for a full
shuffle), which a global correlation misses when only the file order is shuffled.

    .venv/bin/python benchmarks/bench_shuffle_quality.py
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np

from stoker.formats.text import TextLines


def write_files(folder: str, files: int, per_file: int) -> None:
    for f in range(files):
        with open(os.path.join(folder, f"part-{f:05d}.txt"), "w", encoding="utf-8") as out:
            out.writelines(f"{f * per_file + r}\n" for r in range(per_file))


def spearman(order: np.ndarray) -> float:
    """Rank correlation of ``order`` (a permutation of 0..n-1) with 0..n-1."""
    n = len(order)
    places = np.arange(n, dtype=np.float64)
    return float(np.corrcoef(places, order.astype(np.float64))[0, 1]) if n > 1 else 1.0


def measure(folder: str, buffer: int | None, shuffle_files: bool) -> tuple[float, float, float]:
    stream = TextLines(folder, shuffle_buffer=buffer, shuffle_files=shuffle_files, seed=7,
                       transform=int)  # fmt: skip
    order = np.fromiter(iter(stream), dtype=np.int64)
    assert np.array_equal(np.sort(order), np.arange(len(order))), "not a permutation"
    moved = np.abs(np.argsort(order) - np.arange(len(order)))
    return spearman(order), float(np.median(moved)), neighbours_kept(order)


def neighbours_kept(order: np.ndarray) -> float:
    """Share of records that come right after the record before them in the files."""
    return float(np.mean(np.diff(order) == 1)) if len(order) > 1 else 1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=100)
    parser.add_argument("--per-file", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        write_files(folder, args.files, args.per_file)
        n = args.files * args.per_file
        print(f"{n:,} records in {args.files} files of {args.per_file:,}")
        print(
            "| shuffle_files | shuffle_buffer | rank correlation | median move | neighbours kept |"
        )
        print("|---|---:|---:|---:|---:|")
        for shuffle_files in (False, True):
            for buffer in (None, 100, 1_000, 10_000, 100_000):
                rho, moved, kept = measure(folder, buffer, shuffle_files)
                label = "-" if buffer is None else f"{buffer:,}"
                print(f"| {shuffle_files} | {label} | {rho:+.3f} | {moved:,.0f} | {kept:.1%} |")
        full = np.random.default_rng(0).permutation(n)
        moved = np.median(np.abs(np.argsort(full) - np.arange(n)))
        print(
            f"| (a full permutation) | | {spearman(full):+.3f} | {moved:,.0f} "
            f"| {neighbours_kept(full):.1%} |"
        )


if __name__ == "__main__":
    main()
