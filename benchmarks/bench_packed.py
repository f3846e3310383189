"""Packed shards with block-shuffle sampling against loose JPEG files with random sampling.

The workload is bench_engine.py's JPEG pipeline (``bench_workloads.JpegDataset``: Pillow
decode, random square crop, random flip, ImageNet normalisation to float32 CHW) on many
small JPEGs written by ``bench_workloads.write_jpeg_folder``. Both sides run the *same*
``JpegDataset.__getitem__``; only where the encoded bytes come from differs:

- loose: ``Image.open(path)`` on one file per sample, ``stoker.RandomSampler``;
- packed: the same files packed by ``PackedWriter`` (in file order), the record's bytes
  read from the memory-mapped shard, ``stoker.BlockShuffleSampler``.

Each round times one epoch of each side with ``stoker.DataLoader(num_workers=2)`` with a
warm page cache (every file read just before) and one with a cold page cache (files
evicted just before: ``/proc/sys/vm/drop_caches`` when writable, else
``posix_fadvise(DONTNEED)`` on every file), alternating which side goes first. Workers are
not persistent, so no process keeps a shard mapped across an eviction. The clock starts
when the first batch arrives (worker start-up excluded) and stops at the last batch.

Run: ``.venv/bin/python benchmarks/bench_packed.py`` (about 2 minutes). It asserts nothing.

``--containers [N]`` runs the measurement behind the format's choice of container
instead (docs/packed-format.md): random reads of N small records from a numpy memmap
layout, an Arrow IPC file and LMDB, warm and cold (Arrow and LMDB only where pyarrow and
lmdb are installed; stoker does not depend on them).

``--verify`` measures instead what each ``PackedDataset(verify=...)`` mode costs on the same
packed JPEGs, as a ratio to ``verify=False`` (docs/integrity.md): opening (``"open"`` checks
every record there), one epoch of the JPEG workload through ``stoker.DataLoader``, and one
pass of bare record fetches (``__getitems__`` in block-shuffled batches, no decoding: the
worst case for ``"read"``). Each round runs the modes side by side in a rotating order, warm
page cache; figures are medians over the rounds.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_engine import _git_commit, wait_for_idle
from bench_workloads import JpegDataset, write_jpeg_folder

import stoker
from stoker.formats.packed import PackedDataset, PackedWriter

_DROP_CACHES = "/proc/sys/vm/drop_caches"


class _PackedBytes(Sequence):
    """Looks like ``JpegDataset.paths`` but hands out the packed record as a file object."""

    def __init__(self, packed: PackedDataset) -> None:
        self.packed = packed

    def __len__(self) -> int:
        return len(self.packed)

    def __getitem__(self, index: Any) -> io.BytesIO:
        return io.BytesIO(self.packed[index])


class PackedJpegDataset(JpegDataset):
    """``JpegDataset`` whose encoded bytes come from a packed dataset instead of files."""

    def __init__(self, packed_dir: str, crop: int, verify: bool | str = False) -> None:
        packed = PackedDataset(packed_dir, verify=verify)
        super().__init__([], len(packed), crop)
        self.paths = _PackedBytes(packed)  # type: ignore[assignment]


def write_images(count: int, sizes: list[int]) -> tuple[list[str], list[Any]]:
    """``count`` JPEGs, sizes taken in turn from ``sizes``; paths interleaved by size."""
    per = -(-count // len(sizes))
    folders = [write_jpeg_folder(per, size=size, seed=k) for k, size in enumerate(sizes)]
    paths = [folder.paths[i] for i in range(per) for folder in folders][:count]
    return paths, folders


def pack(paths: list[str], dst: str, shard_bytes: int) -> None:
    with PackedWriter(dst, max_shard_bytes=shard_bytes) as writer:
        for path in paths:
            with open(path, "rb") as f:
                writer.add(f.read(), key=path)


def evict(files: list[str], method: str) -> None:
    os.sync()
    if method == "drop_caches":
        with open(_DROP_CACHES, "w") as f:
            f.write("3\n")
        return
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm(files: list[str]) -> None:
    for path in files:
        with open(path, "rb") as f:
            while f.read(1 << 20):
                pass


def resident_fraction(files: list[str]) -> float | None:
    """Share of the files' bytes in the page cache (util-linux ``fincore``), or None."""
    if shutil.which("fincore") is None or not files:
        return None
    resident = total = 0
    for start in range(0, len(files), 500):
        chunk = files[start : start + 500]
        out = subprocess.run(
            ["fincore", "--bytes", "--noheadings", "--raw", "-o", "RES,SIZE", *chunk],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        for line in out.splitlines():
            res, size = line.split()[:2]
            resident += int(res)
            total += int(size)
    return resident / total if total else None


def choose_eviction(requested: str) -> str:
    if requested != "auto":
        return requested
    try:
        with open(_DROP_CACHES, "w") as f:
            f.write("1\n")
        return "drop_caches"
    except OSError:
        return "fadvise"


def time_epoch(dataset: Any, sampler: Any, batch_size: int, workers: int) -> float:
    """Batches per second of one epoch, from the first batch to the last."""
    loader = stoker.DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=workers)
    iterator = iter(loader)
    next(iterator)
    start = time.perf_counter()
    batches = sum(1 for _ in iterator)
    elapsed = time.perf_counter() - start
    del iterator, loader
    gc.collect()
    return batches / elapsed


# ------------------------------------------------------------------ choosing the container


def compare_containers(  # noqa: C901 (one measured run writes and reads every candidate)
    count: int, method: str, repeats: int = 3
) -> list[dict[str, Any]]:
    """The measurement behind docs/packed-format.md's choice of container.

    ``count`` records of 3-9 KB (small-JPEG sized random bytes) are written to each
    candidate, then read in one random order, each read consuming the bytes (a crc32, as
    a decoder would read them all): best of ``repeats`` warm passes, then one pass after
    evicting the files. Candidates whose package is missing are skipped: numpy (raw
    payload + .npy offset index, ``np.memmap``), Arrow IPC (pyarrow) and LMDB (lmdb).
    """
    import zlib

    rng = np.random.default_rng(0)
    sizes = rng.integers(3000, 9000, count)
    blob = rng.integers(0, 256, int(sizes.sum()), dtype=np.uint8).tobytes()
    ends = np.cumsum(sizes)
    starts = ends - sizes
    records = [blob[a:b] for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]
    order = rng.permutation(count).tolist()
    root = tempfile.mkdtemp(prefix="stoker-bench-containers-")
    rows = []

    def numpy_write(d: str) -> None:
        with open(f"{d}/data.bin", "wb") as f:
            for record in records:
                f.write(record)
        index = np.zeros(count, dtype=[("offset", "<i8"), ("length", "<i8"), ("crc32", "<u4")])
        index["offset"], index["length"] = starts, sizes
        index["crc32"] = [zlib.crc32(r) for r in records]
        np.save(f"{d}/index.npy", index)

    def numpy_open(d: str) -> Any:
        return np.load(f"{d}/index.npy"), np.memmap(f"{d}/data.bin", dtype=np.uint8, mode="r")

    def numpy_read(state: Any) -> int:
        index, data = state
        offsets, lengths = index["offset"].tolist(), index["length"].tolist()
        return sum(zlib.crc32(data[offsets[i] : offsets[i] + lengths[i]]) for i in order)

    candidates: list[tuple[str, Any, Any, Any, Any]] = [
        ("numpy .npy + memmap", numpy_write, numpy_open, numpy_read, None)
    ]
    try:
        import pyarrow as pa
    except ImportError:
        print("pyarrow is not installed: Arrow IPC skipped", flush=True)
    else:
        rows_per_batch = 1024

        def arrow_write(d: str) -> None:
            schema = pa.schema([("data", pa.binary())])
            with (
                pa.OSFile(f"{d}/data.arrow", "wb") as sink,
                pa.ipc.new_file(sink, schema) as writer,
            ):
                for s in range(0, count, rows_per_batch):
                    column = pa.array(records[s : s + rows_per_batch], pa.binary())
                    writer.write_batch(pa.record_batch([column], schema=schema))

        def arrow_open(d: str) -> Any:
            reader = pa.ipc.open_file(pa.memory_map(f"{d}/data.arrow", "r"))
            return [reader.get_batch(k).column(0) for k in range(reader.num_record_batches)]

        def arrow_read(columns: Any) -> int:
            return sum(
                zlib.crc32(columns[i // rows_per_batch][i % rows_per_batch].as_buffer())
                for i in order
            )

        candidates.append(
            (f"Arrow IPC file, pyarrow {pa.__version__}", arrow_write, arrow_open, arrow_read, None)
        )
    try:
        import lmdb
    except ImportError:
        print("lmdb is not installed: LMDB skipped", flush=True)
    else:

        def lmdb_write(d: str) -> None:
            env = lmdb.open(d, map_size=4 * len(blob) + (64 << 20))
            with env.begin(write=True) as txn:
                for i, record in enumerate(records):
                    txn.put(i.to_bytes(8, "big"), record)
            env.close()

        def lmdb_open(d: str) -> Any:
            return lmdb.open(d, readonly=True, lock=False, readahead=False)

        def lmdb_read(env: Any) -> int:
            with env.begin(buffers=True) as txn:
                return sum(zlib.crc32(txn.get(i.to_bytes(8, "big"))) for i in order)

        candidates.append(
            (
                f"LMDB, lmdb {lmdb.__version__}",
                lmdb_write,
                lmdb_open,
                lmdb_read,
                lambda env: env.close(),
            )
        )
    try:
        for name, write, open_, read, close in candidates:
            d = tempfile.mkdtemp(dir=root)
            write(d)
            files = [os.path.join(d, f) for f in os.listdir(d)]
            size = sum(os.path.getsize(f) for f in files)
            state = open_(d)
            read(state)
            warm_s = min(_timed(lambda state=state, read=read: read(state)) for _ in range(repeats))
            if close is not None:
                close(state)
            del state
            gc.collect()
            evict(files, method)
            t0 = time.perf_counter()
            state = open_(d)
            open_s = time.perf_counter() - t0
            cold_s = _timed(lambda state=state, read=read: read(state))
            if close is not None:
                close(state)
            del state
            rows.append(
                {
                    "container": name,
                    "overhead": size / len(blob) - 1,
                    "open_cold_ms": open_s * 1e3,
                    "warm_us": warm_s / count * 1e6,
                    "cold_us": cold_s / count * 1e6,
                }
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    crc_us = _timed(lambda: [zlib.crc32(r) for r in records]) / count * 1e6
    print(
        f"{count} records of 3-9 KB ({len(blob) / 1e6:.0f} MB), random order, crc32 over each "
        f"record read (crc32 alone: {crc_us:.2f} us per record); cold cache by {method}"
    )
    print("| container | size overhead | open (cold) | random read, warm | random read, cold |")
    print("|---|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['container']} | {100 * row['overhead']:.2f}% | {row['open_cold_ms']:.1f} ms | "
            f"{row['warm_us']:.1f} us | {row['cold_us']:.1f} us |"
        )
    return rows


def _timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# ------------------------------------------------------------------ the cost of verification

VERIFY_MODES: tuple[bool | str, ...] = (False, "read", "open")


def compare_verify(packed_dir: str, args: argparse.Namespace) -> dict[str, Any]:
    """Per verify mode, per round: open time, epoch rate of the JPEG workload, bare fetch time."""
    files = [os.path.join(packed_dir, name) for name in os.listdir(packed_dir)]
    results: dict[str, dict[str, list[float]]] = {
        str(mode): {"open_ms": [], "epoch_batches_s": [], "fetch_us": []} for mode in VERIFY_MODES
    }
    for r in range(args.rounds):
        order = VERIFY_MODES[r % 3 :] + VERIFY_MODES[: r % 3]
        for mode in order:
            warm(files)
            if args.wait_idle:
                wait_for_idle(args.wait_idle)
            start = time.perf_counter()
            ds = PackedDataset(packed_dir, verify=mode)
            results[str(mode)]["open_ms"].append((time.perf_counter() - start) * 1e3)
            sampler = stoker.BlockShuffleSampler(
                ds, block_size=args.block_size, window=args.window, generator=r
            )
            order_of_reads = list(sampler)
            start = time.perf_counter()
            for s in range(0, len(order_of_reads), args.batch_size):
                ds.__getitems__(order_of_reads[s : s + args.batch_size])
            results[str(mode)]["fetch_us"].append((time.perf_counter() - start) / len(ds) * 1e6)
            jpegs = PackedJpegDataset(packed_dir, crop=args.crop, verify=mode)
            sampler = stoker.BlockShuffleSampler(
                jpegs, block_size=args.block_size, window=args.window, generator=r
            )
            rate = time_epoch(jpegs, sampler, args.batch_size, args.workers)
            results[str(mode)]["epoch_batches_s"].append(rate)
            print(
                f"round {r + 1}/{args.rounds} verify={mode!r:7}: open "
                f"{results[str(mode)]['open_ms'][-1]:8.1f} ms, fetch "
                f"{results[str(mode)]['fetch_us'][-1]:6.2f} us/record, epoch {rate:6.1f} "
                "batches/s",
                flush=True,
            )
    base = results["False"]
    print()
    print(
        f"PackedDataset(verify=...), {len(PackedDataset(packed_dir))} records; median of "
        f"{args.rounds} rounds, ratio to verify=False with the per-round range in brackets"
    )
    print(
        "| verify | open (ms) | ratio | bare fetch (us/record) | ratio | JPEG epoch (batches/s) "
        "| epoch time ratio |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    summary: dict[str, Any] = {"rounds": results}
    for mode in VERIFY_MODES:
        row = results[str(mode)]
        cells = []
        for key, higher_is_faster in (
            ("open_ms", False),
            ("fetch_us", False),
            ("epoch_batches_s", True),
        ):
            per_round = [
                (b / v if higher_is_faster else v / b)
                for v, b in zip(row[key], base[key], strict=True)
            ]
            median = statistics.median(row[key])
            ratio = (
                (statistics.median(base[key]) / median)
                if higher_is_faster
                else median / statistics.median(base[key])
            )
            cells.append(f"{median:.2f} | {ratio:.2f}x [{min(per_round):.2f}-{max(per_round):.2f}]")
            summary.setdefault(str(mode), {})[key] = {
                "median": median,
                "ratio": ratio,
                "per_round": per_round,
            }
        print(f"| {mode!r} | " + " | ".join(cells) + " |")
    return summary


# ------------------------------------------------------------------ packed against loose


def _verify_run(
    args: argparse.Namespace, paths: list[str], folders: list[Any], packed_dir: str, shards: int
) -> int:
    """``--verify``: :func:`compare_verify` on the packed JPEGs, then the files are removed."""
    try:
        summary = compare_verify(packed_dir, args)
    finally:
        for folder in folders:
            folder.remove()
        shutil.rmtree(packed_dir, ignore_errors=True)
    summary["setup"] = {
        "count": len(paths),
        "sizes": [int(s) for s in args.sizes.split(",")],
        "shards": shards,
        "git": _git_commit(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "cpus": os.cpu_count(),
    }
    print(
        f"git {_git_commit()}; {len(paths)} JPEGs in {shards} shards; load average "
        f"{os.getloadavg()[0]:.2f}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=12000, help="JPEG files (default 12000)")
    parser.add_argument(
        "--sizes", default="64,96,128", help="image sides, used in turn (default 64,96,128)"
    )
    parser.add_argument("--crop", type=int, default=56, help="random crop side (default 56)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--block-size", type=int, default=256, help="BlockShuffleSampler block (default 256)"
    )
    parser.add_argument(
        "--window", type=int, default=4, help="BlockShuffleSampler window (default 4)"
    )
    parser.add_argument(
        "--shard-mb", type=int, default=8, help="shard size limit in MiB (default 8)"
    )
    parser.add_argument("--evict", choices=("auto", "drop_caches", "fadvise"), default="auto")
    parser.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        metavar="S",
        help="before each epoch, wait up to S seconds for other processes to leave the CPUs idle",
    )
    parser.add_argument(
        "--containers",
        type=int,
        nargs="?",
        const=20000,
        metavar="N",
        help="instead: compare candidate containers on N records (default 20000; needs pyarrow, "
        "lmdb)",
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="instead: the cost of each PackedDataset(verify=...) mode on the packed JPEGs",
    )
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    method = choose_eviction(args.evict)
    if args.containers:
        rows = compare_containers(args.containers, method)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
        return 0

    t0 = time.perf_counter()
    paths, folders = write_images(args.count, sizes)
    packed_dir = tempfile.mkdtemp(prefix="stoker-bench-packed-")
    shutil.rmtree(packed_dir)
    pack(paths, packed_dir, args.shard_mb << 20)
    shards = list(PackedDataset(packed_dir).shard_paths)
    packed_files = [os.path.join(packed_dir, name) for name in os.listdir(packed_dir)]
    if args.verify:
        return _verify_run(args, paths, folders, packed_dir, len(shards))
    loose_bytes = sum(os.path.getsize(p) for p in paths)
    packed_bytes = sum(os.path.getsize(p) for p in packed_files)
    print(
        f"{len(paths)} JPEGs ({'/'.join(map(str, sizes))} px, "
        f"{loose_bytes / len(paths) / 1e3:.1f} KB mean, {loose_bytes / 1e6:.1f} MB) written and "
        f"packed into {len(shards)} shards ({packed_bytes / 1e6:.1f} MB) in "
        f"{time.perf_counter() - t0:.1f} s; cold cache by {method}",
        flush=True,
    )

    results: dict[str, dict[str, list[float]]] = {
        m: {"loose": [], "packed": []} for m in ("warm", "cold")
    }
    residency: dict[str, list[float]] = {"loose": [], "packed": []}
    n_batches = len(paths) // args.batch_size + (len(paths) % args.batch_size > 0)
    waited_s = 0.0
    load_before = os.getloadavg()[0]
    try:
        for r in range(args.rounds):
            sides = ("loose", "packed") if r % 2 == 0 else ("packed", "loose")
            for cache in ("warm", "cold"):
                for side in sides:
                    files = paths if side == "loose" else packed_files
                    waited_s += wait_for_idle(args.wait_idle) if args.wait_idle else 0.0
                    if side == "loose":
                        dataset: Any = JpegDataset(paths, len(paths), crop=args.crop)
                        sampler: Any = stoker.RandomSampler(dataset, generator=r)
                    else:
                        dataset = PackedJpegDataset(packed_dir, crop=args.crop)
                        sampler = stoker.BlockShuffleSampler(
                            dataset, block_size=args.block_size, window=args.window, generator=r
                        )
                    if cache == "warm":
                        warm(files)
                    else:
                        evict(files, method)
                        fraction = resident_fraction(files if side == "packed" else files[::20])
                        if fraction is not None:
                            residency[side].append(fraction)
                    rate = time_epoch(dataset, sampler, args.batch_size, args.workers)
                    results[cache][side].append(rate)
                    print(
                        f"round {r + 1}/{args.rounds} {cache:4s} {side:6s}: {rate:7.1f} batches/s",
                        flush=True,
                    )
    finally:
        for folder in folders:
            folder.remove()
        shutil.rmtree(packed_dir, ignore_errors=True)

    print()
    print(
        f"stoker.DataLoader(batch_size={args.batch_size}, num_workers={args.workers}); "
        f"{n_batches} batches per epoch; median of {args.rounds} rounds, per-round ratio range "
        "in brackets"
    )
    print(
        "| page cache | loose + RandomSampler | packed + BlockShuffleSampler | packed / loose | "
        "target |"
    )
    print("|---|---:|---:|---:|---|")
    summary: dict[str, Any] = {}
    for cache in ("warm", "cold"):
        loose, packed = results[cache]["loose"], results[cache]["packed"]
        ratio = statistics.median(packed) / statistics.median(loose)
        per_round = [p / q for p, q in zip(packed, loose, strict=True)]
        verdict = "met" if ratio >= 1.3 else f"MISSED ({100 * (1.3 - ratio) / 1.3:.0f}% below 1.3x)"
        print(
            f"| {cache} | {statistics.median(loose):.1f} batches/s | "
            f"{statistics.median(packed):.1f} batches/s | {ratio:.2f}x "
            f"[{min(per_round):.2f}-{max(per_round):.2f}] | >= 1.30x: {verdict} |"
        )
        summary[cache] = {
            "loose": loose,
            "packed": packed,
            "ratio": ratio,
            "per_round": per_round,
        }
    for side, values in residency.items():
        if values:
            share = 100 * max(values)
            print(
                f"after eviction, resident in page cache ({side}): max {share:.1f}% of the bytes "
                "(fincore)"
            )
    summary["setup"] = {
        "count": len(paths),
        "sizes": sizes,
        "crop": args.crop,
        "batch_size": args.batch_size,
        "workers": args.workers,
        "block_size": args.block_size,
        "window": args.window,
        "shards": len(shards),
        "shard_mb": args.shard_mb,
        "eviction": method,
        "loose_bytes": loose_bytes,
        "packed_bytes": packed_bytes,
        "residency": residency,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "cpus": os.cpu_count(),
        "start_method": __import__("multiprocessing").get_start_method(),
        "git": _git_commit(),
        "load_average_at_start": load_before,
        "waited_for_idle_s": waited_s,
    }
    print(
        f"git {_git_commit()}; load average {load_before:.2f} at start; waited {waited_s:.0f} s "
        "for idle CPUs"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
