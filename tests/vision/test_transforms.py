"""stoker.vision: transforms checked against Pillow and torchvision rules, reproducible loading."""

from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import stoker.vision as vision
from stoker import DataLoader
from stoker.vision import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    CenterCrop,
    Compose,
    HWCToCHW,
    ImageDecodeError,
    Normalize,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
    ToCHW,
    decode_image,
    eval_transform,
    train_transform,
)

Image = pytest.importorskip(
    "PIL.Image", reason="Pillow is the reference for resizing and writes the test images"
)


def textured(height: int, width: int, seed: int = 0) -> np.ndarray:
    """A random walk along rows: smooth enough to resample, varied enough to show moved pixels."""
    steps = np.random.default_rng(seed).integers(-9, 10, (height, width, 3))
    return (np.cumsum(steps, axis=1) % 256).astype(np.uint8)


def test_public_names_are_sorted_and_exported() -> None:
    assert vision.__all__ == sorted(vision.__all__)
    assert all(hasattr(vision, name) for name in vision.__all__)
    assert HWCToCHW is ToCHW


# -- Resize ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "target"),
    [
        ((100, 120), (50, 60)),
        ((375, 500), (256, 341)),
        ((31, 47), (100, 77)),
        ((300, 400), (37, 29)),
        ((64, 64), (64, 20)),
    ],
)
def test_resize_matches_pillows_bilinear(shape: tuple[int, int], target: tuple[int, int]) -> None:
    image = textured(*shape)
    expected = np.asarray(
        Image.fromarray(image).resize((target[1], target[0]), Image.Resampling.BILINEAR)
    ).astype(int)
    for backend in ("numpy", "pillow"):
        out = Resize(target, backend=backend)(image)
        assert out.shape == (*target, 3) and out.dtype == np.uint8
        assert np.abs(out.astype(int) - expected).max() <= 1, backend


def test_resize_int_sets_the_shorter_side_like_torchvision() -> None:
    assert Resize(256)(textured(375, 500)).shape == (256, 341, 3)
    assert Resize(256)(textured(500, 375)).shape == (341, 256, 3)
    assert Resize([128])(textured(10, 20)).shape == (128, 256, 3)
    assert Resize(100, max_size=150)(textured(100, 300)).shape == (50, 150, 3)
    same = textured(32, 48)
    assert Resize(32)(same) is same
    assert Resize(256).decode_size_hint == 256 and Resize((20, 30)).decode_size_hint == (20, 30)


def test_resize_grayscale_float_and_odd_channels() -> None:
    gray = textured(40, 60)[:, :, 0]
    expected = np.asarray(Image.fromarray(gray).resize((30, 20), Image.Resampling.BILINEAR)).astype(
        int
    )
    assert np.abs(Resize((20, 30))(gray).astype(int) - expected).max() <= 1
    assert Resize((20, 30))(gray[:, :, None]).shape == (20, 30, 1)
    floats = textured(40, 60).astype(np.float32) / 255
    out = Resize((20, 30))(floats)
    assert (
        out.dtype == np.float32
        and np.abs(out * 255 - Resize((20, 30), backend="numpy")(textured(40, 60))).max() < 1.01
    )
    rgba = np.concatenate([textured(40, 60), np.full((40, 60, 1), 255, np.uint8)], axis=2)
    assert Resize((20, 30))(rgba).shape == (20, 30, 4)
    with pytest.raises(
        ValueError, match=r"backend='pillow' resizes uint8 images with 1 or 3 channels, got float32"
    ):
        Resize((20, 30), backend="pillow")(floats)


# -- CenterCrop -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "crop"),
    [((256, 341), (224, 224)), ((5, 5), (2, 3)), ((7, 8), (7, 8)), ((10, 13), (3, 4))],
)
def test_center_crop_is_exact(shape: tuple[int, int], crop: tuple[int, int]) -> None:
    image = np.arange(shape[0] * shape[1] * 3).reshape(*shape, 3)
    top = round((shape[0] - crop[0]) / 2.0)  # torchvision's int(round(...))
    left = round((shape[1] - crop[1]) / 2.0)
    assert np.array_equal(
        CenterCrop(crop)(image), image[top : top + crop[0], left : left + crop[1]]
    )


def test_center_crop_pads_small_images_with_zeros() -> None:
    out = CenterCrop((4, 6))(np.ones((2, 3, 3), np.uint8))
    assert out.shape == (4, 6, 3)
    assert out.sum() == 2 * 3 * 3 and np.array_equal(out[1:3, 1:4], np.ones((2, 3, 3)))


# -- RandomResizedCrop and flips -------------------------------------------------------------


def test_random_resized_crop_output_and_variety() -> None:
    image = textured(120, 160)
    crop = RandomResizedCrop((32, 48))
    outs = [crop(image) for _ in range(8)]
    assert all(o.shape == (32, 48, 3) and o.dtype == np.uint8 for o in outs)
    assert len({o.tobytes() for o in outs}) == 8
    assert RandomResizedCrop(16)(textured(3, 5)).shape == (16, 16, 3)


def test_random_resized_crop_of_the_whole_image_is_a_resize() -> None:
    image = textured(60, 80)
    whole = RandomResizedCrop((30, 40), scale=(1.0, 1.0), ratio=(4 / 3, 4 / 3))
    assert np.array_equal(whole(image), Resize((30, 40))(image))


def test_random_resized_crop_resizes_the_crop_it_drew(monkeypatch: pytest.MonkeyPatch) -> None:
    import stoker.vision.transforms as transforms

    image = textured(90, 70)
    crop = RandomResizedCrop((20, 20), backend="numpy")
    top, left, h, w = crop.get_params(90, 70, np.random.default_rng(5))
    assert (h, w) != (90, 70)
    monkeypatch.setattr(transforms, "sample_rng", lambda: np.random.default_rng(5))
    expected = Resize((20, 20), backend="numpy")(image[top : top + h, left : left + w])
    assert np.array_equal(crop(image), expected)


@settings(max_examples=200, deadline=None)
@given(
    height=st.integers(1, 400),
    width=st.integers(1, 400),
    low=st.floats(0.01, 1.0),
    high=st.floats(0.01, 1.0),
    r1=st.floats(0.1, 10.0),
    r2=st.floats(0.1, 10.0),
    seed=st.integers(0, 2**32),
)
def test_crop_params_stay_inside_the_image(
    height: int, width: int, low: float, high: float, r1: float, r2: float, seed: int
) -> None:
    crop = RandomResizedCrop(
        8, scale=(min(low, high), max(low, high)), ratio=(min(r1, r2), max(r1, r2))
    )
    top, left, h, w = crop.get_params(height, width, np.random.default_rng(seed))
    assert h >= 1 and w >= 1
    assert top >= 0 and top + h <= height
    assert left >= 0 and left + w <= width


def test_crop_area_follows_scale() -> None:
    crop = RandomResizedCrop(8, scale=(0.25, 0.5), ratio=(1.0, 1.0))
    rng = np.random.default_rng(0)
    areas = [
        h * w / (400 * 400) for _, _, h, w in (crop.get_params(400, 400, rng) for _ in range(200))
    ]
    assert min(areas) > 0.24 and max(areas) < 0.51 and np.std(areas) > 0.05


def test_horizontal_flip() -> None:
    image = textured(4, 5)
    flipped = RandomHorizontalFlip(p=1.0)(image)
    assert np.array_equal(flipped, image[:, ::-1]) and flipped.flags.c_contiguous
    assert RandomHorizontalFlip(p=0.0)(image) is image
    flips = sum(not np.array_equal(RandomHorizontalFlip()(image), image) for _ in range(400))
    assert 150 < flips < 250
    with pytest.raises(
        ValueError, match=r"RandomHorizontalFlip p must be a probability in \[0, 1\], got 1.5"
    ):
        RandomHorizontalFlip(1.5)


# -- Normalize and CHW ----------------------------------------------------------------------


def test_normalize_values() -> None:
    image = textured(6, 7)
    expected = (image / 255.0 - np.array(IMAGENET_MEAN)) / np.array(IMAGENET_STD)
    out = Normalize(IMAGENET_MEAN, IMAGENET_STD)(image)
    assert out.dtype == np.float32 and np.allclose(out, expected, atol=1e-5)
    assert np.allclose(
        Normalize(IMAGENET_MEAN, IMAGENET_STD, scale=True)(image.astype(np.float32)),
        expected,
        atol=1e-5,
    )
    in_255 = Normalize([123.675, 116.28, 103.53], [58.395, 57.12, 57.375], scale=False)(image)
    assert np.allclose(in_255, expected, atol=1e-4)
    floats = image.astype(np.float32) / 255  # already 0-1: not scaled again
    assert np.allclose(Normalize(IMAGENET_MEAN, IMAGENET_STD)(floats), expected, atol=1e-5)
    assert np.allclose(
        Normalize([0.5], [0.25])(image[:, :, 0]), (image[:, :, 0] / 255 - 0.5) / 0.25, atol=1e-5
    )


def test_normalize_errors_explain_the_fix() -> None:
    with pytest.raises(
        ValueError,
        match=r"Normalize has 3 channel means but the image has shape \(3, 6, 7\): "
        r"7 channels last.*put it before ToCHW",
    ):
        Normalize(IMAGENET_MEAN, IMAGENET_STD)(ToCHW()(textured(6, 7)))
    with pytest.raises(
        ValueError, match=r"Normalize std must be non-zero \(it divides\), got std=\(1, 0, 1\)"
    ):
        Normalize((0, 0, 0), (1, 0, 1))
    with pytest.raises(ValueError, match="Normalize mean and std need one value per channel each"):
        Normalize((0, 0, 0), (1, 1))


def test_to_chw() -> None:
    image = textured(4, 5)
    out = ToCHW()(image)
    assert (
        out.shape == (3, 4, 5) and out.flags.c_contiguous and np.array_equal(out[1], image[:, :, 1])
    )
    assert ToCHW()(image[:, :, 0]).shape == (1, 4, 5)


# -- recipes and composition ----------------------------------------------------------------


def test_recipes_shapes_dtypes_and_ranges() -> None:
    image = textured(375, 500)
    train = train_transform(224)(image)
    evaluated = eval_transform(224)(image)
    for out in (train, evaluated):
        assert out.shape == (3, 224, 224) and out.dtype == np.float32
        assert out.min() > -2.2 and out.max() < 2.7  # ImageNet-normalised 0-255 data
    assert [type(t).__name__ for t in eval_transform(224)] == [
        "Resize",
        "CenterCrop",
        "Normalize",
        "ToCHW",
    ]
    assert eval_transform(224).transforms[0].size == (256, 256) and eval_transform(384).transforms[
        0
    ].size == (438, 438)
    assert eval_transform(224, 232).transforms[0].size == (232, 232)
    assert train_transform(96, chw=False)(image).shape == (96, 96, 3)
    assert (
        eval_transform(224).decode_size_hint == 256
        and train_transform(224).decode_size_hint is None
    )
    reference = Normalize(IMAGENET_MEAN, IMAGENET_STD)(
        CenterCrop(224)(Resize(256)(image))
    ).transpose(2, 0, 1)
    assert np.array_equal(evaluated, reference)


def test_transforms_reject_tensors_and_non_callables() -> None:
    class FakeTensor:
        shape = (3, 8, 8)

    with pytest.raises(
        TypeError,
        match=r"Resize expects an \(H, W, C\) or \(H, W\) numpy array \(or a PIL image\), "
        r"got .*FakeTensor of shape \(3, 8, 8\)",
    ):
        Resize(4)(FakeTensor())
    with pytest.raises(
        TypeError, match="Compose takes callables; transform 1 is 3, which is not callable"
    ):
        Compose([ToCHW(), 3])
    with pytest.raises(
        ValueError,
        match=r"RandomResizedCrop scale must be a \(min, max\) pair with 0 < min <= max, "
        r"got \(0.9, 0.1\)",
    ):
        RandomResizedCrop(8, scale=(0.9, 0.1))
    with pytest.raises(
        ValueError,
        match=r"Resize size must be a positive int or a \(height, width\) pair of positive ints, "
        r"got 0",
    ):
        Resize(0)


def test_transforms_accept_pil_images() -> None:
    image = textured(20, 30)
    assert np.array_equal(CenterCrop(10)(Image.fromarray(image)), CenterCrop(10)(image))


class Images:
    """An in-memory dataset whose samples go through an augmentation pipeline."""

    def __init__(self, transform: Compose, n: int = 24) -> None:
        self.images = [textured(40 + i % 5, 50, seed=i) for i in range(n)]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return self.transform(self.images[i]), i


def epochs(num_workers: int, epochs: int = 2) -> list[list[np.ndarray]]:
    loader = DataLoader(
        Images(train_transform(16)),
        batch_size=5,
        shuffle=True,
        generator=11,
        num_workers=num_workers,
    )
    return [[images for images, _ in loader] for _ in range(epochs)]


def test_augmentations_do_not_depend_on_num_workers() -> None:
    serial, parallel = epochs(0), epochs(2)
    for a, b in zip(serial, parallel, strict=True):
        assert len(a) == len(b) == 5
        assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    flat = [np.concatenate(e) for e in serial]
    assert not np.array_equal(flat[0], flat[1])  # a new epoch draws new crops
    assert len({s.tobytes() for s in flat[0]}) == len(flat[0])


def test_random_steps_of_one_sample_do_not_share_draws() -> None:
    twice = Compose(
        [RandomHorizontalFlip(), RandomHorizontalFlip()]
    )  # one draw used twice always undoes itself
    dataset = Images(twice, n=200)
    loader = DataLoader(dataset, batch_size=None, generator=3)
    flipped = [not np.array_equal(out, dataset.images[i]) for out, i in loader]
    assert 0.3 < np.mean(flipped) < 0.7


# -- decode_image ----------------------------------------------------------------------------


def encode(image: np.ndarray, fmt: str, mode: str | None = None, **kwargs: object) -> bytes:
    buffer = io.BytesIO()
    pil = Image.fromarray(image)
    if mode:
        pil = pil.convert(mode)
    pil.save(buffer, fmt, **kwargs)
    return buffer.getvalue()


def test_decode_image_formats_and_modes() -> None:
    image = textured(30, 40)
    assert np.array_equal(decode_image(encode(image, "PNG")), image)
    assert np.array_equal(decode_image(encode(image, "BMP")), image)
    assert np.array_equal(decode_image(encode(image, "WEBP", lossless=True)), image)
    cmyk = decode_image(encode(image, "JPEG", "CMYK", quality=95))
    assert cmyk.shape == (30, 40, 3) and np.abs(cmyk.astype(int) - image).mean() < 6
    sixteen = (np.arange(12, dtype=np.uint16).reshape(3, 4) * 5000).astype(np.uint16)
    buffer = io.BytesIO()
    Image.fromarray(sixteen).save(buffer, "PNG")
    decoded = decode_image(buffer.getvalue(), rgb=False)
    assert decoded.shape == (3, 4, 1) and np.array_equal(
        decoded[:, :, 0], np.round(sixteen / 257).astype(np.uint8)
    )
    transparent = Image.fromarray(image).convert("P", palette=Image.Palette.ADAPTIVE, colors=8)
    transparent.info["transparency"] = 0
    buffer = io.BytesIO()
    transparent.save(buffer, "PNG", transparency=0)
    assert decode_image(buffer.getvalue()).shape == (30, 40, 3)
    assert decode_image(buffer.getvalue(), rgb=False).shape == (30, 40, 4)


def test_decode_image_errors() -> None:
    with pytest.raises(
        ImageDecodeError, match=r"cannot decode photo\.jpg: .* re-encode or remove it"
    ):
        decode_image(b"\xff\xd8\xff\xe0" + b"\0" * 40, source="photo.jpg")
    with pytest.raises(
        ValueError, match=r"backend must be one of \('auto', 'simplejpeg', 'pillow'\), got 'cv2'"
    ):
        decode_image(b"", backend="cv2")
    with pytest.raises(ValueError, match=r"size_hint must be None, a positive int"):
        decode_image(b"", size_hint=(1, 2, 3))


def test_reduction_factor_is_the_largest_that_still_covers_the_hint() -> None:
    from stoker.vision.decode import reduction_factor

    assert reduction_factor(600, 800, None) == 1
    assert reduction_factor(600, 800, 75) == 8 and reduction_factor(600, 800, 76) == 4
    assert reduction_factor(601, 800, 76) == 8  # ceil(601 / 8) = 76
    assert (
        reduction_factor(600, 800, (300, 401)) == 1 and reduction_factor(600, 800, (300, 400)) == 2
    )
    assert reduction_factor(7, 9000, 1) == 4  # never below one pixel a side
