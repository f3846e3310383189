"""What ``stoker demo`` shows: progress, a line per run, the table, the plot."""

from __future__ import annotations

import os
import sys

from stoker.cli._output import progress_bar, pyplot
from stoker.cli.demo.config import DemoConfig
from stoker.cli.demo.stages import Stage, Timing
from stoker.tuning.background_load import BUSY_CPUS

__all__ = ["Progress", "busy_note", "result_line", "save_plot", "table"]


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
    if timing.other_cpus is not None and timing.other_cpus > BUSY_CPUS:
        line += f" [other processes busy: {timing.other_cpus:.1f} CPUs]"
    return line


def table(
    stages: list[Stage], results: dict[tuple[int, str], Timing], libraries: list[str]
) -> str:
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
            line += f"  {timing.step_s * 1e3:15.1f} {speedup:7.2f}x {timing.wait_share:5.0%}"
        if len(libraries) == 2:
            ratio = (
                results[(stage.number, "torch")].step_s / results[(stage.number, "stoker")].step_s
            )
            line += f"  {ratio:14.2f}x"
        lines.append(line)
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
    fig, ax = plt.subplots(figsize=(10, 4.8))
    width = 0.8 / len(libraries)
    for k, library in enumerate(libraries):
        xs = [s.number + (k - (len(libraries) - 1) / 2) * width for s in stages]
        ms = [results[(s.number, library)].step_s * 1e3 for s in stages]
        bars = ax.bar(xs, ms, width, label="stoker" if library == "stoker" else "torch.utils.data")
        base = ms[0]
        for bar, value in zip(bars, ms, strict=True):
            where = (bar.get_x() + bar.get_width() / 2, value)
            text = f"{value:.0f} ms\n{base / value:.2f}x"
            ax.annotate(text, where, ha="center", va="bottom", fontsize=8)
    compute = f"simulated step compute ({config.step_ms:g} ms)"
    ax.axhline(config.step_ms, color="grey", linestyle="--", linewidth=1, label=compute)
    ax.set_xticks(
        [s.number for s in stages],
        [f"{s.number}. {s.title}" for s in stages],
        fontsize=8,
        rotation=12,
    )
    ax.set_ylabel("ms per training step")
    ax.set_title(
        f"stoker demo: {config.describe()}, {os.cpu_count()} CPUs",
        fontsize=10,
    )
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    ax.margins(y=0.15)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def busy_note(results: dict[tuple[int, str], Timing]) -> str | None:
    """A warning when other processes were busy during some runs, else None."""
    busy = [
        t.other_cpus
        for t in results.values()
        if t.other_cpus is not None and t.other_cpus > BUSY_CPUS
    ]
    if not busy:
        return None
    return (
        f"note: other processes kept up to {max(busy):.1f} CPUs busy during {len(busy)} of the "
        f"{len(results)} runs; those figures are disturbed. Rerun on a quiet machine."
    )
