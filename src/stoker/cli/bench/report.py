"""How ``stoker bench`` shows a sweep: the table, the notes under it, a PNG plot, an HTML page."""

from __future__ import annotations

import base64
import html
import io

from stoker.cli._output import PLOT_INSTALL, pyplot
from stoker.tuning.background_load import BUSY_CPUS
from stoker.tuning.sweep import SweepResult

__all__ = ["PLOT_NEEDS", "format_table", "html_report", "load_note", "memory_note", "plot_png"]

PLOT_NEEDS = f"the plot needs matplotlib: {PLOT_INSTALL}"


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


def load_note(result: SweepResult) -> str | None:
    """A warning when other processes were busy during the timed batches, else None."""
    busy = [p for p in result.points if p.other_cpus is not None and p.other_cpus > BUSY_CPUS]
    if not busy:
        return None
    worst = max(busy, key=lambda p: p.other_cpus or 0.0)
    return (
        f"note: other processes kept up to {worst.other_cpus:.1f} CPUs busy during the timing "
        f"({len(busy)} of {len(result.points)} settings); the figures are disturbed, "
        "rerun on a quiet machine."
    )


def memory_note(result: SweepResult) -> str:
    batch = result.points[0].batch_bytes if result.points else 0
    return (
        'vs 0 workers = samples/s over that of num_workers=0 ("-" when it was not measured); '
        "* = the knee, the setting to use. "
        f"est. in flight = one batch ({_size(batch)}) x num_workers x prefetch_factor (one batch "
        "without workers); peak memory = the trainer's peak resident set + the workers' peak "
        "private memory; above idle = peak memory - the trainer's resident set before loading."
    )


def plot_png(result: SweepResult, title: str) -> bytes | None:
    """The sweep as a PNG: rate against num_workers, and memory estimate against measured."""
    plt = pyplot()
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


def html_report(result: SweepResult, title: str, png: bytes | None) -> str:
    knee, note = result.knee(), load_note(result)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in _COLUMNS)
    body = []
    for point, row in zip(result.points, _rows(result), strict=True):
        style = ' class="knee"' if point is knee else ""
        body.append(f"<tr{style}>" + "".join(f"<td>{html.escape(v)}</td>" for v in row) + "</tr>")
    image = (
        '<img alt="throughput and memory per setting" '
        f'src="data:image/png;base64,{base64.b64encode(png).decode()}">'
        if png is not None
        else f"<p><em>{html.escape(PLOT_NEEDS)}</em></p>"
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
<p>{html.escape(memory_note(result))}</p>
{"" if note is None else f"<p><em>{html.escape(note)}</em></p>"}
{image}
</body></html>
"""
