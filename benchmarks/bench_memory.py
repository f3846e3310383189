"""Memory that stays flat: copy-on-read growth, and spawn start-up, side by side with torch.

Part 1 (copy-on-read): a dataset holding one million file paths, as a Python list (torch's
DataLoader, stoker's DataLoader) and as a stoker.compact.StringArray (stoker), 2 forked
workers, 3 epochs over a 100,000-sample random subset. The figure is the total
proportional memory (PSS) of the trainer and its workers, at the first batch and at the
end; the target is stoker+StringArray growth <= 10% of torch's growth on the list.

Part 2 (spawn): a dataset with a 256 MiB array and a million compact paths, started with
multiprocessing_context="spawn" and 1, 2 and 4 workers: time to first batch and total PSS.
Target: both within 20% from 1 to 4 workers.

    .venv/bin/python benchmarks/bench_memory.py [--part 1,2]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import stoker
from stoker._proc import descendants, process_memory
from stoker.compact import StringArray

N_PATHS = 1_000_000
SAMPLE = 100_000


def make_paths() -> list[str]:
    return [f"/datasets/train/n{(i * 7919) % 1000:08d}/image_{i:08d}.JPEG" for i in range(N_PATHS)]


class PathDataset:
    """What a real dataset does with its paths: reads one per sample (no file opened)."""

    def __init__(self, paths) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        return len(self.paths[i])


class BigSpawnDataset:
    def __init__(self) -> None:
        self.pixels = np.ones((256, 2**20), dtype=np.uint8)  # 256 MiB
        self.paths = StringArray(make_paths())

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        return int(self.pixels[i % 256, 0]) + len(self.paths[i])


def total_pss(pid: int) -> int:
    """PSS of ``pid`` and all its descendants."""
    total = 0
    for p in (pid, *descendants(pid, helpers=True)):
        memory = process_memory(p)
        if memory is not None:
            total += memory.pss
    return total


def part1() -> None:
    import torch.utils.data

    rng = np.random.default_rng(0)
    subset = rng.choice(N_PATHS, SAMPLE, replace=False).tolist()
    print("| loader | paths as | PSS at first batch (MiB) | PSS at end (MiB) | growth (MiB) |")
    print("|---|---|---:|---:|---:|")
    growth = {}
    for name, make_loader, holder in [
        (
            "torch.utils.data",
            lambda ds: torch.utils.data.DataLoader(
                ds, batch_size=256, num_workers=2, sampler=subset, persistent_workers=True
            ),
            list,
        ),
        (
            "stoker",
            lambda ds: stoker.DataLoader(
                ds, batch_size=256, num_workers=2, sampler=subset, persistent_workers=True
            ),
            list,
        ),
        (
            "stoker",
            lambda ds: stoker.DataLoader(
                ds, batch_size=256, num_workers=2, sampler=subset, persistent_workers=True
            ),
            StringArray,
        ),
        (
            "stoker, compact_dataset=True",
            lambda ds: stoker.DataLoader(
                ds,
                batch_size=256,
                num_workers=2,
                sampler=subset,
                persistent_workers=True,
                compact_dataset=True,
            ),
            list,
        ),
    ]:
        dataset = PathDataset(holder(make_paths()))
        loader = make_loader(dataset)
        start = None
        for epoch in range(3):
            for k, _batch in enumerate(loader):
                if epoch == 0 and k == 0:
                    start = total_pss(os.getpid())
        end = total_pss(os.getpid())
        label = "list" if holder is list else "StringArray"
        growth[(name, label)] = end - start
        print(
            f"| {name} | {label} | {start / 2**20:,.0f} | {end / 2**20:,.0f} | "
            f"{(end - start) / 2**20:+,.0f} |"
        )
        del loader, dataset
    ratio = growth[("stoker", "StringArray")] / max(1, growth[("torch.utils.data", "list")])
    print(f"\nstoker+StringArray growth / torch+list growth = {100 * ratio:.1f}% (target <= 10%)")


def part2() -> None:
    dataset = BigSpawnDataset()
    print("| spawn workers | time to first batch (s) | total PSS (MiB) |")
    print("|---:|---:|---:|")
    rows = []
    for workers in (1, 2, 4):
        loader = stoker.DataLoader(
            dataset,
            batch_size=64,
            num_workers=workers,
            multiprocessing_context="spawn",
            persistent_workers=True,
        )
        began = time.perf_counter()
        it = iter(loader)
        next(it)
        ttfb = time.perf_counter() - began
        for _ in range(20):
            next(it)
        pss = total_pss(os.getpid())
        rows.append((ttfb, pss))
        print(f"| {workers} | {ttfb:.2f} | {pss / 2**20:,.0f} |")
        del it
        loader.close()
    print(
        f"\n4 workers / 1 worker: time to first batch {rows[2][0] / rows[0][0]:.2f}x, "
        f"total PSS {rows[2][1] / rows[0][1]:.2f}x (targets: within 1.20x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", default="1,2")
    args = parser.parse_args()
    if "1" in args.part.split(","):
        part1()
    if "2" in args.part.split(","):
        print()
        part2()


if __name__ == "__main__":
    main()
