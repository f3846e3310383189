"""A core-only install (numpy alone): what needs an extra says which one, in a real process."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import stoker
from harness.hidden import env_hiding

SRC = str(Path(stoker.__file__).resolve().parents[1])
HIDDEN = ("PIL", "simplejpeg", "tqdm", "matplotlib", "torch")

DATASET = textwrap.dedent(
    """
    import numpy as np
    from stoker import ArrayDataset

    dataset = ArrayDataset(np.zeros((32, 3, 8, 8), dtype=np.float32), np.arange(32) % 2)
    """
)


@pytest.fixture
def core_only(tmp_path: Path) -> dict[str, str]:
    """As on a core-only install: every optional package fails to import."""
    return env_hiding(tmp_path / "hide", HIDDEN, path=[SRC])


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """An image folder; the files need not decode, nothing gets that far."""
    for name in ("cat", "dog"):
        (tmp_path / "images" / name).mkdir(parents=True)
        (tmp_path / "images" / name / "1.jpg").write_bytes(b"\xff\xd8\xff\xe0 not decoded")
    return tmp_path / "images"


def python(
    env: dict[str, str], *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=120
    )


def test_the_packages_are_hidden(core_only: dict[str, str]) -> None:
    for module in HIDDEN:
        result = python(core_only, "-c", f"import {module}")
        assert f"No module named '{module}'" in result.stderr


@pytest.mark.parametrize("command", ["doctor", "bench"])
def test_image_commands_name_the_image_extra(
    command: str, core_only: dict[str, str], folder: Path
) -> None:
    result = python(core_only, "-m", "stoker", command, str(folder))
    assert result.returncode == 2
    assert result.stderr == (
        f"stoker {command} needs Pillow to decode images: pip install 'stoker[image]'\n"
    )
    assert result.stdout == ""


def test_pack_names_the_image_extra(
    core_only: dict[str, str], folder: Path, tmp_path: Path
) -> None:
    result = python(core_only, "-m", "stoker", "pack", str(folder), str(tmp_path / "out"))
    assert result.returncode == 2
    assert result.stderr == (
        "stoker pack needs Pillow to check images (or pass --check none): "
        "pip install 'stoker[image]'\n"
    )
    assert not (tmp_path / "out").exists()


def test_bench_without_tqdm_and_matplotlib_runs_and_names_the_cli_extra(
    core_only: dict[str, str], tmp_path: Path
) -> None:
    (tmp_path / "data.py").write_text(DATASET)
    result = python(
        core_only,
        "-m",
        "stoker",
        "bench",
        "data.py:dataset",
        "--workers",
        "0",
        "--batches",
        "2",
        "--batch-size",
        "8",
        "--plot",
        "p.png",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "plot: skipped, the plot needs matplotlib: pip install 'stoker[cli]'" in result.stdout
    assert not (tmp_path / "p.png").exists()


def test_doctor_on_numpy_data_needs_no_extra(core_only: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "data.py").write_text(DATASET)
    result = python(core_only, "-m", "stoker", "doctor", "data.py:dataset", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.rstrip().splitlines()[-1].startswith("result: OK")


def test_import_stoker_torch_names_the_torch_extra(core_only: dict[str, str]) -> None:
    code = textwrap.dedent(
        """
        try:
            import stoker.torch
        except ModuleNotFoundError as exc:
            print(type(exc).__name__, exc.name, exc, sep="|")
        """
    )
    result = python(core_only, "-c", code)
    assert result.stdout == (
        "MissingExtraError|torch|stoker.torch needs torch: pip install 'stoker[torch]'\n"
    ), result.stderr


@pytest.mark.parametrize(
    ("code", "message"),
    [
        (
            "from stoker.formats.image_folder import ImageFolder; ImageFolder({folder!r})",
            "MissingExtraError: ImageFolder needs Pillow to decode images: pip install "
            "'stoker[image]'",
        ),
        (
            "from stoker.vision import DecodeImage; DecodeImage()",
            "MissingExtraError: DecodeImage needs Pillow to decode images: pip install "
            "'stoker[image]'",
        ),
    ],
    ids=["ImageFolder", "DecodeImage"],
)
def test_image_datasets_name_the_extra_when_built(
    code: str, message: str, core_only, folder
) -> None:
    result = python(core_only, "-c", code.format(folder=str(folder)))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == f"stoker.{message}"
