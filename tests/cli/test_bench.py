"""``stoker bench``: the sweep's table, knee, memory, plot, HTML and JSON."""

from __future__ import annotations

import base64
import html
import json
import os
import sys
import textwrap
import time

import numpy as np
import pytest

from stoker.cli import main
from stoker.tuning import default_workers, sweep

# A dataset module written into the test's own folder, imported as MODULE:ATTR from there.
_MODULE = '''
import numpy as np

from stoker import get_worker_info

BALLAST_BYTES = 24 * 2**20
_ballast = []


class Squares:
    """Sample i: (float32[3, 8, 8] filled with i, i); workers each hold BALLAST_BYTES."""

    def __init__(self, length=512):
        self.length = length

    def __len__(self):
        return self.length

    def __getitem__(self, index):
        if get_worker_info() is not None and not _ballast:
            _ballast.append(np.ones(BALLAST_BYTES, dtype=np.uint8))  # private to the worker
        return np.full((3, 8, 8), index, dtype=np.float32), index


dataset = Squares()
empty = Squares(0)


def make_dataset():
    return Squares(256)


not_a_dataset = 42
'''

SAMPLE_BYTES = 3 * 8 * 8 * 4 + 8  # the image plus the int64 label


@pytest.fixture
def module(tmp_path, monkeypatch):
    """The name of a fresh dataset module importable from the (temporary) working directory."""
    name = f"bench_data_{os.getpid()}_{time.monotonic_ns()}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(_MODULE))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    yield name
    sys.modules.pop(name, None)


def _bench(*args: str) -> int:
    return main(["bench", *args, "--batches", "6", "--warmup", "1", "--batch-size", "16"])


# --------------------------------------------------------------------------- the command


def test_bench_prints_table_knee_and_writes_plot_and_html(module, tmp_path, capsys) -> None:
    plot, report = tmp_path / "sweep.png", tmp_path / "report.html"
    rc = _bench(f"{module}:dataset", "--workers", "0,2", "--plot", str(plot), "--html", str(report))
    out = capsys.readouterr().out
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].startswith(
        f"stoker bench: {module}:dataset (Squares, 512 samples), batch_size=16, 6 timed batches"
    )
    header = next(line for line in lines if line.lstrip().startswith("num_workers"))
    for column in (
        "prefetch",
        "batches/s",
        "samples/s",
        "vs 0 workers",
        "est. in flight",
        "peak memory",
    ):
        assert column in header
    rows = [line.split() for line in lines[lines.index(header) + 1 :][:2]]
    assert [row[:2] for row in rows] == [["0", "-"], ["2", "2"]]
    assert rows[0][4] == "1.00x"  # the single-process row is the reference
    knee = [line for line in lines if line.startswith("knee: ")]
    assert len(knee) == 1 and "num_workers=" in knee[0]
    assert sum(line.endswith(" *") for line in lines) == 1  # the knee's row is marked
    assert f"plot: {plot}" in out and f"report: {report}" in out
    png = plot.read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5_000
    page = report.read_text()
    assert page.startswith("<!DOCTYPE html>") and "<table>" in page
    assert html.escape(knee[0]) in page and page.count('<tr class="knee">') == 1
    embedded = page.split('src="data:image/png;base64,')[1].split('"')[0]
    assert base64.b64decode(embedded) == png  # the page carries the same plot, self-contained


def test_bench_json_has_every_setting_with_rates_and_memory(module, capsys) -> None:
    rc = _bench(f"{module}:dataset", "--workers", "0,2", "--prefetch", "2,4", "--json", "--no-plot")
    captured = capsys.readouterr()
    assert rc == 0
    document = json.loads(captured.out)  # nothing but JSON on stdout
    settings = [(p["num_workers"], p["prefetch_factor"]) for p in document["points"]]
    assert settings == [(0, None), (2, 2), (2, 4)]
    batch = 16 * SAMPLE_BYTES
    for point in document["points"]:
        assert point["batches"] == 6 and point["samples"] == 6 * 16
        assert point["samples_per_s"] == pytest.approx(point["batches_per_s"] * 16)
        assert point["batch_bytes"] == batch
        expected = batch * (
            point["num_workers"] * point["prefetch_factor"] if point["num_workers"] else 1
        )
        assert point["memory_estimate_bytes"] == expected
        assert point["peak_rss_bytes"] >= point["baseline_rss_bytes"] > 0
    assert document["knee"]["num_workers"] in (0, 2)
    assert document["knee_line"].startswith("knee: ")
    assert document["batch_size"] == 16 and document["dataset"] == "Squares, 512 samples"
    assert "plot" not in document


def test_peak_memory_counts_the_workers_private_memory(module) -> None:
    sys.path.insert(0, os.getcwd())
    data = __import__(module)
    result = sweep(data.dataset, batch_size=16, workers=[0, 2], batches=4, warmup=1)
    by_workers = {p.num_workers: p for p in result.points}
    # each of the two workers holds 24 MiB of its own; the trainer alone holds none of it
    assert by_workers[2].peak_above_baseline_bytes >= 2 * data.BALLAST_BYTES
    assert by_workers[0].peak_above_baseline_bytes < data.BALLAST_BYTES


def test_factory_and_thread_workers(module, capsys) -> None:
    rc = _bench(
        f"{module}:make_dataset", "--workers", "0,1", "--worker-mode", "thread", "--no-plot"
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "(Squares, 256 samples)" in out and "thread workers" in out
    assert "plot:" not in out


def test_default_workers_sweep_zero_and_powers_of_two(module, capsys) -> None:
    rc = _bench(f"{module}:dataset", "--json", "--no-plot")
    document = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert [p["num_workers"] for p in document["points"]] == list(default_workers())


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("no_such_module_xyz:data", "cannot import the module 'no_such_module_xyz'"),
        ("{module}:missing", "has no attribute 'missing'"),
        ("{module}:not_a_dataset", "not a dataset: it needs __getitem__ and __len__"),
        ("nowhere/at/all", "TARGET 'nowhere/at/all' is neither a directory"),
    ],
)
def test_bad_targets_say_what_to_pass(module, target, message, capsys) -> None:
    assert _bench(target.format(module=module)) == 2
    err = capsys.readouterr().err
    assert err.startswith("stoker bench: ") and message in err


def test_bad_options_are_refused(module, capsys) -> None:
    for args, message in (
        (["--batches", "0"], "argument --batches: must be 1 or more, got 0"),
        (["--warmup", "-1"], "argument --warmup: must be 0 or more, got -1"),
        (["--workers=0,-2"], "argument --workers: each value must be 0 or more, got 0,-2"),
        (["--prefetch", "2,0"], "argument --prefetch: each value must be 1 or more, got 2,0"),
        (["--size", "0"], "argument --size: must be 1 or more, got 0"),
        (
            ["--workers", "two"],
            "argument --workers: expected comma-separated integers such as 0,1,2,4, got 'two'",
        ),
    ):
        with pytest.raises(SystemExit) as exited:
            main(["bench", f"{module}:dataset", *args])
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("usage: stoker bench") and f"stoker bench: error: {message}\n" in err
    assert main(["bench", f"{module}:empty"]) == 1
    assert (
        f"stoker bench: {module}:empty is empty: there is nothing to load"
        in capsys.readouterr().err
    )


def test_without_matplotlib_the_plot_is_skipped_with_a_hint(
    module, tmp_path, capsys, monkeypatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    plot, report = tmp_path / "none.png", tmp_path / "r.html"
    rc = _bench(f"{module}:dataset", "--workers", "0", "--plot", str(plot), "--html", str(report))
    out = capsys.readouterr().out
    assert rc == 0
    assert "plot: skipped, the plot needs matplotlib: pip install 'stoker[cli]'" in out
    assert not plot.exists()
    assert "the plot needs matplotlib" in report.read_text()


def test_without_tqdm_progress_is_plain_lines(module, capsys, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm now raises ImportError
    rc = _bench(f"{module}:dataset", "--workers", "0,1", "--no-plot")
    err = capsys.readouterr().err
    assert rc == 0
    lines = err.splitlines()
    assert lines[0] == "  [1/2] workers=0: 7 batches ..."
    assert lines[1].startswith("  [1/2] num_workers=0: ") and lines[1].endswith(" samples/s")
    assert lines[2] == "  [2/2] workers=1 prefetch=2: 7 batches ..."
    assert lines[3].startswith("  [2/2] num_workers=1, prefetch_factor=2: ")


def test_image_folder_and_packed_directory_targets(tmp_path, capsys) -> None:
    pytest.importorskip("PIL", reason="image folders need Pillow (the image extra)")
    from PIL import Image

    folder, packed = tmp_path / "images", tmp_path / "packed"
    rng = np.random.default_rng(0)
    for i in range(40):
        (folder / "ab"[i % 2]).mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(
            folder / "ab"[i % 2] / f"{i}.jpg"
        )
    assert main(["pack", str(folder), str(packed)]) == 0
    capsys.readouterr()
    for target in (folder, packed):
        rc = main(["bench", str(target), "--workers", "0", "--batches", "2", "--warmup", "1",
                   "--batch-size", "8", "--size", "32", "--json", "--no-plot"])  # fmt: skip
        document = json.loads(capsys.readouterr().out)
        assert rc == 0
        assert document["points"][0]["batch_bytes"] == 8 * (32 * 32 * 3 + 8), (
            target
        )  # uint8 HWC + label
        assert (
            document["dataset"]
            == ("ImageFolder" if target == folder else "PackedDataset") + ", 40 samples"
        )


def test_every_derived_column_of_the_table_is_defined_under_it() -> None:
    from stoker.cli.bench.report import _COLUMNS, memory_note
    from stoker.tuning import SweepResult

    note = memory_note(SweepResult((), batch_size=1))
    plain = {"num_workers", "prefetch", "batches/s", "samples/s"}  # the settings and the rates
    for column in set(_COLUMNS) - plain:
        assert f"{column} = " in note, column
    assert "* = the knee" in note


@pytest.mark.parametrize("workers", ["0", "1"])
def test_a_corrupt_image_is_one_line_that_points_at_doctor(workers, tmp_path, capsys) -> None:
    pytest.importorskip("PIL", reason="image folders need Pillow (the image extra)")
    from PIL import Image

    folder = tmp_path / "images"
    for name in ("a/0.jpg", "a/1.jpg", "b/2.jpg"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (16, 12), (200, 40, 10)).save(folder / name)
    bad = folder / "b" / "3.jpg"
    bad.write_bytes((folder / "b" / "2.jpg").read_bytes()[:200])  # truncated
    rc = main(["bench", str(folder), "--workers", workers, "--batches", "2", "--warmup", "0",
               "--batch-size", "4", "--size", "8", "--no-shuffle"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 1
    assert "Traceback" not in err
    [line] = [line for line in err.splitlines() if not line.startswith("  [")]  # not progress
    assert line.startswith(f"stoker bench: {bad} is not a readable image (")
    assert line.endswith(
        f"; `stoker doctor {folder}` checks every file and lists the unreadable ones"
    )
