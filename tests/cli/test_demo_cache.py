"""``stoker demo``'s cache under concurrent runs, and what its report says about a run.

Two demos building the cache at once both succeed and read the same data; a published
cache is never deleted; private build folders do not outlive their process. The report
marks disturbed runs in the table and on the plot and defines every column it prints.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("PIL", reason="the demo writes its images with Pillow")

from stoker.cli.demo.cache import _private_prefix, _publish, build
from stoker.cli.demo.config import DemoConfig
from stoker.cli.demo.report import busy_note, collate_note, legend, save_plot, table
from stoker.cli.demo.stages import Stage, Timing

SRC = str(Path(__file__).resolve().parents[2] / "src")

# Waits for the go file, builds, then reads every file of the cache and every packed record.
_BUILDER = textwrap.dedent(
    """
    import hashlib, os, sys, time
    from stoker.cli.demo.cache import build
    from stoker.cli.demo.config import DemoConfig
    from stoker.formats.packed import PackedDataset
    root, go = sys.argv[1], sys.argv[2]
    while not os.path.exists(go):
        time.sleep(0.005)
    data = build(root, DemoConfig.quick(), lambda text: None)
    digest = hashlib.sha256()
    for path in data.paths:
        with open(path, "rb") as f:
            digest.update(f.read())
    for image, label in PackedDataset(data.packed, copy=True):
        digest.update(image)
        digest.update(bytes([label]))
    print(digest.hexdigest(), data.built_s > 0)
    """
)


def test_two_demos_building_the_cache_at_once_both_succeed_with_the_same_data(tmp_path) -> None:
    root, go = tmp_path / "cache", tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", _BUILDER, str(root), str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    go.touch()
    outputs = [run.communicate(timeout=240) for run in runs]
    for run, (_, err) in zip(runs, outputs, strict=True):
        assert run.returncode == 0, err
    digests = [out.split()[0] for out, _ in outputs]
    assert digests[0] == digests[1]
    assert sorted(os.listdir(root)) == [DemoConfig.quick().name]  # no private folder left
    again = build(str(root), DemoConfig.quick(), print)  # and the published cache is whole
    assert again.built_s == 0.0 and all(os.path.isfile(p) for p in again.paths)


def test_a_run_that_loses_the_race_keeps_the_winners_cache(tmp_path) -> None:
    config = DemoConfig.quick()
    data = build(str(tmp_path), config, print)
    home = os.path.dirname(data.folder)
    before = os.stat(data.paths[0]).st_ino
    late = tmp_path / f"{_private_prefix(config.name)}{os.getpid()}-late"
    (late / "images").mkdir(parents=True)
    _publish(str(late), home, data.paths, config.name)  # another run finished first
    assert os.stat(data.paths[0]).st_ino == before  # the published files were not touched
    assert late.is_dir()  # the loser's folder is the caller's to remove, not published


def test_build_folders_of_dead_runs_are_removed_and_live_ones_kept(tmp_path) -> None:
    config = DemoConfig.quick()
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    dead = tmp_path / f"{_private_prefix(config.name)}{int(child.stdout)}-x"
    alive = tmp_path / f"{_private_prefix(config.name)}{os.getppid()}-y"
    dead.mkdir()
    alive.mkdir()
    build(str(tmp_path), config, print)
    assert not dead.exists() and alive.is_dir()


# --------------------------------------------------------------------------- the report


def _results(busy_stage_2: bool) -> tuple[list[Stage], dict[tuple[int, str], Timing]]:
    stages = [Stage(n, f"stage number {n}", None, {}) for n in (1, 2, 3, 4)]
    results = {}
    for n in (1, 2, 3, 4):
        stoker_s = 0.15 if (n == 2 and busy_stage_2) else 0.1 / n
        results[(n, "stoker")] = Timing(stoker_s, 0.5, 1.4 if (n == 2 and busy_stage_2) else 0.0)
        results[(n, "torch")] = Timing(0.3 / n, 0.5, None)
    return stages, results


def test_the_table_marks_disturbed_runs_and_the_legend_defines_every_column() -> None:
    stages, results = _results(busy_stage_2=True)
    text = table(stages, results, ["stoker", "torch"])
    rows = text.splitlines()
    assert "150.0*" in rows[2] and "*" not in rows[1] + rows[3] + rows[4]
    for column in ("ms/step", "speed-up", "wait", "stoker vs torch"):
        assert column in rows[0]
    lines = legend(["stoker", "torch"], results).splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "ms/step", "speed-up", "wait", "stoker vs torch", "*",
    ]  # fmt: skip
    assert "speed-up vs stage 1 of the same loader" in lines[1]
    assert "*: disturbed run: other processes kept more than 0.3 CPUs busy" in lines[4]
    quiet = legend(["stoker"], _results(busy_stage_2=False)[1]).splitlines()
    assert [line.split(":")[0] for line in quiet] == ["ms/step", "speed-up", "wait"]


def test_notes_name_an_inverted_stage_and_explain_stage_1s_torch_gap() -> None:
    _, results = _results(busy_stage_2=True)
    note = busy_note(results)
    assert note is not None
    assert "during 1 of the 8 runs (marked *)" in note
    assert "stage 2 stoker came out slower than stage 1" in note
    assert busy_note(_results(busy_stage_2=False)[1]) is None
    gap = collate_note(results, 2)
    assert gap is not None and gap.startswith("note: stage 1 is 3.00x slower with torch, though")
    assert "the gap is not loading" in gap and "intra-op threads (2 here)" in gap
    even = {**results, (1, "torch"): Timing(0.105, 0.5, None)}
    assert collate_note(even, 2) is None


def test_the_plot_marks_disturbed_bars_and_says_what_speed_up_means(tmp_path, monkeypatch) -> None:
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib")
    import matplotlib.figure

    texts: list[str] = []
    real = matplotlib.figure.Figure.savefig

    def capture(fig, *args, **kwargs):
        texts.extend(t.get_text() for t in fig.texts)
        for ax in fig.axes:
            texts.extend(t.get_text() for t in ax.texts)
            texts.extend(p.get_hatch() or "" for p in ax.patches)
        return real(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", capture)
    stages, results = _results(busy_stage_2=True)
    plot = tmp_path / "demo.png"
    assert save_plot(str(plot), stages, results, ["stoker", "torch"], DemoConfig.quick())
    assert plot.read_bytes().startswith(b"\x89PNG") and os.listdir(tmp_path) == ["demo.png"]
    joined = "\n".join(texts)
    assert "speed-up vs stage 1 of the same loader" in joined
    assert "1 of 8 runs disturbed by other processes" in joined
    assert "150 ms\n0.67x\ndisturbed" in joined
    assert texts.count("//") == 1  # one hatched bar: the disturbed run
