"""``stoker bench``: sweep ``num_workers`` (and ``prefetch_factor``) over a dataset, find the knee.

The measuring is :func:`stoker.tuning.sweep`; TARGET is found as ``stoker doctor`` finds
it (:func:`stoker.cli.doctor.load_target`). This module shows progress and renders the
result: a table, the knee in one line, a PNG plot (matplotlib, from the ``cli`` extra)
and, if asked, a self-contained HTML report or JSON.
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import json
import os
import platform
import sys
from typing import Any

from stoker._proc import usable_cpus
from stoker.tuning.sweep import SweepPoint, SweepResult, default_workers, sweep

__all__ = ["add_parser", "format_table", "run"]

_PLOT_NEEDS = "the plot needs matplotlib: pip install 'stoker[cli]'"


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "bench",
        help="sweep num_workers and prefetch_factor over a dataset and find the knee",
        description="Load a dataset with each num_workers (and prefetch_factor) setting, drop the "
        "warm-up batches, time the rest, and report batches/s, samples/s, the memory estimate "
        "(batch bytes x workers x prefetch) beside the measured peak memory, and the knee: "
        "the fewest workers within 5%% of the best rate.",
    )
    parser.add_argument(
        "target",
        metavar="TARGET",
        help="the dataset, as for stoker doctor: an image folder (one subfolder per class), a "
        "packed dataset directory, or module:attr naming a dataset or a function that returns one",
    )
    parser.add_argument("--batch-size", type=int, default=64, help="samples per batch (default 64)")
    parser.add_argument(
        "--workers",
        type=_int_list,
        default=None,
        help="num_workers values, comma-separated (default: 0 and powers of two up to the "
        f"CPU count: {','.join(map(str, default_workers()))})",
    )
    parser.add_argument(
        "--prefetch",
        type=_int_list,
        default=(2,),
        help="prefetch_factor values for num_workers > 0 (default 2)",
    )
    parser.add_argument(
        "--batches", type=int, default=50, help="timed batches per setting (default 50)"
    )
    parser.add_argument(
        "--warmup", type=int, default=5, help="batches dropped before timing (default 5)"
    )
    parser.add_argument(
        "--worker-mode",
        choices=("process", "thread"),
        default="process",
        help="worker kind (default process)",
    )
    parser.add_argument(
        "--size",
        type=int,
        default=224,
        help="images from a folder or `stoker pack`: decode, resize the shorter side and "
        "centre-crop to this size, as stoker doctor does (default 224); for your own "
        "transforms pass module:attr",
    )
    parser.add_argument(
        "--no-shuffle",
        dest="shuffle",
        action="store_false",
        help="read in order instead of shuffled",
    )
    parser.add_argument(
        "--plot", default="bench.png", help="where to write the PNG plot (default bench.png)"
    )
    parser.add_argument(
        "--no-plot", dest="plot", action="store_const", const=None, help="write no plot"
    )
    parser.add_argument("--html", default=None, help="also write a self-contained HTML report here")
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the results as JSON on stdout instead of the table",
    )
    parser.set_defaults(run=run)


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        values = ()
    if not values:
        msg = f"expected comma-separated integers such as 0,1,2,4, got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return values


def _describe(dataset: Any) -> str:
    try:
        return f"{type(dataset).__name__}, {len(dataset):,} samples"
    except TypeError:
        return f"{type(dataset).__name__}, iterable"


# --------------------------------------------------------------------------- progress


class _Bar:
    """A tqdm bar over every batch of the sweep, or plain lines per setting without tqdm."""

    def __init__(self, settings: int, per_setting: int) -> None:
        self._settings = settings
        self._done = 0
        try:
            from tqdm import tqdm
        except ImportError:
            self._bar = None
        else:
            self._bar = tqdm(
                total=settings * per_setting, unit="batch", file=sys.stderr, dynamic_ncols=True
            )

    def begin(self, num_workers: int, prefetch_factor: int | None, total_batches: int) -> None:
        label = f"workers={num_workers}" + (
            "" if prefetch_factor is None else f" prefetch={prefetch_factor}"
        )
        if self._bar is not None:
            self._bar.set_description(label)
        else:
            print(
                f"  [{self._done + 1}/{self._settings}] {label}: {total_batches} batches ...",
                file=sys.stderr,
                flush=True,
            )

    def advance(self) -> None:
        if self._bar is not None:
            self._bar.update(1)

    def end(self, point: SweepPoint) -> None:
        self._done += 1
        if self._bar is None:
            rate = f"{point.samples_per_s:,.0f} samples/s"
            print(
                f"  [{self._done}/{self._settings}] {point.label}: {rate}",
                file=sys.stderr,
                flush=True,
            )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


# --------------------------------------------------------------------------- rendering


def _size(nbytes: int | None) -> str:
    if nbytes is None:
        return "n/a"
    sign = "-" if nbytes < 0 else ""
    value = abs(nbytes) / 2**20
    if value >= 1024:
        return f"{sign}{value / 1024:.1f} GiB"
    return f"{sign}{value:.1f} MiB" if value < 100 else f"{sign}{value:.0f} MiB"


_COLUMNS = (
    "num_workers", "prefetch", "batches/s", "samples/s", "vs 0 workers",
    "est. in flight", "peak memory", "above idle",
)  # fmt: skip


def _rows(result: SweepResult) -> list[list[str]]:
    reference = next((p for p in result.points if p.num_workers == 0), None)
    rows = []
    for p in result.points:
        ratio = (
            f"{p.samples_per_s / reference.samples_per_s:.2f}x" if reference is not None else "-"
        )
        rows.append([
            str(p.num_workers),
            "-" if p.prefetch_factor is None else str(p.prefetch_factor),
            f"{p.batches_per_s:,.1f}",
            f"{p.samples_per_s:,.0f}",
            ratio,
            _size(p.memory_estimate_bytes),
            _size(p.peak_rss_bytes),
            _size(p.peak_above_baseline_bytes),
        ])  # fmt: skip
    return rows


def format_table(result: SweepResult) -> str:
    """The sweep as an aligned text table, one row per setting, the knee marked with ``*``."""
    knee = result.knee()
    rows = _rows(result)
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(_COLUMNS)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(_COLUMNS, widths, strict=True))]
    for point, row in zip(result.points, rows, strict=True):
        mark = " *" if point is knee else ""
        lines.append("  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) + mark)
    return "\n".join(lines)


_BUSY_CPUS = 0.3  # other processes above this many CPUs during a timing make it suspect


def _load_note(result: SweepResult) -> str | None:
    """A warning when other processes were busy during the timed batches, else None."""
    busy = [p for p in result.points if p.other_cpus is not None and p.other_cpus > _BUSY_CPUS]
    if not busy:
        return None
    worst = max(busy, key=lambda p: p.other_cpus or 0.0)
    return (
        f"note: other processes kept up to {worst.other_cpus:.1f} CPUs busy during the timing "
        f"({len(busy)} of {len(result.points)} settings); the figures are disturbed, "
        "rerun on a quiet machine."
    )


def _memory_note(result: SweepResult) -> str:
    batch = result.points[0].batch_bytes if result.points else 0
    return (
        f"est. in flight = one batch ({_size(batch)}) x num_workers x prefetch_factor (one batch "
        "without workers); peak memory = the trainer's peak resident set + the workers' peak "
        "private memory; above idle = peak memory - the trainer's resident set before loading."
    )


def _pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend, or None when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _plot_png(result: SweepResult, title: str) -> bytes | None:
    """The sweep as a PNG: rate against num_workers, and memory estimate against measured."""
    plt = _pyplot()
    if plt is None:
        return None
    workers = sorted({p.num_workers for p in result.points})
    x = {w: i for i, w in enumerate(workers)}
    knee = result.knee()
    fig, (rate_ax, mem_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    zero = [p for p in result.points if p.num_workers == 0]
    prefetches = sorted({p.prefetch_factor for p in result.points if p.prefetch_factor is not None})
    for prefetch in prefetches or [None]:
        line = zero + [
            p for p in result.points if p.prefetch_factor == prefetch and p.num_workers > 0
        ]
        label = "num_workers=0" if prefetch is None else f"prefetch_factor={prefetch}"
        rate_ax.plot(
            [x[p.num_workers] for p in line], [p.samples_per_s for p in line], "o-", label=label
        )
    best = result.best().samples_per_s
    rate_ax.axhline(best * 0.95, color="grey", linestyle=":", linewidth=1, label="95% of the best")
    rate_ax.plot(
        [x[knee.num_workers]],
        [knee.samples_per_s],
        "r*",
        markersize=16,
        label=f"knee: {knee.label}",
    )
    rate_ax.set_xticks(range(len(workers)), [str(w) for w in workers])
    rate_ax.set_xlabel("num_workers")
    rate_ax.set_ylabel("samples/s")
    rate_ax.set_ylim(bottom=0)
    rate_ax.set_title("throughput (warm-up excluded)")
    rate_ax.legend(fontsize=8)
    rate_ax.grid(alpha=0.3)
    labels = [
        p.label.replace("num_workers=", "w=").replace(", prefetch_factor=", " pf=")
        for p in result.points
    ]
    positions = range(len(result.points))
    mib = 2**20
    estimates = [p.memory_estimate_bytes / mib for p in result.points]
    mem_ax.bar(
        [i - 0.2 for i in positions], estimates, 0.4, label="estimate: batch x workers x prefetch"
    )
    above = [p.peak_above_baseline_bytes for p in result.points]
    measured = [a / mib for a in above if a is not None]
    if len(measured) == len(above):
        shifted = [i + 0.2 for i in positions]
        mem_ax.bar(shifted, measured, 0.4, label="measured peak above idle")
    mem_ax.set_xticks(list(positions), labels, rotation=30, ha="right", fontsize=8)
    mem_ax.set_ylabel("MiB")
    mem_ax.set_title("memory")
    mem_ax.legend(fontsize=8)
    mem_ax.grid(alpha=0.3, axis="y")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    return buffer.getvalue()


def _html(result: SweepResult, title: str, png: bytes | None) -> str:
    knee, load_note = result.knee(), _load_note(result)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in _COLUMNS)
    body = []
    for point, row in zip(result.points, _rows(result), strict=True):
        style = ' class="knee"' if point is knee else ""
        body.append(f"<tr{style}>" + "".join(f"<td>{html.escape(v)}</td>" for v in row) + "</tr>")
    image = (
        '<img alt="throughput and memory per setting" '
        f'src="data:image/png;base64,{base64.b64encode(png).decode()}">'
        if png is not None
        else f"<p><em>{html.escape(_PLOT_NEEDS)}</em></p>"
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>stoker bench</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
th, td {{ border: 1px solid #ccc; padding: 0.3em 0.7em; text-align: right; }}
th {{ background: #f3f3f3; }}
tr.knee td {{ background: #fff3c4; font-weight: bold; }}
img {{ max-width: 100%; }}
</style></head><body>
<h1>stoker bench</h1>
<p>{html.escape(title)}</p>
<table><thead><tr>{head}</tr></thead><tbody>
{chr(10).join(body)}
</tbody></table>
<p><strong>{html.escape(result.knee_line())}</strong></p>
<p>{html.escape(_memory_note(result))}</p>
{"" if load_note is None else f"<p><em>{html.escape(load_note)}</em></p>"}
{image}
</body></html>
"""


# --------------------------------------------------------------------------- the command


def run(args: argparse.Namespace) -> int:
    for name in ("batch_size", "batches", "size"):
        if getattr(args, name) < 1:
            option, value = name.replace("_", "-"), getattr(args, name)
            print(f"stoker bench: --{option} must be at least 1, got {value}", file=sys.stderr)
            return 2
    for option, value, minimum in (
        ("--warmup", [args.warmup], 0),
        ("--workers", args.workers or [0], 0),
        ("--prefetch", args.prefetch, 1),
    ):
        if min(value) < minimum:
            shown = ",".join(map(str, value))
            print(f"stoker bench: {option} must be {minimum} or more, got {shown}", file=sys.stderr)
            return 2
    from stoker.cli.doctor import TargetError, load_target

    try:
        dataset, _ = load_target(args.target, size=args.size)
    except TargetError as exc:
        print(f"stoker bench: {exc}", file=sys.stderr)
        return 2
    if hasattr(dataset, "__len__") and len(dataset) == 0:
        print(f"stoker bench: {args.target} is empty: there is nothing to load", file=sys.stderr)
        return 2
    workers = args.workers if args.workers is not None else default_workers()
    settings = sum(1 if w == 0 else len(set(args.prefetch)) for w in set(workers))
    title = (
        f"{args.target} ({_describe(dataset)}), batch_size={args.batch_size}, {args.batches} timed "
        f"batches after {args.warmup} warm-up, {args.worker_mode} workers, "
        f"{usable_cpus()} CPUs, Python {platform.python_version()}"
    )
    out = sys.stdout
    if not args.json:
        print(f"stoker bench: {title}", file=out, flush=True)
    bar = _Bar(settings, args.warmup + args.batches)
    try:
        result = sweep(
            dataset,
            batch_size=args.batch_size,
            workers=workers,
            prefetch=args.prefetch,
            batches=args.batches,
            warmup=args.warmup,
            worker_mode=args.worker_mode,
            shuffle=args.shuffle,
            progress=bar,
        )
    finally:
        bar.close()

    png = _plot_png(result, title) if (args.plot or args.html) else None
    notes = []
    if args.plot:
        if png is None:
            notes.append(f"plot: skipped, {_PLOT_NEEDS}")
        else:
            with open(args.plot, "wb") as f:
                f.write(png)
            notes.append(f"plot: {os.path.abspath(args.plot)}")
    if args.html:
        with open(args.html, "w", encoding="utf-8") as f:
            f.write(_html(result, title, png))
        notes.append(f"report: {os.path.abspath(args.html)}")

    if args.json:
        document = {"target": args.target, "dataset": _describe(dataset), **result.to_dict()}
        if args.plot and png is not None:
            document["plot"] = os.path.abspath(args.plot)
        if args.html:
            document["html"] = os.path.abspath(args.html)
        json.dump(document, out, indent=2)
        out.write("\n")
        for note in notes:
            print(note, file=sys.stderr)
        return 0
    print(format_table(result), file=out)
    print(result.knee_line(), file=out)
    print(_memory_note(result), file=out)
    load_note = _load_note(result)
    if load_note is not None:
        print(load_note, file=out)
    for note in notes:
        print(note, file=out)
    return 0
