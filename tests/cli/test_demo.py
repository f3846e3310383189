"""``stoker demo``: the staged comparison, its cache, its plot and its pieces."""

from __future__ import annotations

import os
import re
import sys

import numpy as np
import pytest

pytest.importorskip("PIL", reason="the demo writes and decodes JPEGs with Pillow (the image extra)")

from stoker._proc import usable_cpus
from stoker.cli import demo as demo_cli
from stoker.cli import main
from stoker.cli.demo.cache import build as build_cache

STAGES = (
    "1. naive: Pillow, file per sample, main process",
    "2. + 2 workers, pin_memory, persistent",
    "3. + packed shards via mmap, stoker.vision decode",
    "4. + prefetch_factor=4, MixUp collate_fn",
)


def _rows(out: str) -> dict[str, list[str]]:
    """The final table's rows by stage title, each split into its numbers."""
    rows = {}
    for title in STAGES:
        line = next(line for line in out.splitlines() if line.startswith(title))
        rows[title] = line[len(title) :].replace("*", " ").split()  # * marks a disturbed run
    return rows


def test_quick_demo_with_torch_prints_every_stage_and_saves_the_plot(tmp_path, capsys) -> None:
    pytest.importorskip("torch", reason="the reference rows need torch.utils.data")
    plot = tmp_path / "stages.png"
    assert main(["demo", "--quick", "--cache", str(tmp_path / "cache"), "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "building 96 synthetic 128x96 JPEGs" in out
    for number in (1, 2, 3, 4):
        for library in ("stoker", "torch"):
            line = rf"^  stage {number} {library} +\d+\.\d ms/step +\d+\.\d\dx  "
            line += r"\(waiting for data \d+% of the step\)"
            assert re.search(line, out, re.MULTILINE), (number, library)
    header = next(line for line in out.splitlines() if line.startswith("stage "))
    assert "stoker ms/step" in header and "torch ms/step" in header and "stoker vs torch" in header
    rows = _rows(out)
    for title, cells in rows.items():
        assert len(cells) == 7, (
            title,
            cells,
        )  # stoker ms, speed-up, wait; torch ms, speed-up, wait; ratio
        stoker_ms, torch_ms = float(cells[0]), float(cells[3])
        assert stoker_ms >= 5.0 and torch_ms >= 5.0  # never faster than the simulated 5 ms step
        # ratios come from unrounded times; the printed ms carry one decimal
        assert float(cells[6].rstrip("x")) == pytest.approx(torch_ms / stoker_ms, rel=0.03)
        for ms, speedup, base in (
            (stoker_ms, cells[1], rows[STAGES[0]][0]),
            (torch_ms, cells[4], rows[STAGES[0]][3]),
        ):
            assert float(speedup.rstrip("x")) == pytest.approx(float(base) / ms, rel=0.03)
    assert rows[STAGES[0]][1] == "1.00x" and rows[STAGES[0]][4] == "1.00x"
    assert "pin_memory: " in out
    assert f"plot: {plot}" in out
    assert plot.read_bytes().startswith(b"\x89PNG")
    assert re.search(r"^done in \d+\.\d s$", out, re.MULTILINE)


def test_quick_demo_reuses_its_cache_and_runs_without_torch(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("STOKER_CACHE", str(tmp_path))
    assert main(["demo", "--quick", "--no-torch"]) == 0
    first = capsys.readouterr().out
    assert "building 96 synthetic" in first
    home = tmp_path / "demo" / demo_cli.DemoConfig.quick().name
    assert (home / "packed" / "manifest.json").is_file()
    assert len(list((home / "images").glob("*/*.jpg"))) == 96
    assert (tmp_path / "demo" / "demo.png").is_file()  # the default plot goes to the cache folder

    assert main(["demo", "--quick", "--no-torch"]) == 0
    second = capsys.readouterr().out
    assert "building" not in second  # reused
    assert f"; {usable_cpus()} CPUs\n" in second  # the CPUs it may use, as stoker bench says
    header = next(line for line in second.splitlines() if line.startswith("stage "))
    assert "stoker ms/step" in header and "torch" not in header
    assert all(len(cells) == 3 for cells in _rows(second).values())


def test_a_half_built_cache_is_rebuilt(tmp_path, capsys) -> None:
    config = demo_cli.DemoConfig.quick()
    home = tmp_path / config.name
    (home / "images").mkdir(parents=True)  # no manifest: an interrupted build
    data = build_cache(str(tmp_path), config, print)
    assert "building" in capsys.readouterr().out
    assert data.built_s > 0 and len(data.paths) == config.images
    assert all(os.path.isfile(p) for p in data.paths)
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]  # no scratch folder left


def test_without_matplotlib_the_demo_says_what_to_install(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    assert main(["demo", "--quick", "--no-torch", "--cache", str(tmp_path)]) == 0
    assert (
        "plot: skipped, it needs matplotlib: pip install 'stoker[cli]'" in capsys.readouterr().out
    )
    assert not (tmp_path / "demo.png").exists()


# --------------------------------------------------------------------------- the pieces


def test_mixup_collate_normalises_then_mixes_the_batch(monkeypatch) -> None:
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (4, 3, 6, 5), dtype=np.uint8)
    samples = [(pixels[i], label) for i, label in enumerate([0, 2, 1, 2])]
    mean = np.array([0.485, 0.456, 0.406], np.float32).reshape(3, 1, 1)
    std = np.array([0.229, 0.224, 0.225], np.float32).reshape(3, 1, 1)
    normalised = (pixels / np.float32(255) - mean) / std
    perm = np.array([2, 0, 3, 1])
    monkeypatch.setattr(np.random, "beta", lambda a, b: 0.75)
    monkeypatch.setattr(np.random, "permutation", lambda n: perm)
    images, targets = demo_cli.MixUpCollate(classes=3)(samples)
    assert images.shape == (4, 3, 6, 5) and images.dtype == np.float32
    np.testing.assert_allclose(
        images, 0.75 * normalised + 0.25 * normalised[perm], rtol=1e-5, atol=1e-5
    )
    expected = np.zeros((4, 3), np.float32)
    for i, (label, other) in enumerate(
        zip([0, 2, 1, 2], np.array([0, 2, 1, 2])[perm], strict=True)
    ):
        expected[i, label] += 0.75
        expected[i, other] += 0.25
    np.testing.assert_allclose(targets, expected)


def test_mixup_collate_gives_torch_tensors_for_torch() -> None:
    torch = pytest.importorskip("torch", reason="as_torch=True returns torch tensors")
    images, targets = demo_cli.MixUpCollate(classes=2, as_torch=True)(
        [(np.zeros((3, 2, 2), np.uint8), 1)]
    )
    assert isinstance(images, torch.Tensor) and isinstance(targets, torch.Tensor)
    assert tuple(images.shape) == (1, 3, 2, 2) and targets.tolist() == [[0.0, 1.0]]


def test_naive_dataset_decodes_resizes_and_normalises(tmp_path) -> None:
    from PIL import Image

    path = tmp_path / "grey.png"
    Image.new("RGB", (30, 20), (128, 64, 255)).save(path)
    image, label = demo_cli.NaiveJpegDataset([str(path)], [7], size=12)[0]
    assert image.shape == (3, 12, 12) and image.dtype == np.float32 and label == 7
    expected = (np.array([128, 64, 255]) / 255 - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]
    np.testing.assert_allclose(image[:, 5, 5], expected, rtol=1e-5)


def test_rounds_alternate_the_order_and_the_table_gives_each_cells_median(tmp_path, capsys) -> None:
    pytest.importorskip("torch", reason="the alternating order needs the torch reference")
    cache = str(tmp_path / "cache")
    assert main(["demo", "--quick", "--rounds", "3", "--cache", cache, "--no-torch"]) == 0
    out = capsys.readouterr().out
    for number in (1, 2, 3):
        for stage in (1, 2, 3, 4):
            assert re.search(rf"^  round {number}/3 stage {stage} stoker +\d", out, re.MULTILINE)
    assert "each cell: the median of 3 rounds, the libraries' order alternating." in out
    assert main(["demo", "--quick", "--rounds", "2", "--cache", cache]) == 0
    out = capsys.readouterr().out
    runs = re.findall(r"^  round (\d)/2 stage 1 (stoker|torch)", out, re.MULTILINE)
    assert runs == [("1", "stoker"), ("1", "torch"), ("2", "torch"), ("2", "stoker")]
    note = re.search(r"stoker vs torch per round: (.*)\.$", out, re.MULTILINE)
    assert note is not None
    spans = re.findall(r"stage (\d) (\d+\.\d\d)-(\d+\.\d\d)x", note.group(1))
    assert [s[0] for s in spans] == ["1", "2", "3", "4"]
    assert all(float(low) <= float(high) for _, low, high in spans)
    with pytest.raises(SystemExit):
        main(["demo", "--quick", "--rounds", "0"])
    assert "--rounds" in capsys.readouterr().err


def test_the_median_run_is_a_real_run_and_the_ratio_spans_every_round() -> None:
    from stoker.cli.demo.report import median_results, rounds_note
    from stoker.cli.demo.stages import Timing

    def t(ms: float) -> Timing:
        return Timing(ms / 1e3, 0.5, None)

    rounds = [
        {(1, "stoker"): t(10), (1, "torch"): t(20)},
        {(1, "stoker"): t(30), (1, "torch"): t(15)},
        {(1, "stoker"): t(20), (1, "torch"): t(40)},
        {(1, "stoker"): t(12), (1, "torch"): t(24)},
    ]
    medians = median_results(rounds)
    assert medians[(1, "stoker")] == t(12) and medians[(1, "torch")] == t(20)  # lower middle
    assert rounds_note(rounds, ["stoker", "torch"]) == (
        "each cell: the median of 4 rounds, the libraries' order alternating; "
        "stoker vs torch per round: stage 1 0.50-2.00x."
    )
    assert rounds_note(rounds[:1], ["stoker", "torch"]) is None


def test_stages_where_both_loaders_use_every_cpu_are_named_as_cpu_bound() -> None:
    from stoker.cli.demo.report import cpu_bound_note
    from stoker.cli.demo.stages import Timing

    results = {
        (1, "stoker"): Timing(0.09, 0.8, 0.0, 1.0),
        (1, "torch"): Timing(0.10, 0.8, 0.0, 1.1),
        (3, "stoker"): Timing(0.027, 0.2, 0.0, 1.9),
        (3, "torch"): Timing(0.024, 0.1, 0.0, 1.8),
        (4, "stoker"): Timing(0.026, 0.2, 0.0, 1.95),
        (4, "torch"): Timing(0.027, 0.2, 0.0, None),  # not measured: not named
    }
    note = cpu_bound_note(results, 2)
    assert note is not None
    assert note.startswith(
        "note: the CPUs are the limit in stage 3 (stoker 1.9, torch 1.8): both loaders kept "
        "the 2 CPUs busy"
    )
    assert "stage 1" not in note and "stage 4" not in note
    assert "only says which spends less CPU per batch" in note
    assert cpu_bound_note(results, 4) is None  # 1.9 of 4 CPUs: the CPUs are not the limit


def test_background_load_counts_this_process_tree_as_its_own() -> None:
    import time as _time

    from stoker.tuning.background_load import BackgroundLoad

    with BackgroundLoad() as load:
        end = _time.process_time() + 0.3
        while _time.process_time() < end:
            pass
    if load.own_cpus is None:
        pytest.fail("/proc could not be read on this Linux machine")
    assert 0.7 <= load.own_cpus <= 1.3  # one busy thread: about one CPU
