"""Folders with symbolic links: every file once per epoch, and never under another class's label."""

from __future__ import annotations

import collections
import json
import os
from pathlib import Path

import pytest

from stoker import DatasetError
from stoker.formats.image_folder import ImageFolder
from stoker.formats.tar import TarShards, write_tar_shards
from stoker.formats.text import JsonLines, TextLines

Image = pytest.importorskip("PIL.Image", reason="the ImageFolder cases write images with Pillow")


@pytest.fixture(autouse=True)
def no_topology_in_the_environment(monkeypatch) -> None:
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


def looped_tree(root: Path, write_one) -> Path:
    """root/a/<file>, root/b/sub/<file>, with links to the root, to a parent and to a sibling."""
    write_one(root / "a", "first")
    write_one(root / "b" / "sub", "second")
    os.symlink("..", root / "a" / "to_root")
    os.symlink("..", root / "b" / "sub" / "loop")
    os.symlink("../a", root / "b" / "to_a")
    return root


def write_lines(folder: Path, stem: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{stem}.txt").write_text(f"{stem} 1\n{stem} 2\n")
    with open(folder / f"{stem}.jsonl", "w") as f:
        f.writelines(json.dumps({"file": stem, "line": n}) + "\n" for n in (1, 2))


def write_tar(folder: Path, stem: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    samples = [{"__key__": f"{stem}{i}", "txt": f"{stem} {i}"} for i in range(3)]
    write_tar_shards(samples, str(folder / f"{stem}-%d.tar"))


def test_text_lines_read_every_line_once_despite_symlink_loops(tmp_path: Path) -> None:
    root = looped_tree(tmp_path / "data", write_lines)
    ds = TextLines(root)
    assert sorted(os.path.relpath(p, root) for p in ds.files if p.endswith(".txt")) == [
        "a/first.txt",
        "b/sub/second.txt",
    ]
    lines = list(TextLines(str(root)))
    assert collections.Counter(line for line in lines if not line.startswith("{")) == {
        "first 1": 1,
        "first 2": 1,
        "second 1": 1,
        "second 2": 1,
    }


def test_json_lines_read_every_record_once_despite_symlink_loops(tmp_path: Path) -> None:
    root = looped_tree(tmp_path / "data", write_lines)
    ds = JsonLines(str(root))
    assert [os.path.relpath(p, root) for p in ds.files] == ["a/first.jsonl", "b/sub/second.jsonl"]
    records = [(r["file"], r["line"]) for r in ds]
    assert sorted(records) == [("first", 1), ("first", 2), ("second", 1), ("second", 2)]


def test_tar_shards_read_every_sample_once_despite_symlink_loops(tmp_path: Path) -> None:
    root = looped_tree(tmp_path / "data", write_tar)
    ds = TarShards(str(root))
    assert [os.path.relpath(p, root) for p in ds.shards] == ["a/first-0.tar", "b/sub/second-0.tar"]
    keys = [s["__key__"] for s in ds]
    assert sorted(keys) == ["first0", "first1", "first2", "second0", "second1", "second2"]


@pytest.mark.timeout(60)  # glob.glob(recursive=True) runs for minutes on this tree
def test_a_recursive_glob_pattern_lists_every_file_once_despite_symlink_loops(
    tmp_path: Path, monkeypatch
) -> None:
    root = looped_tree(tmp_path / "data", write_lines)
    os.symlink("../sub", root / "b" / "sub" / "again")
    ds = JsonLines(f"{root}/**/*.jsonl")
    assert [os.path.relpath(p, root) for p in ds.files] == ["a/first.jsonl", "b/sub/second.jsonl"]
    assert len(list(ds)) == 4
    assert [os.path.relpath(p, root) for p in TextLines(f"{root}/b/**/s*.txt").files] == [
        "b/sub/second.txt"
    ]
    monkeypatch.chdir(root)
    assert list(TextLines("**/first.txt").files) == ["a/first.txt"]
    assert list(TextLines("*/first.txt").files) == ["a/first.txt"]


def test_a_linked_folder_outside_the_tree_is_read_once(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    write_lines(elsewhere, "outside")
    root = tmp_path / "data"
    root.mkdir()
    os.symlink(elsewhere, root / "one")
    os.symlink(elsewhere, root / "two")
    ds = JsonLines(str(root))
    assert [os.path.relpath(p, root) for p in ds.files] == ["one/outside.jsonl"]
    assert len(list(ds)) == 2


def image(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 6), (10, 20, 30)).save(path)


def test_a_link_to_the_root_inside_a_class_is_refused_instead_of_relabelling_other_classes(
    tmp_path: Path,
) -> None:
    root = tmp_path / "train"
    image(root / "cat" / "sub" / "1.png")
    os.symlink("..", root / "cat" / "sub" / "loop")  # a loop inside the class: walked once
    os.symlink("sub", root / "cat" / "zz_alias")
    image(tmp_path / "storage" / "dogs" / "2.png")
    os.symlink(tmp_path / "storage" / "dogs", root / "dog")  # a class folder kept elsewhere
    folder = ImageFolder(root)
    paths = [os.path.relpath(folder.path(i), root) for i in range(len(folder))]
    assert paths == ["cat/sub/1.png", "dog/2.png"] and folder.targets.tolist() == [0, 1]

    os.symlink("..", root / "cat" / "everything")
    with pytest.raises(DatasetError) as caught:
        ImageFolder(root)
    text = str(caught.value)
    assert f"{root}/cat/everything" in text and "class 'cat'" in text
    assert "the dataset root" in text and "Remove or replace the link." in text


def test_a_link_into_another_class_is_refused_whichever_class_comes_first(tmp_path: Path) -> None:
    for first, second in (("ant", "zebra"), ("zebra", "ant")):
        root = tmp_path / f"{first}-links"
        image(root / first / "1.png")
        image(root / second / "sub" / "1.png")
        os.symlink(f"../{second}/sub", root / first / "borrowed")
        with pytest.raises(DatasetError) as caught:
            ImageFolder(root)
        text = str(caught.value)
        assert f"class {first!r}" in text and f"class {second!r}" in text, text
        assert "borrowed" in text


def test_a_fifo_in_a_folder_is_left_out_with_a_warning_instead_of_blocking(
    tmp_path: Path, caplog
) -> None:
    write_lines(tmp_path / "data", "real")
    os.mkfifo(tmp_path / "data" / "pipe.jsonl")
    with caplog.at_level("WARNING", logger="stoker"):
        ds = JsonLines(str(tmp_path / "data"))
    assert [os.path.basename(p) for p in ds.files] == ["real.jsonl"]
    assert len(list(ds)) == 2
    assert (
        f"left out {str(tmp_path / 'data' / 'pipe.jsonl')!r}: it is a FIFO, socket or device"
        in caplog.text
    )
