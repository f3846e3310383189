"""Images whose header declares far more pixels than they hold are refused before decoding."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from stoker import DatasetError
from stoker.formats.image_folder import ImageFolder
from stoker.formats.tar import TarShards, write_tar_shards
from stoker.vision import ImageDecodeError, decode_image

Image = pytest.importorskip("PIL.Image", reason="the images are written with Pillow")


def jpeg(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8)).save(buffer, "JPEG")
    return buffer.getvalue()


def refusal(width: int, height: int, limit: int) -> str:
    return (
        f"its header declares {width} x {height} pixels ({width * height:,}), more than the limit "
        f"of {limit:,} (max_pixels, by default Pillow's PIL.Image.MAX_IMAGE_PIXELS), so it was not "
        "decoded: it may be a decompression bomb. Raise the limit if the image is genuine, or "
        "remove the file."
    )


def test_the_default_limit_is_pillows_and_applies_to_simplejpeg_too(monkeypatch) -> None:
    pytest.importorskip("simplejpeg")
    data = jpeg(100, 80)
    assert decode_image(data).shape == (80, 100, 3)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 5000)
    with pytest.raises(ImageDecodeError) as caught:
        decode_image(data, source="photo.jpg")
    assert str(caught.value) == "cannot decode photo.jpg: " + refusal(100, 80, 5000)
    assert decode_image(data, max_pixels=None).shape == (80, 100, 3)


@pytest.mark.parametrize("backend", ["auto", "pillow"])
def test_max_pixels_is_checked_for_every_decoder(backend) -> None:
    png = io.BytesIO()
    Image.new("RGB", (90, 60)).save(png, "PNG")
    for data in (jpeg(90, 60), png.getvalue()):
        with pytest.raises(ImageDecodeError) as caught:
            decode_image(data, backend=backend, max_pixels=5399)
        assert str(caught.value).endswith(refusal(90, 60, 5399))
        assert decode_image(data, backend=backend, max_pixels=5400).shape == (60, 90, 3)
    with pytest.raises(ValueError, match="max_pixels must be 'pillow'"):
        decode_image(png.getvalue(), max_pixels=0)


def test_image_folder_and_tar_shards_pass_max_pixels_on(tmp_path) -> None:
    (tmp_path / "root" / "cat").mkdir(parents=True)
    (tmp_path / "root" / "cat" / "1.jpg").write_bytes(jpeg(50, 40))
    folder = ImageFolder(tmp_path / "root", max_pixels=1999)
    with pytest.raises(ImageDecodeError) as caught:
        folder[0]
    assert str(caught.value).startswith(f"cannot decode {tmp_path / 'root' / 'cat' / '1.jpg'}: ")
    assert ImageFolder(tmp_path / "root", max_pixels=2000)[0][0].shape == (40, 50, 3)
    shard = write_tar_shards([{"__key__": "a", "jpg": jpeg(50, 40)}], str(tmp_path / "s-%d.tar"))
    with pytest.raises(DatasetError) as caught:
        list(TarShards(shard, decode=True, max_pixels=1999))
    assert "sample 'a': cannot decode the sample's 'jpg' file: ImageDecodeError" in str(
        caught.value
    )
    assert refusal(50, 40, 1999) in str(caught.value)


BOMB_CHECK = """
import io, resource, struct, sys
resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30))  # the bomb would need 10 GiB
from PIL import Image
from stoker import DataLoader
from stoker.formats.image_folder import ImageFolder
from stoker.formats.tar import TarShards, write_tar_shards
from stoker.vision import decode_image, train_transform

buffer = io.BytesIO()
Image.new("RGB", (8, 8)).save(buffer, "JPEG", quality=50)
bomb = bytearray(buffer.getvalue())
sof = bomb.find(b"\\xff\\xc0")
struct.pack_into(">HH", bomb, sof + 5, 60000, 60000)  # height, width
bomb = bytes(bomb)
root = sys.argv[1]
with open(f"{root}/train/cat/bomb.jpg", "wb") as f:
    f.write(bomb)
shard = write_tar_shards([{"__key__": "bomb", "jpg": bomb}], f"{root}/bomb-%d.tar")
attempts = [
    lambda: decode_image(bomb),
    lambda: ImageFolder(f"{root}/train", transform=train_transform(224))[0],
    lambda: next(iter(TarShards(shard, decode=True))),
]
print(len(bomb))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for attempt in attempts:
    try:
        attempt()
    except Exception as exc:
        print(type(exc).__name__, exc)
    else:
        print("decoded")
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)  # peak growth, MiB
"""


def test_a_631_byte_jpeg_declaring_60000_by_60000_is_refused_before_decoding(tmp_path) -> None:
    (tmp_path / "train" / "cat").mkdir(parents=True)
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(BOMB_CHECK), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    size, direct, folder, shard, growth_mib = result.stdout.splitlines()
    limit = Image.MAX_IMAGE_PIXELS
    assert size == "631"
    assert (
        direct
        == f"ImageDecodeError cannot decode an image of 631 bytes: {refusal(60000, 60000, limit)}"
    )
    path = tmp_path / "train" / "cat" / "bomb.jpg"
    assert folder == f"ImageDecodeError cannot decode {path}: {refusal(60000, 60000, limit)}"
    assert shard.startswith("DatasetError tar shard ") and "sample 'bomb'" in shard
    assert refusal(60000, 60000, limit) in shard
    assert int(growth_mib) < 100  # the three refusals together; decoding would take 10 GiB
