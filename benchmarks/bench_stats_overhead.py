"""The cost of always-on loader statistics, on the tiny-sample workload.

Runs the same loader with stoker's statistics recorder and with a recorder whose methods
do nothing, in alternating rounds, and reports the median throughput ratio (target: the
statistics cost under 2%).

    .venv/bin/python benchmarks/bench_stats_overhead.py [--rounds 9] [--batches 3000]
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench_workloads import TinyDataset

import stoker
from stoker.profiling.stats import StatsRecorder


class NullRecorder(StatsRecorder):
    """Records nothing: the loader without statistics."""

    def delivered(self, waited_s: float) -> None:
        pass

    def loaded(self, *args: object, **kwargs: object) -> None:
        pass


def rate(loader: stoker.DataLoader, batches: int) -> float:
    it = iter(loader)
    for _ in range(20):  # warm-up, worker start
        next(it)
    start = time.perf_counter()
    for _ in range(batches):
        next(it)
    elapsed = time.perf_counter() - start
    del it
    return batches / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--batches", type=int, default=3000)
    args = parser.parse_args()
    dataset = TinyDataset(256 * (args.batches + 40))
    print("| num_workers | with stats (batches/s) | without | cost of stats |")
    print("|---:|---:|---:|---:|")
    for workers in (0, 2):
        on, off = [], []
        for _ in range(args.rounds):
            for recorder, sink in ((None, on), (NullRecorder(workers), off)):
                loader = stoker.DataLoader(dataset, batch_size=256, num_workers=workers)
                if recorder is not None:
                    loader._stats = recorder
                sink.append(rate(loader, args.batches))
                loader.close()
        ratios = [a / b for a, b in zip(on, off, strict=True)]
        cost = 1 - statistics.median(ratios)
        print(
            f"| {workers} | {statistics.median(on):,.0f} | {statistics.median(off):,.0f} | "
            f"{100 * cost:+.1f}% |"
        )


if __name__ == "__main__":
    main()
