"""``stoker pack``: real JPEG folders, corrupt and empty inputs, non-ASCII names, file lists."""

from __future__ import annotations

import io
import json
import os
import sys
import zlib

import numpy as np
import pytest

from stoker.cli import main
from stoker.formats.packed import PackedDataset

Image = pytest.importorskip(
    "PIL.Image", reason="stoker pack checks images with Pillow (the 'image' extra)"
)


def write_jpeg(path, seed: int, size: tuple[int, int] = (40, 32)) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=85)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(buffer.getvalue())
    return buffer.getvalue()


@pytest.fixture
def image_folder(tmp_path) -> dict[str, bytes]:
    """A folder with three classes (one empty), non-ASCII names, a corrupt JPEG and a text file."""
    root = tmp_path / "src"
    files = {
        "chat/1.jpg": write_jpeg(root / "chat" / "1.jpg", 1),
        "chat/chat_été.jpg": write_jpeg(root / "chat" / "chat_été.jpg", 2),
        "chat/sub/3.jpg": write_jpeg(root / "chat" / "sub" / "3.jpg", 3),
        "猫/猫.jpg": write_jpeg(root / "猫" / "猫.jpg", 4),
        "猫/b.JPG": write_jpeg(root / "猫" / "b.JPG", 5),
    }
    good = files["chat/1.jpg"]
    (root / "猫" / "truncated.jpg").write_bytes(good[: len(good) // 2])
    (root / "猫" / "zero.jpg").write_bytes(b"")
    (root / "猫" / "readme.txt").write_text("not an image")
    (root / "empty").mkdir()
    return files


def pack(*argv: str) -> int:
    return main(["pack", *map(str, argv)])


def test_packs_an_image_folder_skipping_and_reporting_corrupt_files(
    tmp_path, image_folder, capsys
) -> None:
    dst = tmp_path / "dst"
    assert pack(tmp_path / "src", dst, "--workers", "3", "--verify") == 0
    out = capsys.readouterr().out
    assert "class 'empty' has no images" in out
    assert "skipped 2 unreadable or corrupt file(s)" in out
    assert "猫/truncated.jpg: corrupt image: OSError: image file is truncated" in out
    assert "猫/zero.jpg: empty file" in out
    assert "packed 5 record(s)" in out and "verified every record's checksum" in out
    skipped = (dst / "skipped.txt").read_text(encoding="utf-8").splitlines()
    assert [line.split("\t")[0] for line in skipped] == ["猫/truncated.jpg", "猫/zero.jpg"]
    ds = PackedDataset(dst, verify="open")
    assert ds.classes == ["chat", "empty", "猫"]  # sorted, the empty class keeps its label
    assert ds.metadata["skipped"] == 2 and ds.metadata["packed_by"] == "stoker pack"
    # torchvision's order: classes, then sorted walk; every record is the file's bytes, byte for
    # byte
    keys = [ds.key(i) for i in range(len(ds))]
    assert keys == ["chat/1.jpg", "chat/chat_été.jpg", "chat/sub/3.jpg", "猫/b.JPG", "猫/猫.jpg"]
    for i, key in enumerate(keys):
        data, label = ds[i]
        assert bytes(data) == image_folder[key]
        assert label == ds.class_to_idx[key.split("/")[0]]
        with Image.open(io.BytesIO(data)) as image:
            assert image.size == (40, 32)


def test_the_plain_progress_line_is_used_without_tqdm(
    tmp_path, image_folder, capsys, monkeypatch
) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm -> ImportError
    assert pack(tmp_path / "src", tmp_path / "dst") == 0
    err = capsys.readouterr().err
    assert "stoker pack: 7/7 files (100%), 2 skipped" in err


def test_small_shards_and_an_existing_destination(tmp_path, image_folder, capsys) -> None:
    dst = tmp_path / "dst"
    assert pack(tmp_path / "src", dst, "--shard-size", "2KB", "--check", "verify") == 0
    ds = PackedDataset(dst)
    assert len(ds.shard_paths) >= 2
    assert ds.metadata["check"] == "verify"
    assert (
        ds.metadata["skipped"] == 1
    )  # verify() cannot see the truncated JPEG; the empty file is still refused
    capsys.readouterr()
    assert pack(tmp_path / "src", dst) == 1
    assert (
        "is not empty (it holds a packed dataset); choose an empty directory, or pass --overwrite"
        in capsys.readouterr().err
    )
    assert pack(tmp_path / "src", dst, "--overwrite") == 0
    assert len(PackedDataset(dst).shard_paths) == 1


def test_an_empty_source_folder_is_a_clear_error(tmp_path, capsys) -> None:
    (tmp_path / "src").mkdir()
    assert pack(tmp_path / "src", tmp_path / "dst") == 1
    err = capsys.readouterr().err
    assert "stoker pack: error: SRC" in err and "is empty: expected one subfolder per class" in err
    assert not (tmp_path / "dst").exists()


def test_class_folders_without_images_or_no_class_folders_are_clear_errors(
    tmp_path, capsys
) -> None:
    (tmp_path / "a" / "cat").mkdir(parents=True)
    (tmp_path / "a" / "cat" / "notes.txt").write_text("x")
    assert pack(tmp_path / "a", tmp_path / "dst") == 1
    assert "found no images" in capsys.readouterr().err
    write_jpeg(tmp_path / "flat" / "1.jpg", 0)
    assert pack(tmp_path / "flat", tmp_path / "dst") == 1
    err = capsys.readouterr().err
    assert "no class folders" in err and "pass --files LIST.txt" in err
    assert pack(tmp_path / "missing", tmp_path / "dst") == 2
    assert "does not exist" in capsys.readouterr().err


def test_every_file_unreadable_packs_nothing_and_says_so(tmp_path, capsys) -> None:
    (tmp_path / "src" / "cat").mkdir(parents=True)
    (tmp_path / "src" / "cat" / "bad.jpg").write_bytes(b"\xff\xd8 not really")
    assert pack(tmp_path / "src", tmp_path / "dst") == 1
    captured = capsys.readouterr()
    assert "none of the 1 file(s) could be read; nothing was packed" in captured.err
    assert "cat/bad.jpg: corrupt image: UnidentifiedImageError" in captured.out
    assert not (tmp_path / "dst" / "manifest.json").exists()


def test_a_file_list_with_and_without_classes(tmp_path, image_folder, capsys) -> None:
    src = tmp_path / "src"
    listing = tmp_path / "list.txt"
    listing.write_text(
        f"# comment\n猫/猫.jpg\tb\nchat/1.jpg\ta\n{src / 'chat' / 'chat_été.jpg'}\tb\n\n",
        encoding="utf-8",
    )
    assert pack(src, tmp_path / "labelled", "--files", listing) == 0
    ds = PackedDataset(tmp_path / "labelled")
    assert ds.classes == ["a", "b"]
    assert [ds.key(i) for i in range(3)] == [
        "猫/猫.jpg",
        "chat/1.jpg",
        "chat/chat_été.jpg",
    ]  # the list's order
    assert [ds[i][1] for i in range(3)] == [1, 0, 1]
    plain = tmp_path / "plain.txt"
    plain.write_text("chat/1.jpg\n猫/truncated.jpg\nmissing.jpg\n", encoding="utf-8")
    assert pack(src, tmp_path / "unlabelled", "--files", plain) == 0
    out = capsys.readouterr().out
    assert "missing.jpg: unreadable: No such file or directory" in out
    ds = PackedDataset(tmp_path / "unlabelled")
    assert ds.classes is None and len(ds) == 1 and bytes(ds[0]) == image_folder["chat/1.jpg"]
    mixed = tmp_path / "mixed.txt"
    mixed.write_text("chat/1.jpg\ta\nchat/sub/3.jpg\n", encoding="utf-8")
    assert pack(src, tmp_path / "mixed", "--files", mixed) == 1
    assert "line 2 has no class but other lines do" in capsys.readouterr().err


def test_val_takes_the_class_mapping_of_train(tmp_path, image_folder, capsys) -> None:
    assert pack(tmp_path / "src", tmp_path / "train") == 0
    write_jpeg(tmp_path / "val" / "猫" / "v.jpg", 9)  # val has only the last class
    assert (
        pack(tmp_path / "val", tmp_path / "val_packed", "--classes-from", tmp_path / "train") == 0
    )
    val = PackedDataset(tmp_path / "val_packed")
    assert val.classes == ["chat", "empty", "猫"] and val[0][1] == 2
    mapping = tmp_path / "classes.json"
    mapping.write_text(json.dumps(["猫"]), encoding="utf-8")
    capsys.readouterr()
    assert pack(tmp_path / "src", tmp_path / "bad", "--classes-from", mapping) == 1
    assert "not in the given classes" in capsys.readouterr().err


def test_shard_sizes_parse_with_units() -> None:
    from stoker.cli.pack import parse_size

    assert parse_size("256MB") == 256_000_000
    assert parse_size("256MiB") == 256 * 2**20
    assert parse_size("1.5 GiB") == 3 * 2**29
    assert parse_size("4096") == 4096
    assert parse_size("64k") == 64_000
    import argparse

    with pytest.raises(
        argparse.ArgumentTypeError, match="a size needs a positive number and an optional unit"
    ):
        parse_size("lots")
    with pytest.raises(argparse.ArgumentTypeError, match="got '0MB'"):
        parse_size("0MB")


def test_a_saved_image_folder_index_is_used_instead_of_walking(tmp_path, image_folder) -> None:
    from stoker.formats.image_folder import ImageFolder

    index = tmp_path / "index.json"
    ImageFolder(tmp_path / "src").save_index(index)
    (tmp_path / "src" / "chat" / "added_later.jpg").write_bytes(
        image_folder["chat/1.jpg"]
    )  # not in the index
    assert pack(tmp_path / "src", tmp_path / "dst", "--index", index) == 0
    ds = PackedDataset(tmp_path / "dst")
    keys = [ds.key(i) for i in range(len(ds))]
    assert "chat/added_later.jpg" not in keys and keys[0] == "chat/1.jpg"
    assert ds.classes == ["chat", "empty", "猫"]


def test_pack_writes_format_version_2_with_a_manifest_checksum(tmp_path, image_folder) -> None:
    dst = tmp_path / "dst"
    assert pack(tmp_path / "src", dst) == 0
    with open(dst / "manifest.json") as f:
        manifest = json.load(f)
    assert manifest["version"] == 2
    body = {key: value for key, value in manifest.items() if key != "manifest_crc32"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    assert manifest["manifest_crc32"] == zlib.crc32(canonical.encode("ascii"))
