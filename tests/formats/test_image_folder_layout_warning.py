"""A root one level too high (``photos/`` over ``photos/train/<class>/``) is named in a
warning, by ImageFolder and by ``stoker pack``; a normal layout gives none."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("PIL", reason="the folders hold real images")

from PIL import Image

from stoker.cli import main
from stoker.formats.image_folder import ImageFolder

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _photos(tmp_path: Path) -> Path:
    photos = tmp_path / "photos"
    for name in ("train/cat/1.png", "train/dog/2.png", "train/dog/3.png"):
        (photos / name).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8, 6)).save(photos / name)
    return photos


def _expected(photos: Path) -> str:
    train = os.path.join(str(photos), "train")
    return (
        f"ImageFolder: {str(photos)!r} holds a single class folder, 'train', and it holds "
        "folders ('cat', 'dog'): every image would get the one label of class 'train'. If "
        "those folders are the classes, pass the folder that holds them: did you mean "
        f"ImageFolder({train!r}) (stoker pack {train} DST)?"
    )


def test_image_folder_warns_when_its_only_class_holds_folders(tmp_path, caplog) -> None:
    photos = _photos(tmp_path)
    with caplog.at_level(logging.WARNING, logger="stoker"):
        folder = ImageFolder(photos)
    assert folder.classes == ["train"]  # still loads: a warning, not an error
    assert [r.getMessage() for r in caplog.records] == [_expected(photos)]


def test_stoker_pack_prints_the_same_warning(tmp_path) -> None:
    photos = _photos(tmp_path)
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "stoker.cli",
            "pack",
            str(photos),
            str(tmp_path / "packed"),
            "--workers",
            "1",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert _expected(photos) in result.stderr.splitlines()
    assert "3 file(s) in 1 class(es)" in result.stdout


def test_a_folder_of_class_folders_gives_no_warning(tmp_path, caplog, capsys) -> None:
    train = _photos(tmp_path) / "train"
    (train / "dog" / "puppies").mkdir()  # subfolders of a class belong to it: fine
    Image.new("RGB", (8, 6)).save(train / "dog" / "puppies" / "4.png")
    with caplog.at_level(logging.WARNING, logger="stoker"):
        folder = ImageFolder(train)
        assert main(["pack", str(train), str(tmp_path / "packed"), "--workers", "1"]) == 0
    assert folder.classes == ["cat", "dog"] and len(folder) == 4
    assert caplog.records == []
    assert "ImageFolder" not in capsys.readouterr().err
