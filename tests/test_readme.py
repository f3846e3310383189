"""The README's Python examples run as written (its two commands are .ci/run's business).

The examples about image files run in a temporary folder that holds the README's layout,
``photos/train/<class>/*.jpg`` (tiny images), and its packed copy ``packed/train`` when
an example reads it.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pytest

README = Path(__file__).parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_the_readme_has_examples_and_both_commands() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(BLOCKS) >= 3
    assert (
        '.venv/bin/pip install -q -c .ci/constraints.txt -e ".[test]" && .venv/bin/python -m pytest'
        in text
    )
    assert (
        '.venv/bin/pip install -q -c .ci/constraints.txt -e ".[demo]" && .venv/bin/stoker demo'
        in text
    )
    ci = (README.parent / ".ci" / "run").read_text()
    assert (
        'python3 -m venv .venv && .venv/bin/pip install -q -c .ci/constraints.txt -e ".[test]" '
        "&& .venv/bin/python -m pytest" in ci
    )


def _photos(where: Path, *, val: bool = False) -> None:
    """The README's layout under ``where``: ``photos/train/<class>/*.jpg`` (and ``val``)."""
    image = pytest.importorskip("PIL.Image", reason="the example reads image files")
    rng = np.random.default_rng(0)
    for split in ("train", "val") if val else ("train",):
        for label, name in enumerate(("cat", "dog")):
            folder = where / "photos" / split / name
            folder.mkdir(parents=True)
            for i in range(3):
                pixels = rng.integers(0, 256, (24 + 4 * i, 32, 3), dtype=np.uint8)
                image.fromarray(pixels).save(folder / f"{label}{i:02d}.jpg")


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.splitlines()[0][:40])
def test_readme_example_runs(block: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if "import torch" in block or "stoker.torch" in block:
        pytest.importorskip(
            "torch", reason="this README example is the PyTorch one: it needs torch"
        )
    monkeypatch.chdir(tmp_path)
    if "photos/" in block:
        _photos(tmp_path)
        if "packed/train" in block:
            from stoker.cli import main

            assert main(["pack", "photos/train", "packed/train", "--workers", "2"]) == 0
    exec(compile(block, str(README), "exec"), {"__name__": "readme"})


def test_the_layout_warning_is_as_the_readme_says(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stoker.formats.image_folder import ImageFolder

    text = " ".join(README.read_text(encoding="utf-8").split())
    assert (
        "given `photos/` they would find two classes, `train` and `val`, and say so in a "
        "warning that asks whether `photos/train` was meant" in text
    )
    _photos(tmp_path, val=True)
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.WARNING, logger="stoker"):
        assert ImageFolder("photos").classes == ["train", "val"]
    [warning] = [r.getMessage() for r in caplog.records]
    assert "did you mean ImageFolder('photos/train')" in warning


def test_the_first_code_line_is_the_torch_import_and_no_extra_pins_a_release() -> None:
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11+")
    first = BLOCKS[0].splitlines()[0]
    assert first.split("#")[0].strip() == "from stoker.torch import DataLoader"
    assert "from torch.utils.data import DataLoader" in first  # what it replaces
    extras = tomllib.loads((README.parent / "pyproject.toml").read_text(encoding="utf-8"))
    requirements = extras["project"]["optional-dependencies"]
    # exact builds belong in .ci/constraints.txt; the extras users install only set floors
    pinned = [r for rs in requirements.values() for r in rs if "==" in r or "===" in r]
    assert pinned == []
    assert requirements["torch"] == ["torch>=2.6"]


def test_the_demo_time_says_what_it_depends_on() -> None:
    text = " ".join(README.read_text(encoding="utf-8").split())
    assert "depends above all on how many CPUs are idle" in text
    # both an idle and a busy machine's figure, as ranges and a measurement
    assert "about 45-90 s of timed stages, plus 10-15 s the first time" in text
    assert "several times that when other processes keep the CPUs busy" in text
