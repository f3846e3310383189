"""The ``stoker demo`` command: its arguments, and the run from cache to plot."""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from typing import Any

from stoker._proc import usable_cpus
from stoker.cli._args import nonnegative_float, positive_int
from stoker.cli._output import PLOT_INSTALL, say
from stoker.cli.demo.cache import DemoData, build, cache_root
from stoker.cli.demo.config import DemoConfig
from stoker.cli.demo.report import (
    Progress,
    busy_note,
    collate_note,
    cpu_bound_note,
    legend,
    median_results,
    result_line,
    rounds_note,
    save_plot,
    table,
)
from stoker.cli.demo.stages import (
    Stage,
    Step,
    Timing,
    accelerator,
    build_stages,
    close_loader,
    make_loader,
    quiet_pinning,
    time_run,
)

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "demo",
        help="reproduce the classic staged data-loading speed-up, beside torch.utils.data",
        description="Build a synthetic JPEG dataset in a cache folder (once), then time a "
        "simulated training loop in four stages: naive single-process loading; workers with "
        "pinned memory and persistent workers; packed shards read through mmap; a deeper "
        "prefetch with a batch-level MixUp collate. Each stage runs with stoker and with "
        "torch.utils.data (when installed) on the same dataset object.",
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny images and few batches (a few seconds)"
    )
    parser.add_argument(
        "--cache",
        default=None,
        help="cache folder (default $STOKER_CACHE/demo or ~/.cache/stoker/demo)",
    )
    parser.add_argument(
        "--plot",
        default=None,
        help="where to save the PNG plot (default: demo.png in the cache folder)",
    )
    parser.add_argument(
        "--step-ms",
        type=nonnegative_float,
        default=None,
        metavar="MS",
        help="simulated accelerator time per training step (default 20; 5 with --quick): "
        "loading gains show only while loading is slower than the step",
    )
    parser.add_argument(
        "--rounds",
        type=positive_int,
        default=None,
        metavar="N",
        help="runs of every stage per library, alternating which library goes first; the "
        "table gives each one's median (default 3; 1 with --quick)",
    )
    parser.add_argument(
        "--no-torch", action="store_true", help="run stoker only, without the torch reference"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    config = DemoConfig.quick() if args.quick else DemoConfig.full()
    if args.step_ms is not None:
        config = replace(config, step_ms=args.step_ms)
    if args.rounds is not None:
        config = replace(config, rounds=args.rounds)
    libraries = _libraries(args.no_torch)
    root = cache_root(args.cache)
    try:
        data = build(root, config, lambda text: print(text, flush=True))
    except ImportError as exc:
        print(
            f"stoker demo needs Pillow to write its images: pip install 'stoker[demo]' ({exc})",
            file=sys.stderr,
        )
        return 2
    device, pin_note = accelerator()
    stages = build_stages(data, config)
    _print_header(config, data)
    rounds = _time_stages(stages, libraries, config, Step(config.step_ms / 1e3, device))
    results = median_results(rounds)
    print()
    print(table(stages, results, libraries))
    print(legend(libraries, results))
    print(pin_note)
    notes = [rounds_note(rounds, libraries), busy_note(results)]
    if "torch" in libraries:
        notes.insert(1, cpu_bound_note(results, usable_cpus()))
    if "torch" in libraries:
        import torch

        notes.insert(0, collate_note(results, torch.get_num_threads()))
    for note in notes:
        if note is not None:
            print(note)
    plot = args.plot or os.path.join(root, "demo.png")
    if save_plot(plot, stages, results, libraries, config):
        say(f"plot: {os.path.abspath(plot)}")
    else:
        print(f"plot: skipped, it needs matplotlib: {PLOT_INSTALL}")
    print(f"done in {time.perf_counter() - started:.1f} s")
    return 0


def _libraries(no_torch: bool) -> list[str]:
    """stoker, and torch.utils.data beside it when installed and not refused."""
    if no_torch:
        return ["stoker"]
    try:
        import torch
        import torch.utils.data  # noqa: F401 (only whether it imports)
    except ImportError:
        print(
            "torch is not installed: running stoker alone "
            "(pip install 'stoker[demo]' for the reference)."
        )
        return ["stoker"]
    return ["stoker", "torch"]


def _print_header(config: DemoConfig, data: DemoData) -> None:
    print(
        f"stoker demo: {config.describe()}, {config.batches} timed steps per run after "
        f"{config.warmup} warm-up, a simulated {config.step_ms:g} ms of accelerator work per "
        f"step; {usable_cpus()} CPUs"
    )
    if data.built_s:
        say(
            f"  (built the dataset in {data.built_s:.1f} s; "
            f"later runs reuse {os.path.dirname(data.folder)})"
        )


def _time_stages(
    stages: list[Stage], libraries: list[str], config: DemoConfig, step: Step
) -> list[dict[tuple[int, str], Timing]]:
    """Every stage with every library, once per round, a line each as it finishes.

    Returns each round's timings by (stage, library). In every other round the libraries
    run in the opposite order, so neither always runs on a machine the other warmed up.
    """
    per_run = config.warmup + config.batches
    progress = Progress(config.rounds * len(stages) * len(libraries) * per_run)
    rounds: list[dict[tuple[int, str], Timing]] = []
    try:
        for number in range(config.rounds):
            results: dict[tuple[int, str], Timing] = {}
            order = libraries if number % 2 == 0 else libraries[::-1]
            tag = f"round {number + 1}/{config.rounds} " if config.rounds > 1 else ""
            for stage in stages:
                for library in order:
                    progress.describe(f"{tag}stage {stage.number} {library}")
                    results[(stage.number, library)] = _time_one(
                        library, stage, config, step, progress
                    )
                    baseline = results.get((1, library))
                    line = result_line(stage, library, results[(stage.number, library)], baseline)
                    progress.say("  " + tag + line.lstrip())
            rounds.append(results)
    finally:
        progress.close()
    return rounds


def _time_one(
    library: str, stage: Stage, config: DemoConfig, step: Step, progress: Progress
) -> Timing:
    with quiet_pinning():
        loader = make_loader(library, stage, config)
        try:
            return time_run(loader, config, step, stage.pinned, progress.tick)
        finally:
            close_loader(loader)
            del loader
