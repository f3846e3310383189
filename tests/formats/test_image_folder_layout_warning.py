"""A root one level too high (``photos/`` over ``photos/train/<class>/`` and
``photos/val/<class>/``) is named in a warning, by ImageFolder and by ``stoker pack``; a
normal layout gives none."""

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


def _photos(tmp_path: Path, *, val: bool = False) -> Path:
    photos = tmp_path / "photos"
    names = ["train/cat/1.png", "train/dog/2.png", "train/dog/3.png"]
    names += ["val/cat/4.png", "val/dog/5.png"] if val else []
    for name in names:
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


def _expected_with_val(photos: Path) -> str:
    train = os.path.join(str(photos), "train")
    return (
        f"ImageFolder: {str(photos)!r} holds 2 class folders ('train', 'val') with no images "
        "of their own, only folders ('train' holds 'cat', 'dog'): every image in "
        f"{train!r} would get the one label of class 'train'. If those folders are the "
        f"classes, pass the folder that holds them: did you mean ImageFolder({train!r}) "
        f"(stoker pack {train} DST)?"
    )


def _pack(src: Path, dst: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(
        [sys.executable, "-m", "stoker.cli", "pack", str(src), str(dst), "--workers", "1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_image_folder_warns_when_its_only_class_holds_folders(tmp_path, caplog) -> None:
    photos = _photos(tmp_path)
    with caplog.at_level(logging.WARNING, logger="stoker"):
        folder = ImageFolder(photos)
    assert folder.classes == ["train"]  # still loads: a warning, not an error
    assert [r.getMessage() for r in caplog.records] == [_expected(photos)]


def test_stoker_pack_prints_the_same_warning(tmp_path) -> None:
    photos = _photos(tmp_path)
    result = _pack(photos, tmp_path / "packed")
    assert result.returncode == 0, result.stderr
    assert _expected(photos) in result.stderr.splitlines()
    assert "3 file(s) in 1 class(es)" in result.stdout


def test_train_and_val_under_the_root_are_named_in_a_warning(tmp_path, caplog) -> None:
    # the README's layout, photos/train/<class>/ and photos/val/<class>/, given photos/
    photos = _photos(tmp_path, val=True)
    with caplog.at_level(logging.WARNING, logger="stoker"):
        folder = ImageFolder(photos)
    assert folder.classes == ["train", "val"]  # still loads: a warning, not an error
    assert [r.getMessage() for r in caplog.records] == [_expected_with_val(photos)]
    result = _pack(photos, tmp_path / "packed")
    assert result.returncode == 0, result.stderr
    assert _expected_with_val(photos) in result.stderr.splitlines()
    assert "5 file(s) in 2 class(es)" in result.stdout


def test_classes_whose_images_are_all_in_subfolders_are_named_in_a_warning(
    tmp_path, caplog
) -> None:
    root = tmp_path / "root"
    for name in ("cat/a/1.png", "cat/b/2.png", "dog/a/3.png"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8, 6)).save(root / name)
    with caplog.at_level(logging.WARNING, logger="stoker"):
        ImageFolder(root)
    cat = os.path.join(str(root), "cat")
    assert [r.getMessage() for r in caplog.records] == [
        f"ImageFolder: {str(root)!r} holds 2 class folders ('cat', 'dog') with no images of "
        f"their own, only folders ('cat' holds 'a', 'b'): every image in {cat!r} would get the "
        "one label of class 'cat'. If those folders are the classes, pass the folder that "
        f"holds them: did you mean ImageFolder({cat!r}) (stoker pack {cat} DST)?"
    ]


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
