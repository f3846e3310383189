"""stoker.DataLoader against torch.utils.data.DataLoader, side by side, in one run.

Run from the repository root::

    .venv/bin/python benchmarks/bench_engine.py                    # full run, ~2.5 minutes
    .venv/bin/python benchmarks/bench_engine.py --wait-idle 60     # on a shared machine
    .venv/bin/python benchmarks/bench_engine.py --quick            # smoke run, ~30 s
    .venv/bin/python benchmarks/bench_engine.py --workloads tiny,large --rounds 7 --json out.json
    .venv/bin/python benchmarks/bench_engine.py --workloads jpeg --profile stoker2

Method
------
Every workload builds ONE dataset object (see ``bench_workloads.py``) and hands it to
four loaders, otherwise at their default settings (torch: ``pin_memory=False``):

- ``torch0``: ``torch.utils.data.DataLoader(ds, batch_size)``
- ``torch2``: the same with ``num_workers=2, persistent_workers=True``
- ``stoker0``: ``stoker.DataLoader(ds, batch_size)``
- ``stoker2``: the same with ``num_workers=2, persistent_workers=True``

Throughput: the dataset holds exactly ``warmup + timed`` batches. A round runs one epoch
of each loader in turn (torch0, torch2, stoker0, stoker2, then again); in each epoch the
clock starts once the first ``warmup`` batches have arrived and stops when the last one
arrives, so worker start-up (first round) and the pipeline filling up (every round) are
excluded and ``timed`` batches are timed. The loop body drops each batch and does nothing else. The
figure per loader is the median batches/s over the rounds; ratios are ratios of those
medians (the per-round range of the ratio is shown beside it).

Time to first batch: each round builds a fresh, non-persistent loader per library and
times ``next(iter(loader))`` (worker start-up included, construction excluded, as
torch starts its workers in ``iter()``); the figure is the median over rounds. The
construction time is shown beside it, so a loader that moved start-up work into its
constructor would not look faster than it is.

"Ideal" for the CPU-bound workloads is twice the single-process rate; to be conservative
the single-process rate is max(torch0, stoker0).

Also reported, to show where time goes: the main process's CPU time per timed batch and
the workers' CPU time per timed batch (from /proc; Linux only). A main process busy
close to 100% of the wall time is the bottleneck. "other processes" is how many CPUs
the rest of the machine kept busy during the timed batches (median and worst epoch):
anything well above 0 means the figures of that workload are disturbed.
"""

from __future__ import annotations

import argparse
import atexit
import cProfile
import datetime
import gc
import io
import json
import os
import platform
import pstats
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_workloads  # found through the sys.path entry just above

from stoker._proc import descendants, process_cpu_s
from stoker._proc import machine_busy_s as _machine_busy_s

LOADERS = ("torch0", "torch2", "stoker0", "stoker2")
TTFB_WORKLOADS = ("tiny", "large", "jpeg")


# ----------------------------------------------------------------------------- workloads


@dataclass(frozen=True, slots=True)
class Workload:
    """One benchmark: how to build its dataset and how many batches to run."""

    name: str
    description: str
    batch_size: int
    warmup: int
    timed: int
    quick_timed: int
    make: Callable[[int], Any]  # number of samples -> dataset


_JPEG_FOLDER: dict[str, Any] = {}  # written once per run, removed at exit
_JPEG_FILES = 512


def _jpeg_dataset(length: int) -> Any:
    folder = _JPEG_FOLDER.get("folder")
    if folder is None:
        folder = _JPEG_FOLDER["folder"] = bench_workloads.write_jpeg_folder(_JPEG_FILES)
        atexit.register(folder.remove)
    return bench_workloads.JpegDataset(folder.paths, length)


WORKLOADS = {
    w.name: w
    for w in (
        Workload(
            "tiny",
            "(i, float(i)) Python numbers, batch 256",
            batch_size=256,
            warmup=10,
            timed=1500,
            quick_timed=300,
            make=bench_workloads.TinyDataset,
        ),
        Workload(
            "large",
            "3x256x256 float32 arrays, batch 32 (24 MiB per batch)",
            batch_size=32,
            warmup=6,
            timed=200,
            quick_timed=40,
            make=bench_workloads.LargeArrayDataset,
        ),
        Workload(
            "cpu",
            "~1.6 ms/sample numpy FFT filtering on 3x64x64, batch 32",
            batch_size=32,
            warmup=4,
            timed=30,
            quick_timed=10,
            make=bench_workloads.CpuTransformDataset,
        ),
        Workload(
            "jpeg",
            "JPEG 256x256 decode + crop 224 + flip + normalise, batch 64",
            batch_size=64,
            warmup=3,
            timed=20,
            quick_timed=6,
            make=_jpeg_dataset,
        ),
    )
}


# ----------------------------------------------------------------------------- loaders


def make_loader(name: str, dataset: Any, batch_size: int, *, persistent: bool = True) -> Any:
    """One of :data:`LOADERS`, at the library's default settings apart from the workers."""
    library, workers = name[:-1], int(name[-1])
    extra = {"num_workers": workers, "persistent_workers": persistent} if workers else {}
    if library == "torch":
        import torch.utils.data

        return torch.utils.data.DataLoader(
            dataset, batch_size=batch_size, pin_memory=False, **extra
        )
    import stoker

    return stoker.DataLoader(dataset, batch_size=batch_size, **extra)


def close_loader(loader: Any) -> None:
    """Stops a loader's persistent workers (torch has no public way; this is its own)."""
    if hasattr(loader, "close"):  # stoker
        loader.close()
        return
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None and hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()
    loader._iterator = None


def _children_cpu_s() -> float | None:
    """CPU seconds (user + system) used so far by this process's live children."""
    if process_cpu_s(os.getpid()) is None:  # no /proc
        return None
    children = descendants(os.getpid(), helpers=True)
    return sum(seconds for pid in children if (seconds := process_cpu_s(pid)) is not None)


_IDLE_PROBE_S = 0.5
_IDLE_MAX_CORES = 0.15  # other processes may keep this many CPUs busy and still count as idle


def wait_for_idle(limit_s: float) -> float:
    """Waits (up to ``limit_s``) until the rest of the machine is idle; returns seconds waited.

    Called between rounds, when this benchmark's own workers are idle, so whatever keeps
    the CPUs busy is another process. It lowers the chance that a round is disturbed; the
    "other processes" column shows what still happened during the timed batches.
    """
    start = time.perf_counter()
    while time.perf_counter() - start < limit_s:
        before = _machine_busy_s()
        if before is None:
            break
        time.sleep(_IDLE_PROBE_S)
        after = _machine_busy_s()
        if after is not None and (after - before) / _IDLE_PROBE_S <= _IDLE_MAX_CORES:
            break
    return time.perf_counter() - start


def split_cpu(
    children0: float | None,
    children1: float | None,
    busy0: float | None,
    busy1: float | None,
    main_cpu_s: float,
    elapsed_s: float,
) -> tuple[float | None, float | None]:
    """(workers' CPU seconds, CPUs other processes kept busy) over a timed span.

    From :func:`_children_cpu_s` and :func:`_machine_busy_s` read at both ends of the span
    and the main process's CPU seconds in it; None where /proc could not be read.
    """
    if children0 is None or children1 is None:
        return None, None
    workers = children1 - children0
    if busy0 is None or busy1 is None:
        return workers, None
    return workers, max(0.0, (busy1 - busy0) - main_cpu_s - workers) / elapsed_s


@dataclass(slots=True)
class EpochTiming:
    rate: float  # timed batches per second
    main_cpu_ms: float  # main-process CPU per timed batch
    worker_cpu_ms: float | None  # workers' CPU per timed batch
    foreign_cores: float | None  # CPUs kept busy by other processes during the timed batches


def time_epoch(
    loader: Any, warmup: int, timed: int, profiler: cProfile.Profile | None = None
) -> EpochTiming:
    """Runs one epoch; times batches ``warmup .. warmup + timed - 1`` (see module docstring)."""
    gc.collect()
    iterator = iter(loader)
    for _ in range(warmup):
        next(iterator)
    children0 = _children_cpu_s()
    busy0 = _machine_busy_s()
    cpu0 = time.process_time()
    start = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    for _ in range(timed):
        next(iterator)  # the batch is dropped at once, as a training step would release it
    if profiler is not None:
        profiler.disable()
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    busy1 = _machine_busy_s()
    children1 = _children_cpu_s()
    for _ in iterator:  # the epoch must end exactly here; drain it outside the clock
        msg = f"the epoch of {loader!r} had more than {warmup + timed} batches"
        raise AssertionError(msg)
    workers, foreign = split_cpu(children0, children1, busy0, busy1, cpu, elapsed)
    if workers is not None:
        workers = workers * 1e3 / timed
    return EpochTiming(timed / elapsed, cpu * 1e3 / timed, workers, foreign)


def time_first_batch(name: str, dataset: Any, batch_size: int) -> tuple[float, float]:
    """Times a fresh non-persistent loader's first batch.

    Returns:
        (seconds from ``iter(loader)`` to the first batch, seconds spent building the
        loader). The second is kept apart so that work moved from ``iter()`` into the
        constructor shows in the report.
    """
    gc.collect()
    built = time.perf_counter()
    loader = make_loader(name, dataset, batch_size, persistent=False)
    start = time.perf_counter()
    iterator = iter(loader)
    batch = next(iterator)
    elapsed = time.perf_counter() - start
    del batch
    if hasattr(iterator, "close"):
        iterator.close()
    elif hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()
    del iterator, loader
    return elapsed, start - built


# ----------------------------------------------------------------------------- results


@dataclass(slots=True)
class WorkloadResult:
    name: str
    description: str
    batch_size: int
    warmup: int
    timed: int
    rates: dict[str, list[float]] = field(default_factory=dict)
    main_cpu_ms: dict[str, list[float]] = field(default_factory=dict)
    worker_cpu_ms: dict[str, list[float]] = field(default_factory=dict)
    ttfb_s: dict[str, list[float]] = field(default_factory=dict)
    construct_s: dict[str, list[float]] = field(default_factory=dict)
    foreign_cores: list[float] = field(default_factory=list)
    waited_s: float = 0.0  # spent in wait_for_idle before rounds

    def median(self, loader: str) -> float:
        return statistics.median(self.rates[loader])

    def ratio(
        self, num: str, den: str | tuple[str, ...], factor: float = 1.0
    ) -> tuple[float, float, float]:
        """(ratio of medians, lowest and highest per-round ratio); ``den`` tuple: max of them."""
        dens = (den,) if isinstance(den, str) else den
        overall = self.median(num) / (factor * max(self.median(d) for d in dens))
        rounds = [
            n / (factor * max(self.rates[d][i] for d in dens))
            for i, n in enumerate(self.rates[num])
        ]
        return overall, min(rounds), max(rounds)


def run_workload(
    workload: Workload,
    rounds: int,
    quick: bool,
    ttfb: bool,
    profile: str | None,
    wait_idle_s: float = 0.0,
) -> WorkloadResult:
    timed = workload.quick_timed if quick else workload.timed
    dataset = workload.make((workload.warmup + timed) * workload.batch_size)
    result = WorkloadResult(
        workload.name, workload.description, workload.batch_size, workload.warmup, timed
    )
    loaders = {name: make_loader(name, dataset, workload.batch_size) for name in LOADERS}
    try:
        for round_ in range(rounds):
            result.waited_s += wait_for_idle(wait_idle_s)
            for name in LOADERS:
                timing = time_epoch(loaders[name], workload.warmup, timed)
                result.rates.setdefault(name, []).append(timing.rate)
                result.main_cpu_ms.setdefault(name, []).append(timing.main_cpu_ms)
                if timing.worker_cpu_ms is not None and name.endswith("2"):
                    result.worker_cpu_ms.setdefault(name, []).append(timing.worker_cpu_ms)
                if timing.foreign_cores is not None:
                    result.foreign_cores.append(timing.foreign_cores)
            _progress(
                f"  {workload.name} round {round_ + 1}/{rounds}: "
                + "  ".join(f"{n} {result.rates[n][-1]:8.1f}" for n in LOADERS)
                + " batches/s"
            )
        if profile is not None:
            profiler = cProfile.Profile()
            time_epoch(loaders[profile], workload.warmup, timed, profiler)
            _print_profile(workload.name, profile, profiler)
    finally:
        for loader in loaders.values():
            close_loader(loader)
    if ttfb and workload.name in TTFB_WORKLOADS:
        for _ in range(rounds):
            result.waited_s += wait_for_idle(wait_idle_s)
            for name in LOADERS:
                first, construct = time_first_batch(name, dataset, workload.batch_size)
                result.ttfb_s.setdefault(name, []).append(first)
                result.construct_s.setdefault(name, []).append(construct)
        _progress(f"  {workload.name} time to first batch done")
    return result


def _print_profile(workload: str, loader: str, profiler: cProfile.Profile) -> None:
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(15)
    print(f"\n### cProfile of the main process: {loader} on {workload}")
    print("(timed batches of one epoch, sorted by tottime)")
    print("\n".join(line for line in out.getvalue().splitlines() if line.strip())[:6000])


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- targets


@dataclass(frozen=True, slots=True)
class Target:
    workload: str
    what: str
    required: float
    measured: float
    low: float
    high: float
    higher_is_better: bool = True

    @property
    def met(self) -> bool:
        return (
            self.measured >= self.required
            if self.higher_is_better
            else self.measured <= self.required
        )

    def shortfall(self) -> str:
        if self.met:
            return ""
        if self.higher_is_better:
            return f"{(1 - self.measured / self.required) * 100:.0f}% below"
        return f"{(self.measured / self.required - 1) * 100:.0f}% above"


def targets(results: dict[str, WorkloadResult]) -> list[Target]:
    out: list[Target] = []
    tiny, large, cpu, jpeg = (results.get(k) for k in ("tiny", "large", "cpu", "jpeg"))
    if tiny is not None:
        out.append(
            Target("tiny", "stoker2 / torch2 throughput", 5.0, *tiny.ratio("stoker2", "torch2"))
        )
    if large is not None:
        out.append(
            Target("large", "stoker2 / torch2 throughput", 4.0, *large.ratio("stoker2", "torch2"))
        )
        out.append(
            Target("large", "stoker2 / torch0 throughput", 1.0, *large.ratio("stoker2", "torch0"))
        )
    for res in (cpu, jpeg):
        if res is not None:
            out.append(
                Target(
                    res.name,
                    "stoker2 / (2 x max(torch0, stoker0)), % of ideal",
                    0.9,
                    *res.ratio("stoker2", ("torch0", "stoker0"), factor=2.0),
                )
            )
    for res, limit in ((tiny, 0.5), (large, 0.5), (jpeg, 1.0)):
        if res is not None and res.ttfb_s:
            s, t = res.ttfb_s["stoker2"], res.ttfb_s["torch2"]
            rounds = [a / b for a, b in zip(s, t, strict=True)]
            out.append(
                Target(
                    res.name,
                    "time to first batch, stoker2 / torch2",
                    limit,
                    statistics.median(s) / statistics.median(t),
                    min(rounds),
                    max(rounds),
                    higher_is_better=False,
                )
            )
    return out


# ----------------------------------------------------------------------------- report


def environment() -> dict[str, Any]:
    import PIL
    import torch

    env = base_environment()
    env["pillow"] = PIL.__version__
    env["torch_threads"] = torch.get_num_threads()
    return env


def base_environment() -> dict[str, Any]:
    """What every benchmark report states: date, CPUs, versions, commit, start method."""
    import multiprocessing

    import torch

    import stoker

    model = platform.processor() or "?"
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        model = next(
            line.split(":", 1)[1].strip()
            for line in lscpu.splitlines()
            if line.startswith("Model name")
        )
    except (OSError, StopIteration):
        pass
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch.__version__,
        "stoker": stoker.__version__,
        "git_commit": _git_commit(),
        "start_method": multiprocessing.get_start_method(),
        "load_average": _load_average(),
    }


def _git_commit() -> str | None:
    """HEAD's short hash, with "+dirty" when src/ has uncommitted changes (they are measured)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(
            ["git", "-C", root, "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", root, "status", "--porcelain", "--", "src"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except OSError:
        return None
    return (head + ("+dirty" if dirty else "")) or None


def _load_average() -> str:
    """The 1-minute load average: other processes competing for the cores skew every figure."""
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "?"


def _table(header: list[str], rows: list[list[str]], text_columns: int = 1) -> list[str]:
    """A Markdown table: the first ``text_columns`` left-aligned, the others right-aligned."""
    rule = "|" + "---|" * text_columns + "---:|" * (len(header) - text_columns)
    lines = ["| " + " | ".join(header) + " |", rule]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _ratio_cell(ratio: tuple[float, float, float], percent: bool = False) -> str:
    if percent:
        return f"{ratio[0] * 100:.0f}% [{ratio[1] * 100:.0f}-{ratio[2] * 100:.0f}]"
    return f"{ratio[0]:.2f}x [{ratio[1]:.2f}-{ratio[2]:.2f}]"


def _median_cell(table: dict[str, list[float]], name: str, scale: float = 1.0) -> str:
    return f"{statistics.median(table[name]) * scale:.2f}" if table.get(name) else "n/a"


def _foreign_cell(cores: list[float]) -> str:
    if not cores:
        return "n/a"
    return f"{statistics.median(cores):.2f} (max {max(cores):.2f}) CPUs"


def render(results: dict[str, WorkloadResult], env: dict[str, Any], command: str) -> str:
    """The report: environment, throughput, CPU use, time to first batch, targets."""
    machine = (
        "machine: {cpus} CPUs, {cpu_model}; Python {python}, numpy {numpy}, torch {torch}, "
        "Pillow {pillow}, stoker {stoker} (git {git_commit}); start method {start_method}; "
        "{date}; 1-min load average {load_average} at start, {load_average_end} at end"
    ).format(**env)
    lines = [f"command: {command}", machine]
    waited = sum(res.waited_s for res in results.values())
    if waited:
        lines.append(f"waited {waited:.0f} s in all for other processes to leave the CPUs idle")
    lines.append("")

    lines += ["Throughput, median batches/s (per-round range of each ratio in brackets)", ""]
    ideal = ("torch0", "stoker0")
    lines += _table(
        [
            "workload",
            *LOADERS,
            "stoker2/torch2",
            "stoker2/torch0",
            "stoker2 % of ideal",
            "torch2 % of ideal",
        ],
        [
            [
                res.name,
                *(f"{res.median(n):.1f}" for n in LOADERS),
                _ratio_cell(res.ratio("stoker2", "torch2")),
                _ratio_cell(res.ratio("stoker2", "torch0")),
                _ratio_cell(res.ratio("stoker2", ideal, factor=2.0), percent=True),
                _ratio_cell(res.ratio("torch2", ideal, factor=2.0), percent=True),
            ]
            for res in results.values()
        ],
    )
    lines += ["", "ideal = 2 x max(torch0, stoker0) batches/s", ""]

    lines += [
        "Where the time goes: median CPU ms per timed batch (main process; both workers together)",
        "",
    ]
    rows = []
    for res in results.values():
        busy = statistics.median(res.main_cpu_ms["stoker2"]) * res.median("stoker2") / 1e3
        rows.append(
            [
                res.name,
                *(_median_cell(res.main_cpu_ms, n) for n in ("torch0", "stoker0")),
                _median_cell(res.main_cpu_ms, "torch2"),
                _median_cell(res.worker_cpu_ms, "torch2"),
                _median_cell(res.main_cpu_ms, "stoker2"),
                _median_cell(res.worker_cpu_ms, "stoker2"),
                f"{busy * 100:.0f}%",
                _foreign_cell(res.foreign_cores),
            ]
        )
    header = ["workload", "torch0 main", "stoker0 main", "torch2 main", "torch2 workers"]
    header += ["stoker2 main", "stoker2 workers", "stoker2 main busy", "other processes"]
    lines += _table(header, rows)

    ttfb = [res for res in results.values() if res.ttfb_s]
    if ttfb:
        lines += [
            "",
            "Time to first batch, median ms (fresh non-persistent loader: iter + next)",
            "",
        ]
        rows = []
        for res in ttfb:
            first = {n: statistics.median(res.ttfb_s[n]) * 1e3 for n in LOADERS}
            rows.append(
                [
                    res.name,
                    *(f"{first[n]:.1f}" for n in ("torch0", "stoker0", "torch2", "stoker2")),
                    f"{first['stoker2'] / first['torch2']:.2f}",
                    _median_cell(res.construct_s, "torch2", 1e3),
                    _median_cell(res.construct_s, "stoker2", 1e3),
                ]
            )
        header = ["workload", "torch0", "stoker0", "torch2", "stoker2", "stoker2/torch2"]
        header += ["building torch2", "building stoker2"]
        lines += _table(header, rows)

    found = targets(results)
    if found:
        lines += ["", "Targets", ""]
        rows = []
        for t in found:
            pct = "%" in t.what
            fmt = (lambda v: f"{v * 100:.0f}%") if pct else (lambda v: f"{v:.2f}")
            sign = ">=" if t.higher_is_better else "<="
            verdict = "met" if t.met else f"MISSED ({t.shortfall()} target)"
            measured = f"{fmt(t.measured)} [{fmt(t.low)}-{fmt(t.high)}]"
            rows.append([t.workload, t.what, f"{sign} {fmt(t.required)}", measured, verdict])
        header = ["workload", "measure", "target", "measured [per-round range]", "verdict"]
        lines += _table(header, rows, text_columns=2)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    parser.add_argument(
        "--workloads",
        default="tiny,large,cpu,jpeg",
        help="comma-separated subset of " + ",".join(WORKLOADS),
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer timed batches and 3 rounds: a smoke run"
    )
    parser.add_argument(
        "--no-ttfb", action="store_true", help="skip the time-to-first-batch measurements"
    )
    parser.add_argument("--json", metavar="PATH", help="also write every per-round figure to PATH")
    parser.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each round, wait up to SECONDS for other processes to leave the CPUs idle "
        "(default 0: do not wait); useful on a shared machine",
    )
    parser.add_argument(
        "--profile",
        choices=LOADERS,
        help="after the rounds, cProfile this loader's main process for one epoch",
    )
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown or not names:
        parser.error(
            f"--workloads takes a comma-separated subset of {','.join(WORKLOADS)}, "
            f"got {args.workloads!r}"
        )
    if args.rounds < 1:
        parser.error(f"--rounds must be a positive integer, got {args.rounds}")
    if args.wait_idle < 0:
        parser.error(f"--wait-idle must be a number of seconds >= 0, got {args.wait_idle}")
    rounds = min(args.rounds, 3) if args.quick else args.rounds

    command = " ".join(["python", os.path.relpath(sys.argv[0]), *sys.argv[1:]])
    env = environment()
    _progress(f"{env['cpus']} CPUs ({env['cpu_model']}); {rounds} rounds of {', '.join(LOADERS)}")
    results: dict[str, WorkloadResult] = {}
    start = time.perf_counter()
    for name in names:
        _progress(f"{name}: {WORKLOADS[name].description}")
        results[name] = run_workload(
            WORKLOADS[name], rounds, args.quick, not args.no_ttfb, args.profile, args.wait_idle
        )
    _progress(f"done in {time.perf_counter() - start:.0f} s")
    env["load_average_end"] = _load_average()
    print()
    print(render(results, env, command))
    if args.json:
        payload = {
            "command": command,
            "environment": env,
            "workloads": {k: asdict(v) for k, v in results.items()},
            "targets": [{**asdict(t), "met": t.met} for t in targets(results)],
        }
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
