"""How well a shuffle buffer shuffles a sharded stream, across buffer and shard (file) sizes.

A stream of 100,000 records in 100 files of 1,000 (the shards of a corpus), read by
``TextLines`` with and without shuffled file order, through shuffle buffers of several
sizes. The figure is Spearman's rank correlation between a record's place in the files
and its place in the epoch: 1.0 is the files' order, 0.0 is what a full shuffle gives
(within about +-0.003 at this size). Also the median distance a record moves, and the share
of records delivered right after their neighbour in the files (local order kept: 0 for a full
shuffle), which a global correlation misses when only the file order is shuffled.

A second table keeps the records and changes the shard size (records per file, with
``shuffle_files=True``): it adds "files per 100", the mean number of distinct files among
each 100 consecutive records of the epoch (a full shuffle over 100 or more files gives
about 63 with 100 files, more with more files), which shows how many shards a buffer
really mixes at a time.

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


def measure(folder: str, buffer: int | None, shuffle_files: bool) -> np.ndarray:
    """The epoch's order of the records (their places in the files), checked a permutation."""
    stream = TextLines(folder, shuffle_buffer=buffer, shuffle_files=shuffle_files, seed=7,
                       transform=int)  # fmt: skip
    order = np.fromiter(iter(stream), dtype=np.int64)
    assert np.array_equal(np.sort(order), np.arange(len(order))), "not a permutation"
    return order


def figures(order: np.ndarray) -> tuple[float, float, float]:
    """(rank correlation, median move, neighbours kept) of an epoch's order."""
    moved = np.abs(np.argsort(order) - np.arange(len(order)))
    return spearman(order), float(np.median(moved)), neighbours_kept(order)


def files_per_window(order: np.ndarray, per_file: int, window: int = 100) -> float:
    """Mean number of distinct files among each ``window`` consecutive records of ``order``."""
    usable = len(order) // window * window
    if usable == 0:
        return float(len(np.unique(order // per_file)))
    blocks = np.sort((order[:usable] // per_file).reshape(-1, window), axis=1)
    return float(np.mean(1 + np.sum(np.diff(blocks, axis=1) != 0, axis=1)))


def neighbours_kept(order: np.ndarray) -> float:
    """Share of records that come right after the record before them in the files."""
    return float(np.mean(np.diff(order) == 1)) if len(order) > 1 else 1.0


def sizes(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def buffer_table(files: int, per_file: int, buffers: list[int]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        write_files(folder, files, per_file)
        n = files * per_file
        print(f"{n:,} records in {files} files of {per_file:,}")
        print(
            "| shuffle_files | shuffle_buffer | rank correlation | median move | neighbours kept |"
        )
        print("|---|---:|---:|---:|---:|")
        for shuffle_files in (False, True):
            for buffer in (None, *buffers):
                rho, moved, kept = figures(measure(folder, buffer, shuffle_files))
                label = "-" if buffer is None else f"{buffer:,}"
                print(f"| {shuffle_files} | {label} | {rho:+.3f} | {moved:,.0f} | {kept:.1%} |")
        full = np.random.default_rng(0).permutation(n)
        rho, moved, kept = figures(full)
        print(f"| (a full permutation) | | {rho:+.3f} | {moved:,.0f} | {kept:.1%} |")


def shard_table(records: int, shard_sizes: list[int], buffers: list[int]) -> None:
    print()
    print(f"{records:,} records, shuffle_files=True, across shard sizes")
    print(
        "| records per file | files | shuffle_buffer | rank correlation | median move "
        "| neighbours kept | files per 100 |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for per_file in shard_sizes:
        files = records // per_file
        with tempfile.TemporaryDirectory() as folder:
            write_files(folder, files, per_file)
            for buffer in (None, *buffers):
                order = measure(folder, buffer, True)
                rho, moved, kept = figures(order)
                mixed = files_per_window(order, per_file)
                label = "-" if buffer is None else f"{buffer:,}"
                print(
                    f"| {per_file:,} | {files:,} | {label} | {rho:+.3f} | {moved:,.0f} "
                    f"| {kept:.1%} | {mixed:.1f} |"
                )
        full = np.random.default_rng(0).permutation(files * per_file)
        rho, moved, kept = figures(full)
        print(
            f"| {per_file:,} | {files:,} | (a full permutation) | {rho:+.3f} | {moved:,.0f} "
            f"| {kept:.1%} | {files_per_window(full, per_file):.1f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=100)
    parser.add_argument("--per-file", type=int, default=1000)
    parser.add_argument("--buffers", default="100,1000,10000,100000", help="comma-separated")
    parser.add_argument(
        "--shard-sizes", default="100,1000,10000", help="records per file, comma-separated"
    )
    parser.add_argument("--shard-buffers", default="1000,10000", help="comma-separated")
    args = parser.parse_args()
    buffer_table(args.files, args.per_file, sizes(args.buffers))
    records = args.files * args.per_file
    shard_table(records, sizes(args.shard_sizes), sizes(args.shard_buffers))


if __name__ == "__main__":
    main()
