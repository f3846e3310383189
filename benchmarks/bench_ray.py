"""Ray actors against stoker's own process workers, side by side, on this machine.

The same datasets as ``bench_engine.py`` (``bench_workloads.py``), the same number of
workers, alternating rounds (process, Ray, Ray, process, ...) so that both meet the same
machine; each figure is the median of the rounds. Both loaders keep their workers between
rounds (``persistent_workers=True``) and run one untimed round first, so a round times
loading, not starting. Measured:

* **throughput** (batches/s) and the ratio Ray / process: the price of the engine;
* the **CPU-cost ratio**: CPU seconds per batch of the process engine over those of Ray,
  counting every process involved (trainer, workers or actors, Ray's daemons). On a
  machine whose CPUs are the limit it is the throughput ratio without the noise of other
  processes and of the host (wall-clock rounds on a shared 2-core machine swing by 2x);
* **time to first batch** of a fresh loader (workers started from nothing; Ray itself is
  already running, as it is on a cluster);
* **per-batch costs** the scale-out model of ``docs/ray.md`` is built from: the trainer's
  CPU time per batch (what one trainer spends to receive batches, which caps what it can
  take in however many machines load for it) and the transfer time per batch
  (``loader.stats()``).

Ray runs as a local instance with as many CPUs as the machine, every address on
127.0.0.1; each actor reserves 1 CPU.

Usage::

    .venv/bin/python benchmarks/bench_ray.py                 # cpu, jpeg, tiny, large
    .venv/bin/python benchmarks/bench_ray.py --rounds 3 --workloads cpu,jpeg
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_engine  # found through the sys.path entry just above

import stoker

WORKERS = 2


def start_ray() -> Any:
    """A local Ray on loopback whose actors import this stoker and the benchmark datasets."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # loopback, before ray is imported
    src = str(Path(stoker.__file__).resolve().parent.parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [src, str(HERE), os.environ.get("PYTHONPATH")])
    )
    import ray

    ray.init(
        num_cpus=os.cpu_count(),
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        logging_level="WARNING",
        log_to_driver=False,
    )
    return ray


def make(engine: str, dataset: Any, batch_size: int, *, persistent: bool = True) -> Any:
    mode: Any = stoker.RayWorkers(num_cpus=1) if engine == "ray" else "process"
    return stoker.DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=True,
        generator=0,
        num_workers=WORKERS,
        worker_mode=mode,
        persistent_workers=persistent,
    )


def time_round(loader: Any, warmup: int, timed: int) -> tuple[float, float, float]:
    """(batches/s, trainer CPU ms per batch, all CPU ms per batch) over ``timed`` batches.

    "All CPU" is this process and every process below it: the workers, or the actors and
    every daemon of the local Ray (they are this process's children too).
    """
    it = iter(loader)
    for _ in range(warmup):
        next(it)
    children = bench_engine._children_cpu_s()
    cpu, began = time.process_time(), time.perf_counter()
    for _ in range(timed):
        next(it)
    wall = time.perf_counter() - began
    cpu = time.process_time() - cpu
    children = (bench_engine._children_cpu_s() or 0.0) - (children or 0.0)
    del it
    return timed / wall, 1000 * cpu / timed, 1000 * (cpu + children) / timed


def first_batch_s(engine: str, dataset: Any, batch_size: int) -> float:
    """Seconds from building a loader to holding its first batch (workers started fresh)."""
    began = time.perf_counter()
    loader = make(engine, dataset, batch_size, persistent=False)
    it = iter(loader)
    next(it)
    seconds = time.perf_counter() - began
    del it
    loader.close()
    return seconds


def run(workload: Any, rounds: int, quick: bool) -> dict[str, Any]:
    timed = workload.quick_timed if quick else 2 * workload.timed
    dataset = workload.make((workload.warmup + timed) * workload.batch_size)
    loaders = {e: make(e, dataset, workload.batch_size) for e in ("process", "ray")}
    rates: dict[str, list[float]] = {"process": [], "ray": []}
    cpu: dict[str, list[float]] = {"process": [], "ray": []}
    total: dict[str, list[float]] = {"process": [], "ray": []}
    try:
        for engine in loaders:  # start the workers and warm them up: an untimed round each
            time_round(loaders[engine], workload.warmup, timed)
        for r in range(rounds):
            order = ("process", "ray") if r % 2 == 0 else ("ray", "process")
            for engine in order:
                bench_engine.wait_for_idle(2.0)
                rate, cpu_ms, total_ms = time_round(loaders[engine], workload.warmup, timed)
                rates[engine].append(rate)
                cpu[engine].append(cpu_ms)
                total[engine].append(total_ms)
                print(f"  {workload.name} round {r} {engine}: {rate:,.1f} batches/s", flush=True)
        stats = {e: loaders[e].stats() for e in loaders}
    finally:
        for loader in loaders.values():
            loader.close()
    ttfb: dict[str, list[float]] = {"process": [], "ray": []}
    for r in range(3):
        for engine in ("process", "ray") if r % 2 == 0 else ("ray", "process"):
            ttfb[engine].append(first_batch_s(engine, dataset, workload.batch_size))
    ratios = [ray / proc for ray, proc in zip(rates["ray"], rates["process"], strict=True)]
    cpu_ratios = [p / r for r, p in zip(total["ray"], total["process"], strict=True)]
    nodes = stats["ray"].nodes
    return {
        "workload": workload.name,
        "description": workload.description,
        "batches_per_round": timed,
        "rates": rates,
        "median": {e: statistics.median(v) for e, v in rates.items()},
        "ratio_per_round": ratios,
        "ratio": statistics.median(ratios),
        "trainer_cpu_ms_per_batch": {e: statistics.median(v) for e, v in cpu.items()},
        "all_cpu_ms_per_batch": {e: statistics.median(v) for e, v in total.items()},
        "cpu_ratio_per_round": cpu_ratios,
        "cpu_ratio": statistics.median(cpu_ratios),
        "transport_ms_per_batch": {e: s.per_batch_ms("transport") for e, s in stats.items()},
        "actor_busy_ms_per_batch": statistics.mean(n.busy_ms_per_batch for n in nodes.values()),
        "batch_mib": statistics.mean(
            n.bytes / n.batches / 2**20 for n in nodes.values() if n.batches
        ),
        "first_batch_s": {e: statistics.median(v) for e, v in ttfb.items()},
    }


def render(results: list[dict[str, Any]], command: str) -> str:
    lines = [
        f"`{command}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{os.cpu_count()} CPUs, {WORKERS} workers each, Ray {_ray_version()})",
        "",
        "| workload | process batches/s | Ray batches/s | Ray / process (per round) | median |"
        " CPU-cost ratio | first batch: process | first batch: Ray |",
        "|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in results:
        per_round = ", ".join(f"{x:.2f}" for x in r["ratio_per_round"])
        lines.append(
            f"| {r['workload']} | {r['median']['process']:,.1f} | {r['median']['ray']:,.1f} | "
            f"{per_round} | **{r['ratio']:.2f}x** | {r['cpu_ratio']:.2f}x | "
            f"{r['first_batch_s']['process']:.2f} s | "
            f"{r['first_batch_s']['ray']:.2f} s |"
        )
    lines += [
        "",
        "| workload | batch MiB | actor busy ms/batch | all CPU ms/batch: process | Ray |"
        " trainer CPU ms/batch: process | Ray | transport ms/batch: process | Ray |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        cpu, transport = r["trainer_cpu_ms_per_batch"], r["transport_ms_per_batch"]
        total = r["all_cpu_ms_per_batch"]
        lines.append(
            f"| {r['workload']} | {r['batch_mib']:.2f} | {r['actor_busy_ms_per_batch']:.1f} | "
            f"{total['process']:.2f} | {total['ray']:.2f} | "
            f"{cpu['process']:.2f} | {cpu['ray']:.2f} | {transport['process']:.3f} | "
            f"{transport['ray']:.3f} |"
        )
    return "\n".join(lines)


def _ray_version() -> str:
    import ray

    return ray.__version__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="cpu,jpeg,tiny,large")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="fewer batches per round")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    ray = start_ray()
    try:
        results = []
        for name in args.workloads.split(","):
            results.append(run(bench_engine.WORKLOADS[name], args.rounds, args.quick))
    finally:
        ray.shutdown()
    command = "benchmarks/bench_ray.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(render(results, command.strip()))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
