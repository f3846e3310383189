"""Pack, then train: ``PackedDataset(..., transform=DecodeImage(T))`` over ``stoker pack``'s
output gives the batches ``ImageFolder(folder, transform=T)`` gives, bit for bit."""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest

pytest.importorskip("PIL", reason="writing and decoding images needs Pillow")

from PIL import Image

from stoker import DataLoader
from stoker.cli import main
from stoker.formats.image_folder import ImageFolder
from stoker.formats.packed import PackedDataset, PackedWriter
from stoker.vision import DecodeImage, ImageDecodeError, eval_transform, train_transform


def _jpeg(rng: np.random.Generator, width: int, height: int) -> bytes:
    pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=85)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def folder_and_packed(tmp_path_factory) -> tuple[str, str]:
    """Three classes of JPEGs (a few PNG and grayscale ones too), and their `stoker pack` copy."""
    root = tmp_path_factory.mktemp("photos") / "train"
    rng = np.random.default_rng(3)
    for i in range(24):
        target = root / f"class_{i % 3}" / f"{i:03d}"
        target.parent.mkdir(parents=True, exist_ok=True)
        if i % 7 == 0:
            Image.fromarray(rng.integers(0, 256, (90, 130), dtype=np.uint8)).save(f"{target}.png")
        else:
            target.with_suffix(".jpg").write_bytes(_jpeg(rng, 320 + 8 * (i % 4), 240))
    packed = tmp_path_factory.mktemp("packed") / "train"
    assert main(["pack", str(root), str(packed), "--workers", "2"]) == 0
    return str(root), str(packed)


def _batches(dataset, num_workers: int) -> list[tuple[np.ndarray, np.ndarray]]:
    with DataLoader(
        dataset, batch_size=5, shuffle=True, generator=7, num_workers=num_workers
    ) as loader:
        return [(np.asarray(images), np.asarray(labels)) for images, labels in loader]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize(
    "transform",
    [train_transform(64), eval_transform(32)],  # random crops; a resize first (reduced decode)
    ids=["train_transform", "eval_transform"],
)
def test_packed_batches_equal_the_image_folder_batches(
    folder_and_packed, transform, num_workers
) -> None:
    root, packed = folder_and_packed
    folder = ImageFolder(root, transform=transform)
    records = PackedDataset(packed, transform=DecodeImage(transform))
    assert len(folder) == len(records) == 24
    assert records.classes == folder.classes
    expected, got = _batches(folder, num_workers), _batches(records, num_workers)
    assert len(expected) == len(got) == 5
    for (images_a, labels_a), (images_b, labels_b) in zip(expected, got, strict=True):
        assert images_a.dtype == images_b.dtype == np.float32
        assert images_a.shape == images_b.shape
        np.testing.assert_array_equal(images_a, images_b)  # bit-exact, random crops included
        np.testing.assert_array_equal(labels_a, labels_b)


def test_reduced_size_decoding_is_used_for_packed_records_too(
    folder_and_packed, monkeypatch
) -> None:
    import stoker.vision.records as records_module

    root, packed = folder_and_packed
    hints = []
    real = records_module.decode_image

    def spy(data, **kwargs):
        hints.append(kwargs["size_hint"])
        return real(data, **kwargs)

    monkeypatch.setattr(records_module, "decode_image", spy)
    ImageFolder(root, transform=eval_transform(32))[1]
    PackedDataset(packed, transform=DecodeImage(eval_transform(32)))[1]
    assert hints == [eval_transform(32).decode_size_hint] * 2 and hints[0] is not None


def test_decode_image_handles_bytes_dict_and_tuple_records(tmp_path) -> None:
    data = _jpeg(np.random.default_rng(0), 40, 30)
    with PackedWriter(tmp_path / "bare") as writer:
        writer.add(data)
    with PackedWriter(tmp_path / "dicts") as writer:
        writer.add({"image": data, "label": 4, "name": "a"})
    with PackedWriter(tmp_path / "pixels") as writer:
        writer.add({"pixels": data, "label": 5})
    with PackedWriter(tmp_path / "tuples") as writer:
        writer.add((3, data))

    bare = PackedDataset(tmp_path / "bare", transform=DecodeImage())[0]
    assert isinstance(bare, np.ndarray) and bare.shape == (30, 40, 3) and bare.dtype == np.uint8
    dicts = PackedDataset(tmp_path / "dicts", transform=DecodeImage(eval_transform(16)))
    sample = dicts[0]
    assert sample["image"].shape == (3, 16, 16) and sample["label"] == 4 and sample["name"] == "a"
    with pytest.raises(
        KeyError, match=r"DecodeImage\(field='image'\): the record has no such field"
    ):
        PackedDataset(tmp_path / "pixels", transform=DecodeImage())[0]
    other = PackedDataset(tmp_path / "pixels", transform=DecodeImage(field="pixels"))[0]
    assert other["pixels"].shape == (30, 40, 3)
    label, image = PackedDataset(tmp_path / "tuples", transform=DecodeImage(field=1))[0]
    assert label == 3 and image.shape == (30, 40, 3)


def test_decode_image_checks_its_arguments_and_records() -> None:
    with pytest.raises(ValueError, match="decode"):
        DecodeImage(decode="opencv")
    with pytest.raises(TypeError, match="transform must be a callable"):
        DecodeImage(transform=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="size_hint"):
        DecodeImage(size_hint=-1)
    with pytest.raises(TypeError, match="DecodeImage expects a record holding encoded image bytes"):
        DecodeImage()(12)
    with pytest.raises(ImageDecodeError, match="cannot decode"):
        DecodeImage()((b"not an image", 0))


def test_decode_image_pickles_for_spawned_workers_and_gives_pil_when_asked() -> None:
    transform = pickle.loads(pickle.dumps(DecodeImage(eval_transform(16), decode="pil")))
    assert repr(transform).startswith("DecodeImage(Compose([")
    data = _jpeg(np.random.default_rng(1), 20, 10)
    image, label = DecodeImage(decode="pil")((data, 1))
    assert isinstance(image, Image.Image) and image.size == (20, 10) and label == 1
