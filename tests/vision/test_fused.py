"""The fused recipe (stoker.vision.fused) against the same steps run one by one."""

from __future__ import annotations

import io

import numpy as np
import pytest

from stoker.vision import (
    Compose,
    Normalize,
    RandomHorizontalFlip,
    RandomResizedCrop,
    ToCHW,
    decode_image,
    train_transform,
)
from stoker.vision.fused import reduced_crop, split_tail
from stoker.vision.records import decode_and_transform
from stoker.vision.transforms import call_with_shared_rng

Image = pytest.importorskip("PIL.Image", reason="decoding JPEGs needs Pillow (stoker[image])")


def _one_by_one(compose: Compose, image):
    def run(value):
        for step in compose.transforms:
            value = step(value)
        return value

    return call_with_shared_rng(run, image)


def _jpeg(width: int, height: int, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    image = np.stack([x * 255 // width, y * 255 // height, (x + y) % 256], axis=-1)
    image = (image + rng.integers(0, 30, image.shape)).clip(0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


@pytest.mark.parametrize("dtype", ["uint8", "float32", "float64", "int16", "uint16"])
@pytest.mark.parametrize(
    "steps",
    [
        "flip normalize chw",
        "normalize chw",
        "flip chw",
        "flip normalize",
        "crop flip normalize chw",
    ],
)
def test_the_fused_tail_gives_every_value_of_the_steps(dtype: str, steps: str) -> None:
    made = {
        "crop": RandomResizedCrop(24),
        "flip": RandomHorizontalFlip(0.5),
        "normalize": Normalize((0.4, 0.5, 0.6), (0.2, 0.25, 0.3)),
        "chw": ToCHW(),
    }
    compose = Compose([made[name] for name in steps.split()])
    assert split_tail(compose.transforms)[1] is not None
    image = (np.arange(40 * 30 * 3) % 251).reshape(40, 30, 3).astype(dtype)
    if "crop" in steps and dtype != "uint8":
        image = image.astype(np.uint8)
    for seed in range(12):
        np.random.seed(seed)
        expected = _one_by_one(compose, image)
        np.random.seed(seed)
        got = compose(image)
        assert got.dtype == expected.dtype and got.shape == expected.shape
        assert np.array_equal(got, expected), f"seed {seed}"
        assert got.flags.c_contiguous


def test_a_tail_the_image_does_not_fit_runs_step_by_step_with_its_error() -> None:
    compose = Compose([Normalize((0.5, 0.5), (0.2, 0.2)), ToCHW()])
    with pytest.raises(ValueError, match="Normalize has 2 channel means but the image has shape"):
        compose(np.zeros((4, 4, 3), np.uint8))
    gray = Compose([Normalize((0.5,), (0.2,)), ToCHW()])
    assert gray(np.zeros((4, 5), np.uint8)).shape == (1, 4, 5)  # (H, W) as the steps take it


def test_an_edited_compose_fuses_its_new_steps() -> None:
    compose = Compose([Normalize((0.5,), (0.5,)), ToCHW()])
    image = np.full((2, 2, 1), 255, np.uint8)
    assert compose(image).shape == (1, 2, 2)
    compose.transforms.pop()
    assert compose(image).shape == (2, 2, 1)


@pytest.mark.parametrize("size", [(500, 375), (300, 200)])
def test_a_jpeg_whose_crops_are_small_is_decoded_whole_and_matches_the_steps(size) -> None:
    """Below twice the output the crop is decoded at full size: bit for bit the steps'."""
    data, recipe = _jpeg(*size), train_transform(224)
    image = decode_image(data)
    for seed in range(10):
        np.random.seed(seed)
        expected = _one_by_one(recipe, image)
        np.random.seed(seed)
        assert np.array_equal(decode_and_transform(data, recipe), expected), f"seed {seed}"


def test_a_large_jpeg_is_decoded_reduced_where_the_crop_allows_with_the_same_crop() -> None:
    data, recipe = _jpeg(1600, 1200), train_transform(224)
    image = decode_image(data)
    reduced = 0
    for seed in range(16):
        np.random.seed(seed)
        expected = _one_by_one(recipe, image)
        np.random.seed(seed)
        got = decode_and_transform(data, recipe)
        np.random.seed(seed)
        full = decode_and_transform(data, recipe, size_hint="full")
        assert np.array_equal(full, expected), "size_hint='full' decodes the whole image"
        assert got.shape == (3, 224, 224) and got.dtype == np.float32
        # the same region, flip and normalisation: close to the full-size result
        assert float(np.abs(got - expected).mean()) < 0.05, f"seed {seed}"
        reduced += not np.array_equal(got, expected)
    assert reduced >= 8, "large crops of a large photo are decoded at reduced scale"


def test_the_reduction_keeps_the_crop_at_least_the_output() -> None:
    assert reduced_crop((0, 0, 447, 900), (224, 224)) == 1
    assert reduced_crop((0, 0, 448, 448), (224, 224)) == 2
    assert reduced_crop((0, 0, 1000, 1792), (224, 224)) == 4
    assert reduced_crop((0, 0, 1792, 1792), (224, 224)) == 8
    assert reduced_crop((0, 0, 5000, 5000), (224, 224)) == 8


def test_a_damaged_jpeg_is_named_as_the_steps_would() -> None:
    data = _jpeg(500, 375)
    with pytest.raises(Exception, match=r"cannot decode photo\.jpg: .*corrupt, truncated"):
        decode_and_transform(data[:200], train_transform(224), source="photo.jpg")
