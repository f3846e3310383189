"""What ``stoker demo`` shows: progress, a line per run, the table, the plot."""

from __future__ import annotations

import os
import sys
from typing import Any

from stoker._proc import usable_cpus
from stoker.cli._output import progress_bar, pyplot
from stoker.cli.demo.config import DemoConfig
from stoker.cli.demo.stages import Stage, Timing
from stoker.tuning.background_load import BUSY_CPUS

__all__ = [
    "Progress",
    "busy_note",
    "collate_note",
    "cpu_bound_note",
    "disturbed",
    "legend",
    "median_results",
    "result_line",
    "rounds_note",
    "save_plot",
    "table",
]

SPEEDUP_MEANING = "speed-up vs stage 1 of the same loader"


def disturbed(timing: Timing) -> bool:
    """Whether other processes kept enough CPUs busy during the run to make its time suspect."""
    return timing.other_cpus is not None and timing.other_cpus > BUSY_CPUS


class Progress:
    """A tqdm bar over every batch of the demo, with lines printed above it; without tqdm,
    the lines alone."""

    def __init__(self, total: int) -> None:
        self._bar = progress_bar(total, "batch")

    def describe(self, text: str) -> None:
        if self._bar is not None:
            self._bar.set_description(text)

    def tick(self) -> None:
        if self._bar is not None:
            self._bar.update(1)

    def say(self, text: str) -> None:
        if self._bar is not None:
            self._bar.write(text, file=sys.stdout)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def result_line(stage: Stage, library: str, timing: Timing, baseline: Timing | None) -> str:
    speedup = (baseline or timing).step_s / timing.step_s
    line = (
        f"  stage {stage.number} {library:<6} {timing.step_s * 1e3:7.1f} ms/step  {speedup:5.2f}x  "
        f"(waiting for data {timing.wait_share:.0%} of the step)"
    )
    if disturbed(timing):
        line += f" [disturbed: other processes busy on {timing.other_cpus:.1f} CPUs]"
    return line


def table(stages: list[Stage], results: dict[tuple[int, str], Timing], libraries: list[str]) -> str:
    header = f"{'stage':<52}"
    for library in libraries:
        header += f"  {library + ' ms/step':>15} {'speed-up':>8} {'wait':>5}"
    if len(libraries) == 2:
        header += f"  {'stoker vs torch':>15}"
    lines = [header]
    for stage in stages:
        line = f"{stage.number}. {stage.title:<49}"
        for library in libraries:
            timing, base = results[(stage.number, library)], results[(1, library)]
            speedup = base.step_s / timing.step_s
            mark = "*" if disturbed(timing) else " "
            line += f"  {timing.step_s * 1e3:14.1f}{mark} {speedup:7.2f}x {timing.wait_share:5.0%}"
        if len(libraries) == 2:
            ratio = (
                results[(stage.number, "torch")].step_s / results[(stage.number, "stoker")].step_s
            )
            line += f"  {ratio:14.2f}x"
        lines.append(line)
    return "\n".join(lines)


def legend(libraries: list[str], results: dict[tuple[int, str], Timing]) -> str:
    """The lines under the table that define its columns and marks."""
    lines = [
        "ms/step: mean wall time of a timed training step (waiting for the batch, then the "
        "simulated step).",
        f"speed-up: {SPEEDUP_MEANING} (stage 1's ms/step divided by this stage's).",
        "wait: share of the step spent waiting for the batch.",
    ]
    if len(libraries) == 2:
        lines.append(
            "stoker vs torch: torch's ms/step divided by stoker's, for the same stage "
            "(above 1x: stoker is faster)."
        )
    if any(disturbed(t) for t in results.values()):
        lines.append(
            f"*: disturbed run: other processes kept more than {BUSY_CPUS:g} CPUs busy while it "
            "was timed, so its time says more about the machine than about the loader."
        )
    return "\n".join(lines)


def save_plot(
    path: str,
    stages: list[Stage],
    results: dict[tuple[int, str], Timing],
    libraries: list[str],
    config: DemoConfig,
) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(10, 4.8))
    handles: list[Any] = []
    width = 0.8 / len(libraries)
    for k, library in enumerate(libraries):
        xs = [s.number + (k - (len(libraries) - 1) / 2) * width for s in stages]
        ms = [results[(s.number, library)].step_s * 1e3 for s in stages]
        name = "stoker" if library == "stoker" else "torch.utils.data"
        bars = ax.bar(xs, ms, width, color=f"C{k}")
        handles.append(Patch(facecolor=f"C{k}", label=name))
        base = ms[0]
        for bar, value, stage in zip(bars, ms, stages, strict=True):
            where = (bar.get_x() + bar.get_width() / 2, value)
            text = f"{value:.0f} ms\n{base / value:.2f}x"
            if disturbed(results[(stage.number, library)]):
                bar.set_hatch("//")
                bar.set_edgecolor("red")
                text += "\ndisturbed"
            ax.annotate(text, where, ha="center", va="bottom", fontsize=8)
    compute = f"simulated step compute ({config.step_ms:g} ms)"
    handles.append(
        ax.axhline(config.step_ms, color="grey", linestyle="--", linewidth=1, label=compute)
    )
    ax.set_xticks(
        [s.number for s in stages],
        [f"{s.number}. {s.title}" for s in stages],
        fontsize=8,
        rotation=12,
    )
    ax.set_ylabel("ms per training step")
    notes = [f"bar labels: ms per step and {SPEEDUP_MEANING}"]
    busy = [t for t in results.values() if disturbed(t)]
    if busy:
        notes.append(
            f"hatched in red: {len(busy)} of {len(results)} runs disturbed by other processes "
            f"(> {BUSY_CPUS:g} CPUs busy); rerun on a quiet machine"
        )
    fig.text(0.01, 0.01, "\n".join(notes), fontsize=8, color="red" if busy else "black")
    ax.set_title(
        f"stoker demo: {config.describe()}, {usable_cpus()} CPUs",
        fontsize=10,
    )
    if busy:
        handles.append(Patch(facecolor="white", edgecolor="red", hatch="//", label="disturbed run"))
    ax.legend(handles=handles, fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    ax.margins(y=0.15)
    fig.tight_layout(rect=(0, 0.05 * len(notes), 1, 1))
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        fig.savefig(temporary, dpi=100, format="png")
        os.replace(temporary, path)  # a run beside this one never reads half a plot
    finally:
        plt.close(fig)
        if os.path.exists(temporary):
            os.remove(temporary)
    return True


def busy_note(results: dict[tuple[int, str], Timing]) -> str | None:
    """A warning when other processes were busy during some runs, else None.

    It also names a stage slower than stage 1 of the same loader in a disturbed run: the
    staged story inverted by the machine, not by the loader.
    """
    busy = [t.other_cpus for t in results.values() if disturbed(t) and t.other_cpus is not None]
    if not busy:
        return None
    note = (
        f"note: other processes kept up to {max(busy):.1f} CPUs busy during {len(busy)} of the "
        f"{len(results)} runs (marked *); those figures are disturbed. Rerun on a quiet machine."
    )
    inverted = [
        f"stage {number} {library}"
        for (number, library), timing in sorted(results.items())
        if number > 1
        and timing.step_s > results[(1, library)].step_s
        and (disturbed(timing) or disturbed(results[(1, library)]))
    ]
    if inverted:
        note += (
            f" {', '.join(inverted)} came out slower than stage 1: workers compete with the "
            "other processes for the CPUs, so the order of the stages is not to be trusted here."
        )
    return note


def collate_note(results: dict[tuple[int, str], Timing], threads: int) -> str | None:
    """Where stage 1's gap between the libraries comes from (torch's collate threads, not
    loading), when torch's stage 1 is more than 10% slower than stoker's; else None."""
    gap = results[(1, "torch")].step_s / results[(1, "stoker")].step_s
    if gap <= 1.1:
        return None
    return (
        f"note: stage 1 is {gap:.2f}x slower with torch, though both run the same dataset code "
        "in the main process: the gap is not loading. torch's default_collate stacks each batch "
        f"on torch's intra-op threads ({threads} here), which compete with the main process, "
        "busy decoding images, for the CPUs; the fewer idle CPUs, the larger the gap "
        "(torch.set_num_threads(1) removes most of it)."
    )


def median_results(
    rounds: list[dict[tuple[int, str], Timing]],
) -> dict[tuple[int, str], Timing]:
    """Per (stage, library), the run of median ms/step over the rounds (the lower one of the
    middle two for an even count: a real run, never an average of two)."""
    return {
        key: sorted((r[key] for r in rounds), key=lambda t: t.step_s)[(len(rounds) - 1) // 2]
        for key in rounds[0]
    }


def rounds_note(rounds: list[dict[tuple[int, str], Timing]], libraries: list[str]) -> str | None:
    """With several rounds: how many, and each stage's stoker-vs-torch ratio per round."""
    if len(rounds) < 2:
        return None
    text = f"each cell: the median of {len(rounds)} rounds, the libraries' order alternating"
    if len(libraries) != 2:
        return text + "."
    stages = sorted({stage for stage, _library in rounds[0]})
    spans = []
    for stage in stages:
        ratios = [r[(stage, "torch")].step_s / r[(stage, "stoker")].step_s for r in rounds]
        spans.append(f"stage {stage} {min(ratios):.2f}-{max(ratios):.2f}x")
    return text + "; stoker vs torch per round: " + ", ".join(spans) + "."


CPU_BOUND_SHARE = 0.85  # a run keeping this share of the CPUs busy is limited by them


def cpu_bound_note(results: dict[tuple[int, str], Timing], cpus: int) -> str | None:
    """The stages where both loaders kept (nearly) every CPU busy: there the CPUs set the
    pace, and the stoker-vs-torch figure says which spends less CPU per batch."""
    bound = []
    for stage in sorted({stage for stage, _library in results}):
        used = [_own_cpus(results.get((stage, library))) for library in ("stoker", "torch")]
        if all(u is not None and u >= CPU_BOUND_SHARE * cpus for u in used):
            bound.append(f"stage {stage} (stoker {used[0]:.1f}, torch {used[1]:.1f})")
    if not bound:
        return None
    return (
        f"note: the CPUs are the limit in {', '.join(bound)}: both loaders kept the {cpus} "
        "CPUs busy (CPUs used, loader and workers together). There neither can overlap more "
        "of the work with the step, so the stoker-vs-torch figure only says which spends less "
        "CPU per batch; more CPUs (or lighter per-sample work) would separate them."
    )


def _own_cpus(timing: Timing | None) -> float | None:
    return None if timing is None else timing.own_cpus
