"""uint8 image recipes and ``stoker.torch.Normalize``: the float recipe's batches, moved later.

The recipes with ``normalize=False`` hand uint8 images; normalising the batch with
``stoker.torch.Normalize`` must give the float recipe's batch bit for bit on the CPU,
through real loaders over real JPEG files written by the test.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="stoker.torch.Normalize is a torch module")
Image = pytest.importorskip("PIL.Image", reason="the test writes JPEG files with Pillow")

import stoker.torch
from stoker.formats.image_folder import ImageFolder
from stoker.vision import Normalize as CpuNormalize
from stoker.vision import eval_transform, train_transform


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(0)
    for label in range(2):
        folder = root / f"class_{label}"
        folder.mkdir()
        for i in range(6):
            h, w = int(rng.integers(180, 400)), int(rng.integers(180, 400))
            pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"{i}.jpg", quality=90)
    return str(root)


def batches(root: str, transform, workers: int) -> list:
    loader = stoker.torch.DataLoader(
        ImageFolder(root, transform=transform),
        batch_size=4,
        shuffle=True,
        num_workers=workers,
        generator=torch.Generator().manual_seed(7),
    )
    return [images for images, _labels in loader]


@pytest.mark.parametrize("workers", [0, 2])
def test_uint8_train_batches_normalised_by_the_module_equal_the_float_recipe(
    photos: str, workers: int
) -> None:
    floats = batches(photos, train_transform(64), workers)
    uint8 = batches(photos, train_transform(64, normalize=False), workers)
    normalize = stoker.torch.Normalize()
    assert len(floats) == len(uint8) == 3
    for f, u in zip(floats, uint8, strict=True):
        assert u.dtype == torch.uint8 and tuple(u.shape) == (4, 3, 64, 64)
        assert f.dtype == torch.float32
        assert torch.equal(normalize(u), f)  # the same crops, flips and values, bit for bit


def test_uint8_eval_batches_and_channels_last(photos: str) -> None:
    floats = batches(photos, eval_transform(48, chw=False), 0)
    uint8 = batches(photos, eval_transform(48, chw=False, normalize=False), 0)
    normalize = stoker.torch.Normalize(channels_last=True)
    for f, u in zip(floats, uint8, strict=True):
        assert tuple(u.shape) == (4, 48, 48, 3) and u.dtype == torch.uint8
        assert torch.equal(normalize(u), f)


def test_float_input_is_not_rescaled_and_the_callers_tensor_is_left_alone() -> None:
    image = np.random.default_rng(1).random((5, 6, 3), dtype=np.float32)
    expected = CpuNormalize((0.1, 0.2, 0.3), (0.5, 0.6, 0.7))(image)
    batch = torch.from_numpy(image.transpose(2, 0, 1).copy())
    before = batch.clone()
    out = stoker.torch.Normalize((0.1, 0.2, 0.3), (0.5, 0.6, 0.7))(batch)
    assert torch.equal(batch, before)  # not changed in place
    assert torch.equal(out, torch.from_numpy(expected.transpose(2, 0, 1).copy()))
    scaled = stoker.torch.Normalize((0.0,), (1.0,), scale=True)(torch.full((1, 2, 2), 255.0))
    assert torch.equal(scaled, torch.ones(1, 2, 2))


def test_the_module_moves_with_the_model_and_says_what_it_does() -> None:
    module = torch.nn.Sequential(stoker.torch.Normalize(), torch.nn.Flatten())
    module.to(torch.float32)
    text = repr(module)
    assert "Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])" in text
    assert module.state_dict() == {}  # constants, not weights: checkpoints stay as they were


def test_wrong_shapes_and_arguments_are_named() -> None:
    with pytest.raises(ValueError) as excinfo:
        stoker.torch.Normalize()(torch.zeros(2, 4, 4, 3, dtype=torch.uint8))
    assert str(excinfo.value) == (
        "stoker.torch.Normalize has 3 channel means but got a batch of shape (2, 4, 4, 3); "
        "it normalises (..., C, H, W) batches (channels_last=True for HWC images)"
    )
    with pytest.raises(ValueError, match=r"std must be non-zero \(it divides\), got std=\(1, 0\)"):
        stoker.torch.Normalize((0, 0), (1, 0))
    with pytest.raises(ValueError, match="need one value per channel each, got mean=\\(0, 0\\)"):
        stoker.torch.Normalize((0, 0), (1,))
