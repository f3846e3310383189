"""num_workers="auto" against the best fixed setting a sweep finds, on the engine workloads.

For each workload the script times, in alternating rounds, stoker loaders with fixed
num_workers (1, 2, ... up to the cores) and prefetch_factor 2, and one with
num_workers="auto", prefetch_factor="auto". Each loader is persistent: the first two epochs
(start-up, and for "auto" its tuning) are excluded, the third is timed. It reports the
median batches/s of each, the ratio auto / best fixed (target >= 0.95), what the tuner
decided, and the largest memory the tuner committed against its budget.

    .venv/bin/python benchmarks/bench_autotune.py [--rounds 3] [--workloads tiny,large,cpu]
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench_workloads import CpuTransformDataset, LargeArrayDataset, TinyDataset

import stoker
from stoker._proc import usable_cpus

WORKLOADS = {
    "tiny": (lambda: TinyDataset(256 * 600), 256),
    "large": (lambda: LargeArrayDataset(32 * 60), 32),
    "cpu": (lambda: CpuTransformDataset(32 * 16), 32),
}


def epoch_rate(loader: stoker.DataLoader) -> float:
    for _epoch in range(2):  # workers start, the tuner tunes: not timed
        for _ in loader:
            pass
    start = time.perf_counter()
    n = sum(1 for _ in loader)
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workloads", default="tiny,large,cpu")
    args = parser.parse_args()
    settings: list[int | str] = [*range(1, usable_cpus() + 1), "auto"]
    print(f"cores: {usable_cpus()}; settings: {settings}\n")
    print(
        "| workload | "
        + " | ".join(f"workers={s}" for s in settings)
        + " | auto / best fixed | tuner decisions |"
    )
    print("|---|" + "---:|" * len(settings) + "---:|---|")
    for name in args.workloads.split(","):
        make, batch_size = WORKLOADS[name]
        dataset = make()
        rates: dict[int | str, list[float]] = {s: [] for s in settings}
        decisions: list[str] = []
        for _ in range(args.rounds):
            for setting in settings:
                auto = setting == "auto"
                loader = stoker.DataLoader(
                    dataset,
                    batch_size=batch_size,
                    num_workers=setting,
                    prefetch_factor="auto" if auto else None,
                    persistent_workers=True,
                )
                rates[setting].append(epoch_rate(loader))
                if auto:
                    decisions = loader.stats().autotune
                    committed = (loader._pool.batch_bytes or 0) * (
                        loader.num_workers * loader.prefetch_factor + 2
                    )
                    if committed > loader.memory_budget:
                        raise AssertionError(
                            f"autotune committed {committed} bytes over {loader.memory_budget}"
                        )
                loader.close()
        medians = {s: statistics.median(r) for s, r in rates.items()}
        best = max(v for s, v in medians.items() if s != "auto")
        cells = " | ".join(f"{medians[s]:,.1f}" for s in settings)
        print(
            f"| {name} | {cells} | {medians['auto'] / best:.2f} | "
            f"{'; '.join(decisions) or 'none'} |"
        )


if __name__ == "__main__":
    main()
