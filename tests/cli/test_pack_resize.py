"""``stoker pack --max-side/--quality``: real JPEG and PNG files, resized and re-encoded."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest

from stoker.cli import main
from stoker.formats.packed import PackedDataset

Image = pytest.importorskip(
    "PIL.Image", reason="stoker pack resizes images with Pillow (the 'image' extra)"
)


def photo(width: int, height: int, seed: int = 0) -> np.ndarray:
    """Smooth gradients plus a little noise: a picture JPEG encodes like a photo."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    waves = np.stack([np.sin(xx * f + yy * f / 2) for f in (0.01, 0.02, 0.03)], axis=-1)
    noise = rng.integers(-10, 11, waves.shape)
    return np.clip(waves * 100 + 128 + noise, 0, 255).astype(np.uint8)


def write_image(path, pixels: np.ndarray, mode: str | None = None, **save) -> bytes:
    image = Image.fromarray(pixels) if mode is None else Image.fromarray(pixels).convert(mode)
    buffer = io.BytesIO()
    fmt = "PNG" if str(path).endswith(".png") else "JPEG"
    image.save(buffer, format=fmt, **({"quality": 92} if fmt == "JPEG" else {}), **save)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(buffer.getvalue())
    return buffer.getvalue()


def decoded(data) -> Image.Image:
    image = Image.open(io.BytesIO(bytes(data)))
    image.load()
    return image


def pack(*argv: object) -> int:
    return main(["pack", *map(str, argv)])


@pytest.fixture
def folder(tmp_path) -> dict[str, bytes]:
    """A 1600x1200 and a 300x200 JPEG in two classes, and one more small one."""
    root = tmp_path / "src"
    return {
        "big/large.jpg": write_image(root / "big" / "large.jpg", photo(1600, 1200, 1)),
        "big/small.jpg": write_image(root / "big" / "small.jpg", photo(300, 200, 2)),
        "tiny/a.jpg": write_image(root / "tiny" / "a.jpg", photo(64, 48, 3)),
    }


def records(path) -> list[tuple[str, bytes, int]]:
    ds = PackedDataset(path, verify="open")
    return [(ds.key(i), bytes(ds[i][0]), ds[i][1]) for i in range(len(ds))]


def test_max_side_shrinks_large_images_and_keeps_small_ones_byte_for_byte(
    tmp_path, folder, capsys
) -> None:
    plain, resized = tmp_path / "plain", tmp_path / "resized"
    assert pack(tmp_path / "src", plain) == 0
    assert pack(tmp_path / "src", resized, "--max-side", "500", "--quality", "85") == 0
    out = capsys.readouterr().out
    assert "longer sides above 500 px shrunk to 500, JPEG quality 85" in out
    assert "re-encoded 1 image(s)" in out
    before, after = records(plain), records(resized)
    # the same records, in the same order, with the same labels
    assert [(k, label) for k, _, label in after] == [(k, label) for k, _, label in before]
    got = {key: data for key, data, _ in after}
    large = decoded(got["big/large.jpg"])
    assert large.format == "JPEG" and large.size == (500, 375) and large.mode == "RGB"
    assert len(got["big/large.jpg"]) < len(folder["big/large.jpg"]) / 4
    # the pixels are the picture's, shrunk (not some other image)
    reference = np.asarray(Image.fromarray(photo(1600, 1200, 1)).resize((500, 375)), np.float32)
    assert np.abs(np.asarray(large, np.float32) - reference).mean() < 6
    assert got["big/small.jpg"] == folder["big/small.jpg"]
    assert got["tiny/a.jpg"] == folder["tiny/a.jpg"]
    meta = PackedDataset(resized).metadata
    assert meta["resize"] == {"max_side": 500, "quality": 85, "reencoded": 1}
    assert "resize" not in PackedDataset(plain).metadata


def test_max_side_alone_encodes_at_quality_90(tmp_path, folder) -> None:
    assert pack(tmp_path / "src", tmp_path / "d90", "--max-side", "500") == 0
    assert pack(tmp_path / "src", tmp_path / "d50", "--max-side", "500", "--quality", "50") == 0
    assert PackedDataset(tmp_path / "d90").metadata["resize"]["quality"] == 90
    big90 = dict((k, d) for k, d, _ in records(tmp_path / "d90"))["big/large.jpg"]
    big50 = dict((k, d) for k, d, _ in records(tmp_path / "d50"))["big/large.jpg"]
    assert len(big50) < len(big90)  # the quality reaches the encoder


def test_quality_alone_reencodes_every_jpeg_at_the_same_size(tmp_path, folder, capsys) -> None:
    dst = tmp_path / "dst"
    assert pack(tmp_path / "src", dst, "--quality", "40") == 0
    assert "every JPEG re-encoded at quality 40" in capsys.readouterr().out
    for key, data, _ in records(dst):
        assert data != folder[key]
        assert decoded(data).size == decoded(folder[key]).size
        assert len(data) < len(folder[key])  # quality 40 against the sources' 92
    assert PackedDataset(dst).metadata["resize"] == {
        "max_side": None,
        "quality": 40,
        "reencoded": 3,
    }


def test_packed_resized_images_train_with_decode_image(tmp_path, folder) -> None:
    from stoker.vision import DecodeImage, train_transform

    dst = tmp_path / "dst"
    assert pack(tmp_path / "src", dst, "--max-side", "500", "--quality", "90") == 0
    ds = PackedDataset(dst, transform=DecodeImage(train_transform(224)))
    assert len(ds) == 3
    for i in range(len(ds)):
        image, label = ds[i]
        image = np.asarray(image)
        assert image.shape == (3, 224, 224) and image.dtype == np.float32
        assert np.isfinite(image).all() and image.std() > 0
        assert label == PackedDataset(dst).class_to_idx[ds.key(i).split("/")[0]]


@pytest.mark.parametrize(
    ("content", "check", "reason"),
    [
        ("truncated", "none", "corrupt image: OSError: image file is truncated"),
        ("random", "none", "corrupt image: UnidentifiedImageError: cannot identify image file"),
        ("random", "decode", "corrupt image: UnidentifiedImageError: cannot identify image file"),
    ],
)
def test_a_corrupt_jpeg_is_reported_by_name(
    tmp_path, folder, capsys, content, check, reason
) -> None:
    bad = tmp_path / "src" / "big" / "broken.jpg"
    if content == "truncated":
        whole = folder["big/large.jpg"]
        bad.write_bytes(whole[: len(whole) // 2])
    else:
        bad.write_bytes(np.random.default_rng(0).integers(0, 256, 5000, np.uint8).tobytes())
    dst = tmp_path / "dst"
    assert pack(tmp_path / "src", dst, "--max-side", "500", "--check", check) == 0
    out = capsys.readouterr().out
    assert "skipped 1 unreadable or corrupt file(s)" in out
    assert f"  big/broken.jpg: {reason}" in out  # the file, as the check's report names it
    skipped = (dst / "skipped.txt").read_text(encoding="utf-8")
    assert skipped.startswith(f"big/broken.jpg\t{reason}")
    assert [key for key, _, _ in records(dst)] == ["big/large.jpg", "big/small.jpg", "tiny/a.jpg"]


def test_rgba_png_and_exif_rotated_jpeg_come_out_rgb_and_upright(tmp_path) -> None:
    root = tmp_path / "src"
    rgba = np.concatenate([photo(800, 600, 4), np.full((600, 800, 1), 128, np.uint8)], axis=-1)
    write_image(root / "x" / "alpha.png", rgba)
    pixels = photo(1000, 600, 5)
    pixels[:100, :100] = (255, 0, 0)  # a red top-left corner, as stored
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation 6: shown rotated 90 degrees clockwise
    write_image(root / "x" / "rotated.jpg", pixels, exif=exif.tobytes())
    write_image(root / "x" / "palette.png", photo(700, 700, 6), mode="P")
    write_image(root / "x" / "cmyk.jpg", photo(900, 300, 7), mode="CMYK")
    dst = tmp_path / "dst"
    assert pack(root, dst, "--max-side", "500") == 0
    got = {key: decoded(data) for key, data, _ in records(dst)}
    assert got["x/alpha.png"].format == "JPEG"
    assert (got["x/alpha.png"].mode, got["x/alpha.png"].size) == ("RGB", (500, 375))
    assert (got["x/palette.png"].mode, got["x/palette.png"].size) == ("RGB", (500, 500))
    assert (got["x/cmyk.jpg"].mode, got["x/cmyk.jpg"].size) == ("RGB", (500, 167))
    upright = got["x/rotated.jpg"]
    assert upright.mode == "RGB" and upright.size == (300, 500)  # 1000x600 stored, shown 600x1000
    assert upright.getexif().get(0x0112) is None  # no orientation left to apply twice
    # rotated clockwise: the stored top-left corner is now the top-right one
    corner = np.asarray(upright)[:20, -20:].reshape(-1, 3).mean(axis=0)
    assert corner[0] > 200 and corner[1] < 60 and corner[2] < 60


def test_files_that_are_not_jpeg_or_png_are_kept(tmp_path) -> None:
    root = tmp_path / "src"
    big_bmp = io.BytesIO()
    Image.fromarray(photo(800, 600, 8)).save(big_bmp, format="BMP")
    (root / "x").mkdir(parents=True)
    (root / "x" / "big.bmp").write_bytes(big_bmp.getvalue())
    (root / "x" / "notes.txt").write_bytes(b"not an image at all")
    (root / "files.txt").write_text("x/big.bmp\tx\nx/notes.txt\tx\n")
    dst = tmp_path / "dst"
    listed = ("--files", root / "files.txt", "--check", "none")
    assert pack(root, dst, *listed, "--max-side", "50") == 0
    got = {key: data for key, data, _ in records(dst)}
    assert got == {"x/big.bmp": big_bmp.getvalue(), "x/notes.txt": b"not an image at all"}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--max-side", "0"], "argument --max-side: must be 1 or more, got 0"),
        (["--max-side", "-3"], "argument --max-side: must be 1 or more, got -3"),
        (["--quality", "0"], "argument --quality: must be from 1 to 95, got 0"),
        (["--quality", "101"], "argument --quality: must be from 1 to 95, got 101"),
        (["--quality", "96"], "argument --quality: must be from 1 to 95, got 96"),
        (["--quality", "high"], "argument --quality: expected an integer, got 'high'"),
    ],
)
def test_bad_values_are_refused_naming_the_option(tmp_path, folder, capsys, argv, message) -> None:
    with pytest.raises(SystemExit) as exited:
        pack(tmp_path / "src", tmp_path / "dst", *argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "dst").exists()
