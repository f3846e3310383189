"""The ``stoker bench`` command: its arguments, progress while the sweep runs, what it writes.

The measuring is :func:`stoker.tuning.sweep`; TARGET is found as ``stoker doctor`` finds
it (:mod:`stoker.cli._target`); the table, notes, plot and HTML page are drawn by
:mod:`stoker.cli.bench.report`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from typing import Any

from stoker._errors import ImageDecodeError
from stoker._extras import MissingExtraError
from stoker._printable import printable
from stoker._proc import usable_cpus
from stoker.cli._args import int_list, nonnegative_int, positive_int
from stoker.cli._output import progress_bar, say, usage_error
from stoker.cli._target import TargetError, add_size_argument, add_target_argument, load_target
from stoker.cli.bench.report import (
    PLOT_NEEDS,
    format_table,
    html_report,
    load_note,
    memory_note,
    plot_png,
)
from stoker.tuning.sweep import SweepPoint, SweepResult, default_workers, sweep

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "bench",
        help="sweep num_workers and prefetch_factor over a dataset and find the knee",
        description="Load a dataset with each num_workers (and prefetch_factor) setting, drop the "
        "warm-up batches, time the rest, and report batches/s, samples/s, the memory estimate "
        "(batch bytes x workers x prefetch) beside the measured peak memory, and the knee: "
        "the fewest workers within 5% of the best rate.",
    )
    add_target_argument(parser, lead="the dataset, as for stoker doctor: ")
    parser.add_argument(
        "--batch-size", type=positive_int, default=64, help="samples per batch (default 64)"
    )
    parser.add_argument(
        "--workers",
        type=int_list(0),
        default=None,
        help="num_workers values, comma-separated (default: 0 and powers of two up to the "
        f"CPU count: {','.join(map(str, default_workers()))})",
    )
    parser.add_argument(
        "--prefetch",
        type=int_list(1),
        default=(2,),
        help="prefetch_factor values for num_workers > 0 (default 2)",
    )
    parser.add_argument(
        "--batches", type=positive_int, default=50, help="timed batches per setting (default 50)"
    )
    parser.add_argument(
        "--warmup",
        type=nonnegative_int,
        default=5,
        help="batches dropped before timing (default 5)",
    )
    parser.add_argument(
        "--worker-mode",
        choices=("process", "thread"),
        default="process",
        help="worker kind (default process)",
    )
    add_size_argument(
        parser,
        help_text="images from a folder or `stoker pack`: decode, resize the shorter side and "
        "centre-crop to this size, as stoker doctor does (default 224); for your own "
        "transforms pass module:attr",
        zero_keeps_size=False,
    )
    parser.add_argument(
        "--no-shuffle",
        dest="shuffle",
        action="store_false",
        help="read in order instead of shuffled",
    )
    parser.add_argument(
        "--plot",
        default=None,
        metavar="PATH",
        help="also write a PNG plot of the sweep to PATH (default: no plot; needs matplotlib)",
    )
    parser.add_argument(
        "--no-plot",
        dest="plot",
        action="store_const",
        const=None,
        help="write no plot (the default)",
    )
    parser.add_argument(
        "--html",
        default=None,
        metavar="PATH",
        help="also write a self-contained HTML report to PATH",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the results as JSON on stdout instead of the table",
    )
    parser.set_defaults(run=run)


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
        self._bar = progress_bar(settings * per_setting, "batch")

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


# --------------------------------------------------------------------------- the command


def run(args: argparse.Namespace) -> int:
    target = printable(args.target)  # how the lines name it: control characters escaped
    try:
        dataset, _ = load_target(args.target, size=args.size, command="bench")
    except TargetError as exc:
        return usage_error("bench", str(exc))
    except MissingExtraError:
        raise
    except Exception as exc:  # the user's dataset failed to build: report it, not a traceback
        say(f"stoker bench: loading {target} raised {type(exc).__name__}: {exc}", sys.stderr)
        return 1
    if hasattr(dataset, "__len__") and len(dataset) == 0:
        say(f"stoker bench: {target} is empty: there is nothing to load", sys.stderr)
        return 1
    workers = args.workers if args.workers is not None else default_workers()
    settings = sum(1 if w == 0 else len(set(args.prefetch)) for w in set(workers))
    title = (
        f"{target} ({_describe(dataset)}), batch_size={args.batch_size}, {args.batches} timed "
        f"batches after {args.warmup} warm-up, {args.worker_mode} workers, "
        f"{usable_cpus()} CPUs, Python {platform.python_version()}"
    )
    if not args.json:
        say(f"stoker bench: {title}")
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
    except ImageDecodeError as exc:  # a bad file: one line, and the command that finds them all
        bar.close()
        what = getattr(exc, "filename", None) or "an image"
        reason = getattr(exc, "reason", None)
        say(
            f"stoker bench: {printable(what)} is not a readable image"
            + (f" ({reason})" if reason else "")
            + f"; `stoker doctor {target}` checks every file and lists the unreadable "
            "ones",
            sys.stderr,
        )
        return 1
    finally:
        bar.close()
    png = plot_png(result, title) if (args.plot or args.html) else None
    notes = _write_files(args, result, title, png)
    if args.json:
        _print_json(args, dataset, result, png, notes)
    else:
        _print_table(result, notes)
    return 0


def _write_files(
    args: argparse.Namespace, result: SweepResult, title: str, png: bytes | None
) -> list[str]:
    """Writes the plot and the HTML page asked for; returns a note about each."""
    notes = []
    if args.plot:
        if png is None:
            notes.append(f"plot: skipped, {PLOT_NEEDS}")
        else:
            with open(args.plot, "wb") as f:
                f.write(png)
            notes.append(f"plot: {os.path.abspath(args.plot)}")
    if args.html:
        with open(args.html, "w", encoding="utf-8") as f:
            f.write(html_report(result, title, png))
        notes.append(f"report: {os.path.abspath(args.html)}")
    return notes


def _print_json(
    args: argparse.Namespace, dataset: Any, result: SweepResult, png: bytes | None, notes: list[str]
) -> None:
    """The results as JSON on stdout; the notes about written files on stderr."""
    document = {"target": args.target, "dataset": _describe(dataset), **result.to_dict()}
    if args.plot and png is not None:
        document["plot"] = os.path.abspath(args.plot)
    if args.html:
        document["html"] = os.path.abspath(args.html)
    json.dump(document, sys.stdout, indent=2)
    sys.stdout.write("\n")
    for note in notes:
        say(note, sys.stderr)


def _print_table(result: SweepResult, notes: list[str]) -> None:
    print(format_table(result))
    print(result.knee_line())
    print(memory_note(result))
    note = load_note(result)
    if note is not None:
        print(note)
    for note in notes:
        say(note)
