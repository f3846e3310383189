"""Per-batch costs of each engine path, measured here, and what they predict for 8-64 workers.

Run from the repository root::

    .venv/bin/python benchmarks/bench_scaling.py                  # ~2 minutes
    .venv/bin/python benchmarks/bench_scaling.py --quick          # smoke run
    .venv/bin/python benchmarks/bench_scaling.py --json out.json

A 2-core machine cannot run 64 workers, but it can measure what each batch costs and
where: the trainer's CPU per batch (sampling, dispatch, receiving, handing out), the
workers' CPU per batch, how much of a thread worker's time holds the GIL, and what a
worker costs to start. From those, for N workers on N free cores:

- process workers: batches/s = min(N / worker CPU per batch, 1 / trainer CPU per batch);
  the trainer is the limit from N* = worker CPU / trainer CPU workers on.
- thread workers: batches/s = min(N / worker CPU per batch,
  1 / (trainer CPU per batch + GIL-held time per batch)): the GIL makes the held part serial.
- time to first batch: the trainer forks worker 0 alone and the others one at a time while
  it waits (the ramp), so the first batch costs one fork and one batch whatever N is (the
  last fork happens N x fork time after the start, when every worker is running); thread
  workers start at once (one batch).

The GIL-held share ``g`` of a thread worker's time is estimated from the rates with one and
two thread workers (Amdahl: rate2 / rate1 = 1 / ((1 - g) / 2 + g)); it is rough on 2 cores,
where the trainer competes for the same CPUs, and reported as such. Memory bandwidth is not
modelled: on the large-array workload every batch is at least one 24 MiB copy, and a host's
bandwidth caps batches/s at (bandwidth / 24 MiB) whatever N is.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_engine import WORKLOADS, _children_cpu_s, wait_for_idle  # found through sys.path

import stoker

WORKERS = (2, 8, 32, 64)
PATHS = ("process", "thread")


@dataclass(slots=True)
class PathCost:
    """One engine path on one workload: medians over the rounds."""

    rate: float  # batches/s with 2 workers
    trainer_ms: float  # trainer CPU per batch
    worker_ms: float  # all workers' CPU per batch


@dataclass(slots=True)
class WorkloadCosts:
    name: str
    paths: dict[str, PathCost]
    rate_one_thread: float  # batches/s with 1 thread worker
    gil_share: float  # estimated share of a thread worker's time that holds the GIL


def measure_epoch(
    loader: Any, warmup: int, timed: int, threads: bool
) -> tuple[float, float, float]:
    """(batches/s, trainer CPU ms per batch, workers' CPU ms per batch) over the timed batches."""
    iterator = iter(loader)
    for _ in range(warmup):
        next(iterator)
    children0 = _children_cpu_s() or 0.0
    process0, thread0 = time.process_time(), time.thread_time()
    start = time.perf_counter()
    for _ in range(timed):
        next(iterator)
    elapsed = time.perf_counter() - start
    trainer = time.thread_time() - thread0
    process = time.process_time() - process0
    children = (_children_cpu_s() or 0.0) - children0
    for _ in iterator:
        pass
    workers = (process - trainer) if threads else children
    return timed / elapsed, 1e3 * trainer / timed, 1e3 * workers / timed


def measure(name: str, rounds: int, quick: bool, wait_idle_s: float) -> WorkloadCosts:
    workload = WORKLOADS[name]
    timed = workload.quick_timed if quick else workload.timed
    dataset = workload.make((workload.warmup + timed) * workload.batch_size)
    loaders = {
        (mode, workers): stoker.DataLoader(
            dataset,
            batch_size=workload.batch_size,
            num_workers=workers,
            worker_mode=mode,
            persistent_workers=True,
        )
        for mode, workers in (("process", 2), ("thread", 2), ("thread", 1))
    }
    samples: dict[tuple[str, int], list[tuple[float, float, float]]] = {k: [] for k in loaders}
    try:
        for round_ in range(rounds):
            wait_for_idle(wait_idle_s)
            for key, loader in loaders.items():
                samples[key].append(
                    measure_epoch(loader, workload.warmup, timed, threads=key[0] == "thread")
                )
            print(f"  {name} round {round_ + 1}/{rounds}", file=sys.stderr, flush=True)
    finally:
        for loader in loaders.values():
            loader.close()

    def median(key: tuple[str, int], field: int) -> float:
        return statistics.median(s[field] for s in samples[key])

    paths = {
        mode: PathCost(median((mode, 2), 0), median((mode, 2), 1), median((mode, 2), 2))
        for mode in PATHS
    }
    one, two = median(("thread", 1), 0), paths["thread"].rate
    gil = min(1.0, max(0.0, 2 * one / two - 1)) if two > 0 else 1.0
    return WorkloadCosts(name, paths, one, gil)


def fork_ms(repeats: int = 20) -> float:
    """Median time the trainer spends in one fork (this process, as it is now)."""
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        times.append(time.perf_counter() - began)
        os.waitpid(pid, 0)
    return 1e3 * statistics.median(times)


def project(costs: WorkloadCosts, fork: float) -> list[dict[str, Any]]:
    """The model's batches/s, limit and first-batch time for each N in WORKERS."""
    rows = []
    process, thread = costs.paths["process"], costs.paths["thread"]
    per_process_worker = process.worker_ms  # CPU ms one worker spends per batch
    per_thread_worker = thread.worker_ms
    held = costs.gil_share * per_thread_worker
    for n in WORKERS:
        by_workers = 1e3 * n / per_process_worker
        by_trainer = 1e3 / process.trainer_ms
        t_workers = 1e3 * n / per_thread_worker
        t_serial = 1e3 / (thread.trainer_ms + held)
        rows.append(
            {
                "workers": n,
                "process_batches_s": min(by_workers, by_trainer),
                "process_limit": "workers" if by_workers <= by_trainer else "trainer",
                "thread_batches_s": min(t_workers, t_serial),
                "thread_limit": "workers" if t_workers <= t_serial else "GIL + trainer",
                "process_first_batch_ms": fork + per_process_worker,
                "process_all_started_ms": n * fork,
                "thread_first_batch_ms": per_thread_worker,
            }
        )
    return rows


def render(results: list[WorkloadCosts], fork: float, command: str) -> str:
    lines = [f"Command: `{command}`", "", f"Fork of the trainer: {fork:.2f} ms per worker", ""]
    lines += [
        "| workload | path | batches/s (2 workers) | trainer CPU ms/batch | workers CPU ms/batch "
        "| N* (trainer-bound from) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for costs in results:
        for mode in PATHS:
            path = costs.paths[mode]
            n_star = path.worker_ms / path.trainer_ms if path.trainer_ms > 0 else float("inf")
            lines.append(
                f"| {costs.name} | {mode} | {path.rate:,.1f} | {path.trainer_ms:.3f} | "
                f"{path.worker_ms:.3f} | {n_star:,.0f} |"
            )
    lines += ["", "GIL-held share of a thread worker's time (from 1 and 2 thread workers):", ""]
    lines += [f"- {c.name}: {100 * c.gil_share:.0f}%" for c in results]
    lines += [
        "",
        "| workload | N | process batches/s (limit) | thread batches/s (limit) "
        "| first batch, process ms | all processes started ms | first batch, thread ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for costs in results:
        for row in project(costs, fork):
            lines.append(
                f"| {costs.name} | {row['workers']} | {row['process_batches_s']:,.0f} "
                f"({row['process_limit']}) | {row['thread_batches_s']:,.0f} "
                f"({row['thread_limit']}) | {row['process_first_batch_ms']:,.1f} | "
                f"{row['process_all_started_ms']:,.0f} | {row['thread_first_batch_ms']:,.1f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workloads", default="tiny,large,cpu,jpeg")
    parser.add_argument("--quick", action="store_true", help="a smoke run: few batches")
    parser.add_argument("--wait-idle", type=float, default=0.0, metavar="S")
    parser.add_argument("--json", metavar="PATH", help="also write the results here")
    args = parser.parse_args(argv)
    names = [n for n in args.workloads.split(",") if n]
    unknown = sorted(set(names) - set(WORKLOADS))
    if unknown:
        parser.error(f"unknown workloads {unknown}; choose from {sorted(WORKLOADS)}")
    with_torch = "torch" in sys.modules or _import_torch()
    fork = fork_ms()
    results = [measure(n, args.rounds, args.quick, args.wait_idle) for n in names]
    command = "python benchmarks/bench_scaling.py " + " ".join(argv or sys.argv[1:])
    print(render(results, fork, command.strip()))
    print(f"\n(torch imported in the trainer: {with_torch})")
    if args.json:
        payload = {"fork_ms": fork, "workloads": [asdict(c) for c in results]}
        payload["projections"] = {c.name: project(c, fork) for c in results}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=2)
    return 0


def _import_torch() -> bool:
    """A training process has torch loaded, which makes forks slower: measure that case."""
    try:
        import torch  # noqa: F401  (imported for its effect on fork time)
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
