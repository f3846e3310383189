"""A Hugging Face ``datasets.Dataset`` through stoker and through torch, side by side.

Run from the repository root (needs ``pip install datasets``; nothing is downloaded)::

    .venv/bin/python benchmarks/bench_hf_datasets.py                 # 5 rounds, 3 formats
    .venv/bin/python benchmarks/bench_hf_datasets.py --quick         # smoke run
    .venv/bin/python benchmarks/bench_hf_datasets.py --formats numpy --rounds 9 --json out.json

Method
------
The run writes ONE synthetic dataset to a temporary folder with ``save_to_disk`` and reads
it back with ``load_from_disk``, so it is memory-mapped Arrow, as a dataset from the Hub or
from ``.map()`` is (``--in-memory`` keeps it in RAM instead). Row ``i`` holds
``input_ids`` (a list of token ids, int64, length drawn uniformly from
``--min-len``..``--max-len``), ``label`` (0..9) and ``idx`` (``i``, used to check that
every row arrives exactly once per epoch). Each format (``python``: lists of ints;
``numpy``; ``torch``) is the same dataset with ``with_format``.

Loaders, each over that same object, with ``batch_size``, ``shuffle=True``,
``num_workers``, ``persistent_workers=True`` and nothing else:

- ``torch``: ``torch.utils.data.DataLoader`` with ``collate_fn=pad_plain``;
- ``stoker`` / ``stoker.torch``: ``stoker.DataLoader`` / ``stoker.torch.DataLoader``
  with ``collate_fn=PadCollate(0)``, stoker's padding collate;
- ``stoker plain`` / ``stoker.torch plain``: the same loaders with ``pad_plain``, the
  like-for-like comparison.

``pad_plain`` is an ordinary Python function: it pads ``input_ids`` with 0 to the longest
row of the batch and returns numpy ``input_ids``, ``attention_mask``, ``label`` and
``idx``. PadCollate returns the same fields plus ``lengths``.

Each loader first runs one untimed epoch (workers start, slots are sized). Then every
round runs one full epoch of every loader, in an order rotated from round to round; an
epoch is timed from ``iter(loader)`` to its last batch, the loop copying out ``idx`` and
nothing else. Figures are median seconds per epoch; ratios are torch's median over the
loader's (above 1: faster than torch), with the per-round range in brackets. stoker's
``loader.stats()`` is read before and after each timed epoch, so its worker busy share
and stage times are those of stoker's own epochs only.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_engine import (  # found through the sys.path entry just above
    _children_cpu_s,
    _load_average,
    _machine_busy_s,
    _table,
    base_environment,
    close_loader,
    split_cpu,
    wait_for_idle,
)

FORMATS = ("python", "numpy", "torch")
LOADERS = ("torch", "stoker", "stoker.torch", "stoker plain", "stoker.torch plain")
VOCAB = 32_000


# ----------------------------------------------------------------------------- data


def pad_plain(samples: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """Pads ``input_ids`` with 0 to the batch maximum: the collate a user writes by hand."""
    ids = [np.asarray(s["input_ids"]) for s in samples]
    longest = max(len(a) for a in ids)
    out = np.zeros((len(ids), longest), dtype=np.int64)
    mask = np.zeros((len(ids), longest), dtype=np.bool_)
    for i, a in enumerate(ids):
        out[i, : len(a)] = a
        mask[i, : len(a)] = True
    return {
        "input_ids": out,
        "attention_mask": mask,
        "label": np.array([int(s["label"]) for s in samples], dtype=np.int64),
        "idx": np.array([int(s["idx"]) for s in samples], dtype=np.int64),
    }


def build_dataset(rows: int, min_len: int, max_len: int, folder: str | None, seed: int = 0) -> Any:
    """The synthetic token dataset: memory-mapped from ``folder``, or in memory when None."""
    import datasets

    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_len, max_len + 1, size=rows)
    tokens = rng.integers(1, VOCAB, size=int(lengths.sum()), dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    features = datasets.Features(
        {
            "input_ids": datasets.Sequence(datasets.Value("int64")),
            "label": datasets.Value("int64"),
            "idx": datasets.Value("int64"),
        }
    )
    dataset = datasets.Dataset.from_dict(
        {
            "input_ids": [tokens[offsets[i] : offsets[i + 1]] for i in range(rows)],
            "label": rng.integers(0, 10, size=rows),
            "idx": np.arange(rows),
        },
        features=features,
    )
    if folder is None:
        return dataset
    datasets.disable_progress_bars()
    dataset.save_to_disk(folder)
    return datasets.load_from_disk(folder)


def make_loader(name: str, dataset: Any, batch_size: int, workers: int, seed: int) -> Any:
    """One of :data:`LOADERS` (see the module docstring)."""
    extra = {"num_workers": workers, "persistent_workers": workers > 0}
    if name == "torch":
        import torch.utils.data

        return torch.utils.data.DataLoader(
            dataset, batch_size=batch_size, shuffle=True, collate_fn=pad_plain, **extra
        )
    import stoker
    import stoker.torch

    library, _, kind = name.partition(" ")
    collate_fn: Callable[[Any], Any] = pad_plain if kind == "plain" else stoker.PadCollate(0)
    cls = stoker.torch.DataLoader if library == "stoker.torch" else stoker.DataLoader
    return cls(
        dataset, batch_size=batch_size, shuffle=True, collate_fn=collate_fn, generator=seed, **extra
    )


# ----------------------------------------------------------------------------- timing


@dataclass(slots=True)
class Epoch:
    seconds: float
    worker_cpu_s: float | None  # all workers together, from /proc
    main_cpu_s: float
    foreign_cores: float | None  # CPUs kept busy by other processes meanwhile
    busy: float | None = None  # stoker: share of the workers' wall time spent loading
    fetch_ms: float | None = None  # stoker: per batch, summed over workers
    collate_ms: float | None = None
    transport_ms: float | None = None


def run_epoch(loader: Any, rows: int) -> Epoch:
    """One full epoch; checks that every row came exactly once."""
    gc.collect()
    before = loader.stats() if hasattr(loader, "stats") else None
    children0, busy0, cpu0 = _children_cpu_s(), _machine_busy_s(), time.process_time()
    seen = []
    start = time.perf_counter()
    for batch in loader:
        seen.append(np.array(batch["idx"]))  # a copy: the batch itself is dropped at once
    seconds = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    children1, busy1 = _children_cpu_s(), _machine_busy_s()
    got = np.sort(np.concatenate(seen)) if seen else np.zeros(0, np.int64)
    if got.shape != (rows,) or not np.array_equal(got, np.arange(rows)):
        missing = np.setdiff1d(np.arange(rows), got).size
        msg = f"{loader!r} delivered {got.size} rows ({missing} missing) in an epoch of {rows}"
        raise AssertionError(msg)
    workers, foreign = split_cpu(children0, children1, busy0, busy1, cpu, seconds)
    epoch = Epoch(seconds, workers, cpu, foreign)
    if before is not None:
        after = loader.stats()
        batches = after.batches - before.batches
        busy = sum(after.worker_busy_s.values()) - sum(before.worker_busy_s.values())
        epoch.busy = busy / (seconds * after.num_workers)
        epoch.fetch_ms = (after.fetch_s - before.fetch_s) * 1e3 / batches
        epoch.collate_ms = (after.collate_s - before.collate_s) * 1e3 / batches
        epoch.transport_ms = (after.transport_s - before.transport_s) * 1e3 / batches
    return epoch


@dataclass(slots=True)
class FormatResult:
    format: str
    epochs: dict[str, list[Epoch]] = field(default_factory=dict)

    def seconds(self, name: str) -> float:
        return statistics.median(e.seconds for e in self.epochs[name])

    def speedup(self, name: str) -> tuple[float, float, float]:
        """torch's time over ``name``'s: (ratio of medians, lowest and highest per round)."""
        rounds = [
            t.seconds / s.seconds
            for t, s in zip(self.epochs["torch"], self.epochs[name], strict=True)
        ]
        return self.seconds("torch") / self.seconds(name), min(rounds), max(rounds)

    def median_of(self, name: str, attribute: str) -> float | None:
        values = [getattr(e, attribute) for e in self.epochs[name]]
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None


def run_format(
    fmt: str,
    base: Any,
    args: argparse.Namespace,
) -> FormatResult:
    dataset = base if fmt == "python" else base.with_format(fmt)
    loaders = {
        name: make_loader(name, dataset, args.batch_size, args.workers, args.seed)
        for name in LOADERS
    }
    result = FormatResult(fmt)
    try:
        for loader in loaders.values():  # untimed: start the workers, size the slots
            run_epoch(loader, len(dataset))
        for round_ in range(args.rounds):
            wait_for_idle(args.wait_idle)
            order = LOADERS[round_ % len(LOADERS) :] + LOADERS[: round_ % len(LOADERS)]
            for name in order:
                result.epochs.setdefault(name, []).append(run_epoch(loaders[name], len(dataset)))
            _progress(
                f"  {fmt} round {round_ + 1}/{args.rounds}: "
                + "  ".join(f"{n} {result.epochs[n][-1].seconds:.2f}" for n in LOADERS)
                + " s/epoch"
            )
    finally:
        for loader in loaders.values():
            close_loader(loader)
    return result


# ----------------------------------------------------------------------------- report


def environment() -> dict[str, Any]:
    import datasets
    import pyarrow

    import stoker

    env = base_environment()
    env["datasets"] = datasets.__version__
    env["pyarrow"] = pyarrow.__version__
    env["stoker_path"] = os.path.dirname(os.path.dirname(stoker.__file__))
    return env


def settings(args: argparse.Namespace) -> str:
    where = "in memory" if args.in_memory else "memory-mapped from a temporary folder"
    return (
        f"dataset: {args.rows} rows of int64 token lists, length {args.min_len}..{args.max_len} "
        f"(uniform), + label + idx; {where}; formats {', '.join(args.formats)}\n"
        f"loaders: {', '.join(LOADERS)}; batch_size={args.batch_size}, shuffle=True, "
        f"num_workers={args.workers}, persistent_workers=True; collate pad_plain (torch, "
        f"* plain) or PadCollate(0) (stoker, stoker.torch); {args.rounds} timed rounds after "
        f"one untimed epoch per loader; order rotated each round"
    )


def render(results: list[FormatResult], env: dict[str, Any], args: argparse.Namespace) -> str:
    machine = (
        "machine: {cpus} CPUs, {cpu_model}; Python {python}, numpy {numpy}, torch {torch}, "
        "datasets {datasets}, pyarrow {pyarrow}, stoker {stoker} from {stoker_path} (git "
        "{git_commit}); start "
        "method {start_method}; {date}; 1-min load average {load_average} at start, "
        "{load_average_end} at end"
    ).format(**env)
    lines = [f"command: {args.command}", settings(args), machine, ""]
    lines += [
        "Seconds per epoch, median; speed-up = torch's median / the loader's "
        "(per-round range in brackets; >= 1.00: at torch's speed or faster)",
        "",
    ]
    header = ["format", *LOADERS]
    header += [f"{n} vs torch" for n in LOADERS[1:]]
    rows = []
    for res in results:
        cells = [res.format, *(f"{res.seconds(n):.2f}" for n in LOADERS)]
        cells += ["{:.2f}x [{:.2f}-{:.2f}]".format(*res.speedup(n)) for n in LOADERS[1:]]
        rows.append(cells)
    lines += _table(header, rows)
    lines += ["", "Where the time goes (medians over rounds)", ""]
    header = ["format", "loader", "workers CPU s/epoch", "main CPU s/epoch", "workers busy"]
    header += ["fetch ms/batch", "collate ms/batch", "transport ms/batch", "other processes"]
    rows = []
    for res in results:
        for name in LOADERS:
            busy = res.median_of(name, "busy")
            cells = [res.format, name]
            for attribute, unit in (("worker_cpu_s", "{:.2f}"), ("main_cpu_s", "{:.2f}")):
                value = res.median_of(name, attribute)
                cells.append(unit.format(value) if value is not None else "n/a")
            cells.append(f"{busy * 100:.0f}%" if busy is not None else "")
            for attribute in ("fetch_ms", "collate_ms", "transport_ms"):
                value = res.median_of(name, attribute)
                cells.append(f"{value:.3f}" if value is not None else "")
            foreign = res.median_of(name, "foreign_cores")
            cells.append(f"{foreign:.2f} CPUs" if foreign is not None else "n/a")
            rows.append(cells)
    lines += _table(header, rows, text_columns=2)
    lines += [
        "",
        "workers busy: fetch + collate time over the epoch's wall time x workers, from "
        "loader.stats(); fetch and collate are summed over workers",
    ]
    return "\n".join(lines)


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--rows", type=int, default=50_000, help="rows in the dataset")
    parser.add_argument("--min-len", type=int, default=32, help="shortest token list")
    parser.add_argument("--max-len", type=int, default=512, help="longest token list")
    parser.add_argument("--batch-size", type=int, default=64, help="rows per batch")
    parser.add_argument("--workers", type=int, default=2, help="num_workers of every loader")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds")
    parser.add_argument(
        "--formats",
        default=",".join(FORMATS),
        help="comma-separated subset of " + ",".join(FORMATS),
    )
    parser.add_argument(
        "--in-memory", action="store_true", help="keep the Arrow table in RAM, not memory-mapped"
    )
    parser.add_argument("--seed", type=int, default=0, help="data and shuffle seed")
    parser.add_argument(
        "--quick", action="store_true", help="10k rows and 2 rounds: a smoke run (overrides both)"
    )
    parser.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each round, wait up to SECONDS for other processes to leave the CPUs idle",
    )
    parser.add_argument("--json", metavar="PATH", help="also write every per-round figure to PATH")
    args = parser.parse_args(argv)
    args.formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    if not args.formats or any(f not in FORMATS for f in args.formats):
        parser.error(f"--formats takes a comma-separated subset of {','.join(FORMATS)}")
    if args.quick:
        args.rows, args.rounds = 10_000, 2
    if min(args.rows, args.batch_size, args.rounds, args.min_len) < 1 or args.workers < 0:
        parser.error("--rows, --batch-size, --rounds and --min-len must be positive")
    if args.max_len < args.min_len:
        parser.error(f"--max-len ({args.max_len}) must be >= --min-len ({args.min_len})")
    args.command = " ".join(["python", os.path.relpath(sys.argv[0]), *sys.argv[1:]])

    env = environment()
    print(settings(args), file=sys.stderr, flush=True)
    folder = None if args.in_memory else tempfile.mkdtemp(prefix="stoker-bench-hf-")
    try:
        began = time.perf_counter()
        base = build_dataset(args.rows, args.min_len, args.max_len, folder, args.seed)
        _progress(f"dataset built in {time.perf_counter() - began:.1f} s")
        results = [run_format(fmt, base, args) for fmt in args.formats]
        del base
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
    env["load_average_end"] = _load_average()
    print()
    print(render(results, env, args))
    if args.json:
        payload = {
            "command": args.command,
            "settings": {k: v for k, v in vars(args).items() if k != "command"},
            "environment": env,
            "formats": {
                r.format: {n: [asdict(e) for e in es] for n, es in r.epochs.items()}
                for r in results
            },
        }
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
