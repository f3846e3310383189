"""ImageFolder over real JPEG and PNG files written by Pillow: index, classes, decoding, errors."""

from __future__ import annotations

import io
import json
import logging
import os
import pickle
import random
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from formats.damage import truncated
from stoker import DataLoader, DatasetError, DatasetIndexError, _proc
from stoker.formats.image_folder import IMG_EXTENSIONS, ImageFolder
from stoker.vision import (
    CenterCrop,
    Compose,
    ImageDecodeError,
    Resize,
    decode_image,
    eval_transform,
)

Image = pytest.importorskip(
    "PIL.Image", reason="ImageFolder decodes with Pillow, which these tests write files with"
)


def gradient(height: int, width: int) -> np.ndarray:
    """A smooth RGB image: JPEG keeps it within a few levels."""
    y, x = np.mgrid[0:height, 0:width]
    return np.stack(
        [x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1), (x + y) % 64 + 96], -1
    ).astype(np.uint8)


def write(
    path: Path, array: np.ndarray | None = None, mode: str = "RGB", size: tuple[int, int] = (24, 32)
) -> Path:
    """Writes an image file; the format follows the suffix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rgb = gradient(*size) if array is None else array
    image = Image.fromarray(rgb)
    if mode == "L":
        image = image.convert("L")
    elif mode == "RGBA":
        image = image.convert("RGBA")
        image.putalpha(128)
    elif mode == "P":
        image = image.convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    image.save(path, quality=95) if path.suffix.lower() in (".jpg", ".jpeg") else image.save(path)
    return path


def make_tree(root: Path, names: list[str]) -> Path:
    for name in names:
        write(root / name)
    return root


NAMES = [
    "cat/1.jpg",
    "cat/chat_été.jpg",
    "cat/sub/deep.png",
    "dog/猫.png",
    "dog/2.JPEG",
    "émeu/a.png",
]


def relative(folder: ImageFolder) -> list[str]:
    return [
        os.path.relpath(folder.path(i), folder.root).replace(os.sep, "/")
        for i in range(len(folder))
    ]


# -- the index -----------------------------------------------------------------------------


def test_classes_are_sorted_folder_names_and_labels_follow_them(tmp_path: Path) -> None:
    folder = ImageFolder(make_tree(tmp_path, NAMES))
    assert folder.classes == ["cat", "dog", "émeu"]
    assert folder.class_to_idx == {"cat": 0, "dog": 1, "émeu": 2}
    assert relative(folder) == [
        "cat/1.jpg",
        "cat/chat_été.jpg",
        "cat/sub/deep.png",
        "dog/2.JPEG",
        "dog/猫.png",
        "émeu/a.png",
    ]
    assert folder.targets.tolist() == [0, 0, 0, 1, 1, 2]
    assert folder.targets.dtype == np.int64 and not folder.targets.flags.writeable
    assert [label for _, label in folder.samples] == [0, 0, 0, 1, 1, 2]


def test_order_matches_torchvisions_sorted_walk(tmp_path: Path) -> None:
    names = [
        "a/z.png",
        "a/b/y.png",
        "a/b-c/x.png",
        "a/b/c/w.png",
        "a/B.png",
        "b/0.png",
        "b/x/1.png",
    ]
    root = make_tree(tmp_path, names)
    expected = []  # torchvision.datasets.folder.make_dataset, written out
    for cls in sorted(e.name for e in os.scandir(root) if e.is_dir()):
        for dirpath, _, files in sorted(os.walk(root / cls, followlinks=True)):
            expected += [
                os.path.relpath(os.path.join(dirpath, f), root).replace(os.sep, "/")
                for f in sorted(files)
            ]
    assert relative(ImageFolder(root)) == expected


def test_index_is_the_same_whatever_the_creation_order(tmp_path: Path) -> None:
    names = [f"c{c}/img_{i:02d}.png" for c in range(3) for i in range(8)] + NAMES
    shuffled = names[:]
    random.Random(0).shuffle(shuffled)
    first = ImageFolder(make_tree(tmp_path / "one", names))
    second = ImageFolder(make_tree(tmp_path / "two", shuffled))
    assert relative(first) == relative(second)
    assert first.targets.tolist() == second.targets.tolist()
    assert relative(ImageFolder(tmp_path / "one")) == relative(first)


def test_index_is_stored_flat_not_as_python_objects(tmp_path: Path) -> None:
    from stoker.compact import StringArray

    folder = ImageFolder(make_tree(tmp_path, NAMES))
    arrays = [v for v in vars(folder).values() if isinstance(v, (StringArray, np.ndarray))]
    assert any(isinstance(v, StringArray) and len(v) == len(NAMES) for v in arrays)
    per_sample_lists = [
        k for k, v in vars(folder).items() if isinstance(v, list) and len(v) == len(NAMES)
    ]
    assert per_sample_lists == []


def test_hidden_files_other_extensions_and_extension_case(tmp_path: Path) -> None:
    root = make_tree(tmp_path, ["a/1.png", "a/.hidden.png", "a/2.PNG", ".git/x.png"])
    (root / "a" / "notes.txt").write_text("not an image")
    folder = ImageFolder(root)
    assert relative(folder) == ["a/1.png", "a/2.PNG"]
    assert folder.classes == ["a"]
    assert relative(ImageFolder(root, extensions="png")) == ["a/1.png", "a/2.PNG"]
    assert relative(ImageFolder(root, extensions=(".txt",))) == ["a/notes.txt"]


def test_empty_class_folder_keeps_its_label_and_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = make_tree(tmp_path, ["a/1.png", "c/1.png"])
    (root / "b").mkdir()
    with caplog.at_level(logging.WARNING, logger="stoker"):
        folder = ImageFolder(root)
    assert folder.classes == ["a", "b", "c"]
    assert folder.targets.tolist() == [0, 2]
    warnings = [
        r.getMessage() for r in caplog.records if "holds no files ending in" in r.getMessage()
    ]
    assert len(warnings) == 1 and str(root / "b") in warnings[0] and "keeps label 1" in warnings[0]


@pytest.mark.parametrize(
    ("setup", "error", "pattern"),
    [
        (
            "missing",
            FileNotFoundError,
            r"ImageFolder root '.*missing' does not exist; "
            r"pass the folder that holds one subfolder per class",
        ),
        ("file", NotADirectoryError, r"ImageFolder root '.*file\.png' is not a directory"),
        (
            "empty",
            FileNotFoundError,
            r"found no class folders in '.*empty' "
            r"\(looked for images ending in \.jpg, \.jpeg, \.png",
        ),
        (
            "loose",
            FileNotFoundError,
            r"It holds 2 image file\(s\) directly: move them into one subfolder per class",
        ),
        (
            "no_images",
            FileNotFoundError,
            r"found no images in '.*no_images': none of its 2 class folder\(s\) "
            r"\('a', 'b'\) holds a file ending in \.jpg",
        ),
    ],
)
def test_clear_errors_for_roots_without_images(
    tmp_path: Path, setup: str, error: type, pattern: str
) -> None:
    root = tmp_path / setup
    if setup == "file":
        root = write(tmp_path / "file.png")
    elif setup == "empty":
        root.mkdir()
    elif setup == "loose":
        write(root / "1.png"), write(root / "2.jpg")
    elif setup == "no_images":
        (root / "a").mkdir(parents=True)
        (root / "b").mkdir()
        (root / "b" / "readme.txt").write_text("x")
    with pytest.raises(error, match=pattern):
        ImageFolder(root)


def test_indexing_errors_and_negative_indices(tmp_path: Path) -> None:
    folder = ImageFolder(make_tree(tmp_path, ["a/1.png", "b/2.png"]))
    assert folder[-1][1] == 1 and folder[np.int64(0)][1] == 0
    with pytest.raises(
        DatasetIndexError,
        match="index 2 is out of range for ImageFolder of length 2; valid indices are -2 to 1",
    ):
        folder[2]
    with pytest.raises(IndexError):
        folder[-3]
    with pytest.raises(TypeError, match=r"ImageFolder index must be an integer, got float: 1\.5"):
        folder[1.5]


# -- JSON index ----------------------------------------------------------------------------


def test_json_round_trip_survives_moving_the_data(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "data", NAMES)
    folder = ImageFolder(root)
    folder.save_index(tmp_path / "index.json")
    saved = json.loads((tmp_path / "index.json").read_text(encoding="utf-8"))
    assert saved["classes"] == ["cat", "dog", "émeu"]
    assert saved["items"][1] == {"path": "cat/chat_été.jpg", "label": 0}
    assert "猫" in (tmp_path / "index.json").read_text(encoding="utf-8")  # UTF-8, not \\u escapes

    same_place = ImageFolder.from_index(tmp_path / "index.json")
    assert same_place.samples == folder.samples

    shutil.move(root, tmp_path / "moved")
    moved = ImageFolder.from_index(tmp_path / "index.json", root=tmp_path / "moved")
    assert relative(moved) == relative(folder) and moved.targets.tolist() == folder.targets.tolist()
    assert moved.classes == folder.classes
    assert np.array_equal(moved[4][0], folder.__class__(tmp_path / "moved")[4][0])
    assert not list(tmp_path.glob("index.json.tmp*"))


def test_seeds_index_format_loads(tmp_path: Path) -> None:
    root = make_tree(tmp_path, ["a/1.png", "b/2.png"])
    seeds = {
        "classes": ["a", "b"],
        "items": [
            {"path": str(root / "b/2.png"), "label": 1},
            {"path": str(root / "a/1.png"), "label": 0},
        ],
    }
    (tmp_path / "seeds.json").write_text(json.dumps(seeds, ensure_ascii=False), encoding="utf-8")
    folder = ImageFolder.from_index(tmp_path / "seeds.json")
    assert (
        folder.targets.tolist() == [1, 0]
        and folder[0][1] == 1
        and folder[0][0].shape == (24, 32, 3)
    )
    in_memory = ImageFolder(tmp_path / "elsewhere", index=seeds)  # absolute item paths ignore root
    assert in_memory.path(1) == str(root / "a/1.png")


@pytest.mark.parametrize(
    ("index", "pattern"),
    [
        ({"items": []}, r'must be a JSON object with "classes"'),
        (
            {"classes": ["a"], "items": [{"path": "a/1.png", "label": 3}]},
            r"item 0 must be \{\"path\": str, \"label\": int\} "
            r"with a label of one of its 1 classes",
        ),
        ({"classes": ["a"], "items": [{"path": 5, "label": 0}]}, r"item 0 must be"),
        (
            {"classes": ["a"], "items": [{"path": "a/1.png", "label": False}]},
            r"item 0 must be \{\"path\": str, \"label\": int\} .*got \{'path': 'a/1.png', "
            r"'label': False\}",
        ),
        ({"classes": ["a", "a"], "items": []}, r"malformed class list: classes lists 'a' twice"),
    ],
)
def test_malformed_index_names_the_problem(tmp_path: Path, index: dict, pattern: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(index))
    with pytest.raises(DatasetError, match=pattern):
        ImageFolder(tmp_path, index=path)


def test_index_that_is_not_json_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "broken.json").write_text('{"classes": ["a"], "items": [')
    with pytest.raises(DatasetError, match=r"index '.*broken\.json' is not valid JSON"):
        ImageFolder.from_index(tmp_path / "broken.json", root=tmp_path)
    with pytest.raises(DatasetError, match=r"index '.*broken\.json' is not valid JSON"):
        ImageFolder(tmp_path, index=tmp_path / "broken.json")
    (tmp_path / "bad.json").write_text('{"classes": ["a"], "items": [{"path": "x.png"}]}')
    with pytest.raises(DatasetError, match=r"index '.*bad\.json': item 0 must be"):
        ImageFolder.from_index(tmp_path / "bad.json")


# -- one class mapping for train and val ---------------------------------------------------


def test_val_with_a_subset_of_classes_uses_the_train_labels(tmp_path: Path) -> None:
    train = ImageFolder(make_tree(tmp_path / "train", ["a/1.png", "b/1.png", "c/1.png"]))
    val = ImageFolder(make_tree(tmp_path / "val", ["c/1.png", "a/1.png"]), classes=train.classes)
    assert val.classes == ["a", "b", "c"] and val.class_to_idx == train.class_to_idx
    assert val.targets.tolist() == [0, 2]  # alone, c would have been 1
    assert ImageFolder(tmp_path / "val").targets.tolist() == [0, 1]
    assert ImageFolder(tmp_path / "val", classes=train.class_to_idx).targets.tolist() == [0, 2]
    train.save_index(tmp_path / "train.json")
    assert ImageFolder(tmp_path / "val", classes=tmp_path / "train.json").targets.tolist() == [0, 2]


def test_val_with_an_unknown_class_raises_naming_it(tmp_path: Path) -> None:
    train = ImageFolder(make_tree(tmp_path / "train", ["a/1.png", "b/1.png"]))
    make_tree(tmp_path / "val", ["a/1.png", "zebra/1.png"])
    with pytest.raises(
        DatasetError,
        match=r"val' has class\(es\) 'zebra' that are not in the given classes \(2: 'a', 'b'\)",
    ):
        ImageFolder(tmp_path / "val", classes=train.classes)


def test_custom_label_numbers_are_kept_through_the_index(tmp_path: Path) -> None:
    root = make_tree(tmp_path, ["cat/1.png", "dog/1.png"])
    folder = ImageFolder(root, classes={"dog": 7, "cat": 3})
    assert folder.targets.tolist() == [3, 7] and folder.classes == ["cat", "dog"]
    folder.save_index(tmp_path / "i.json")
    again = ImageFolder.from_index(tmp_path / "i.json")
    assert again.targets.tolist() == [3, 7] and again.class_to_idx == {"cat": 3, "dog": 7}
    with pytest.raises(
        TypeError,
        match=r"classes must map class names \(str\) to labels \(int >= 0\); got 'cat': -1",
    ):
        ImageFolder(root, classes={"cat": -1, "dog": 0})
    with pytest.raises(TypeError, match=r"to labels \(int >= 0\); got 'dog': (np\.True_|True)$"):
        ImageFolder(root, classes={"cat": 0, "dog": np.True_})
    numpy_labels = ImageFolder(root, classes={"dog": np.int64(7), "cat": np.uint8(3)})
    assert numpy_labels.class_to_idx == {"cat": 3, "dog": 7}
    assert all(type(label) is int for label in numpy_labels.class_to_idx.values())


# -- decoding --------------------------------------------------------------------------------


def test_every_mode_becomes_hwc_uint8_rgb(tmp_path: Path) -> None:
    pixels = gradient(24, 32)
    write(tmp_path / "x/rgb.png", pixels)
    write(tmp_path / "x/gray.png", pixels, "L")
    write(tmp_path / "x/rgba.png", pixels, "RGBA")
    write(tmp_path / "x/palette.png", pixels, "P")
    write(tmp_path / "x/rgb.jpg", pixels)
    write(tmp_path / "x/gray.jpg", pixels, "L")
    folder = ImageFolder(tmp_path)
    images = {Path(folder.path(i)).name: folder[i][0] for i in range(len(folder))}
    for name, image in images.items():
        assert image.shape == (24, 32, 3) and image.dtype == np.uint8, name
    gray = np.asarray(Image.fromarray(pixels).convert("L"))
    assert np.array_equal(images["rgb.png"], pixels)
    assert np.array_equal(images["rgba.png"], pixels)  # alpha dropped, colours kept
    assert np.array_equal(images["gray.png"], np.repeat(gray[:, :, None], 3, axis=2))
    palette = np.asarray(Image.open(tmp_path / "x/palette.png").convert("RGB"))
    assert np.array_equal(images["palette.png"], palette)
    assert np.abs(images["rgb.jpg"].astype(int) - pixels).mean() < 3
    assert np.abs(images["gray.jpg"].astype(int) - gray[:, :, None]).mean() < 3
    keep = ImageFolder(tmp_path, rgb=False)
    channels = {Path(keep.path(i)).name: keep[i][0].shape[2] for i in range(len(keep))}
    assert channels == {
        "gray.jpg": 1,
        "gray.png": 1,
        "palette.png": 3,
        "rgb.jpg": 3,
        "rgb.png": 3,
        "rgba.png": 4,
    }


def test_simplejpeg_and_pillow_decode_the_same(tmp_path: Path) -> None:
    pytest.importorskip("simplejpeg", reason="compares the simplejpeg decoder with Pillow's")
    write(tmp_path / "a/photo.jpg", gradient(61, 83))
    fast = ImageFolder(tmp_path, decode="simplejpeg")[0][0]
    slow = ImageFolder(tmp_path, decode="pillow")[0][0]
    assert fast.shape == (61, 83, 3) and np.array_equal(fast, slow)


@pytest.mark.parametrize("decode", ["simplejpeg", "pillow"])
def test_reduced_size_decoding(tmp_path: Path, decode: str) -> None:
    if decode == "simplejpeg":
        pytest.importorskip("simplejpeg", reason="reduced decoding through simplejpeg")
    pixels = gradient(600, 800)
    write(tmp_path / "a/big.jpg", pixels)
    full = ImageFolder(tmp_path, decode=decode)[0][0]
    for hint, shape in [
        (200, (300, 400, 3)),
        (150, (150, 200, 3)),
        (75, (75, 100, 3)),
        (10, (75, 100, 3)),
        ((300, 200), (300, 400, 3)),
        (301, (600, 800, 3)),
    ]:
        image = ImageFolder(tmp_path, decode=decode, size_hint=hint)[0][0]
        assert image.shape == shape, hint
        reference = np.asarray(
            Image.fromarray(full).resize((shape[1], shape[0]), Image.Resampling.BOX)
        ).astype(int)
        assert np.abs(image.astype(int) - reference).mean() < 2.0, hint


def test_size_hint_comes_from_the_transform_and_full_turns_it_off(tmp_path: Path) -> None:
    write(tmp_path / "a/big.jpg", gradient(1200, 1600))
    seen: list[tuple[int, ...]] = []

    def spy(image: np.ndarray) -> np.ndarray:
        seen.append(image.shape)
        return image

    ImageFolder(tmp_path, transform=Compose([spy]))[0]
    ImageFolder(tmp_path, transform=Compose([Resize(256), spy]))[0]  # decoded at 1/4: 300 x 400
    ImageFolder(tmp_path, transform=Compose([Resize(256), spy]), size_hint="full")[0]
    ImageFolder(tmp_path, transform=Compose([CenterCrop(256), spy]))[0]  # a crop needs every pixel
    assert seen == [(1200, 1600, 3), (256, 341, 3), (256, 341, 3), (256, 256, 3)]
    reduced = ImageFolder(tmp_path, transform=eval_transform(224))[0][0]
    full = ImageFolder(tmp_path, transform=eval_transform(224), size_hint="full")[0][0]
    assert reduced.shape == full.shape == (3, 224, 224)
    assert np.abs(reduced - full).mean() < 0.02  # normalised units: about a grey level


def test_corrupt_jpeg_raises_naming_the_file(tmp_path: Path) -> None:
    good = write(tmp_path / "a/good.jpg", gradient(64, 64))
    data = good.read_bytes()
    bad = tmp_path / "a/bad_été.jpg"
    bad.write_bytes(data[: len(data) // 2])
    folder = ImageFolder(tmp_path)
    assert Path(folder.path(0)).name == "bad_été.jpg"
    for decode in ("auto", "pillow", "pil"):
        with pytest.raises(
            ImageDecodeError,
            match=rf"cannot decode {re.escape(str(bad))}: .*truncated.* pass on_error='skip'",
        ) as info:
            ImageFolder(tmp_path, decode=decode)[0]
        assert info.value.filename == str(bad)
    assert isinstance(info.value, DatasetError) and isinstance(info.value, ValueError)


def test_corrupt_jpeg_is_skipped_and_reported_by_the_loader(tmp_path: Path) -> None:
    for i in range(5):
        write(tmp_path / f"a/{i}.jpg", gradient(16, 16))
    (tmp_path / "a/2.jpg").write_bytes(b"\xff\xd8\xff\xe0 this is not a jpeg")
    loader = DataLoader(ImageFolder(tmp_path), batch_size=5, on_error="skip", max_errors=None)
    batches = list(loader)
    assert len(batches) == 1 and batches[0][0].shape == (4, 16, 16, 3)
    report = loader.error_report()
    assert [s.index for s in report] == [2]
    assert (
        report[0].source == str(tmp_path / "a/2.jpg") and report[0].error_type == "ImageDecodeError"
    )
    assert str(tmp_path / "a/2.jpg") in str(report)


def test_unreadable_file_reports_its_path(tmp_path: Path) -> None:
    folder = ImageFolder(make_tree(tmp_path, ["a/1.png"]))
    os.remove(tmp_path / "a/1.png")
    with pytest.raises(FileNotFoundError, match=r"1\.png"):
        folder[0]


# -- transforms and torchvision ------------------------------------------------------------


def test_transforms_receive_arrays_and_labels_go_through_target_transform(tmp_path: Path) -> None:
    folder = ImageFolder(
        make_tree(tmp_path, ["a/1.png", "b/1.png"]),
        transform=lambda im: im.shape,
        target_transform=lambda t: f"class {t}",
    )
    assert folder[1] == ((24, 32, 3), "class 1")


def test_pil_images_for_pil_transforms(tmp_path: Path) -> None:
    root = make_tree(tmp_path, ["a/1.jpg", "a/2.png"])
    write(root / "a/3.png", gradient(24, 32), "L")

    def needs_pil(image: object) -> str:
        assert isinstance(image, Image.Image), type(image)
        assert image.mode == "RGB" and image.size == (32, 24)
        return "ok"

    assert [s[0] for s in ImageFolder(root, transform=needs_pil, decode="pil")] == ["ok"] * 3

    class LooksLikeTorchvision:  # torchvision is not installed: pretend through the module name
        __call__ = staticmethod(needs_pil)

    LooksLikeTorchvision.__module__ = "torchvision.transforms.transforms"
    assert ImageFolder(root, transform=LooksLikeTorchvision())[0][0] == "ok"
    with pytest.raises(AssertionError):
        ImageFolder(root, transform=needs_pil)[0]  # auto gives numpy to anything else


def test_no_file_is_open_after_construction_and_reads(tmp_path: Path) -> None:
    before = _proc.open_fds()
    if not before:
        pytest.skip("counts open files through /proc/self/fd (Linux)")
    root = make_tree(tmp_path, [f"a/{i}.jpg" for i in range(6)])
    folder = ImageFolder(root)
    for i in range(len(folder)):
        folder[i]
    opened = {target for fd, target in _proc.open_fds().items() if fd not in before}
    assert not any(str(root) in target for target in opened)


def test_pickles_for_workers(tmp_path: Path) -> None:
    folder = ImageFolder(make_tree(tmp_path, NAMES), transform=eval_transform(16))
    copy = pickle.loads(pickle.dumps(folder))
    assert copy.samples == folder.samples and copy.classes == folder.classes
    assert np.array_equal(copy[3][0], folder[3][0])


def test_augmented_batches_are_the_same_with_worker_processes(tmp_path: Path) -> None:
    from stoker.vision import train_transform

    for i in range(12):
        write(tmp_path / f"{'ab'[i % 2]}/{i:02d}.jpg", gradient(40 + i, 56))
    folder = ImageFolder(tmp_path, transform=train_transform(24))

    def run(num_workers: int) -> list[np.ndarray]:
        loader = DataLoader(
            folder, batch_size=4, shuffle=True, generator=5, num_workers=num_workers
        )
        return [images for _ in range(2) for images, _ in loader]

    serial, parallel = run(0), run(2)
    assert len(serial) == len(parallel) == 6
    assert all(np.array_equal(a, b) for a, b in zip(serial, parallel, strict=True))
    assert serial[0].shape == (4, 3, 24, 24) and serial[0].dtype == np.float32


def test_argument_errors(tmp_path: Path) -> None:
    root = make_tree(tmp_path, ["a/1.png"])
    with pytest.raises(
        ValueError,
        match=r"decode must be one of \('auto', 'simplejpeg', 'pillow', 'pil'\), got 'turbo'",
    ):
        ImageFolder(root, decode="turbo")
    with pytest.raises(ValueError, match=r"size_hint must be None, a positive int .* got -4"):
        ImageFolder(root, size_hint=-4)
    with pytest.raises(TypeError, match="transform must be a callable or None, got 'resize'"):
        ImageFolder(root, transform="resize")
    with pytest.raises(
        ValueError, match=r"extensions must be file endings such as \('\.jpg', '\.png'\), got \(\)"
    ):
        ImageFolder(root, extensions=())
    assert ".webp" in IMG_EXTENSIONS


def test_decode_image_names_its_source() -> None:
    with pytest.raises(
        ImageDecodeError, match=r"cannot decode an image of 3 bytes: UnidentifiedImageError"
    ):
        decode_image(b"abc")
    buffer = io.BytesIO()
    Image.new("RGB", (10, 10)).save(buffer, "PNG")
    assert decode_image(buffer.getvalue(), to_pil=True).size == (10, 10)


@pytest.mark.skipif(
    sys.platform == "win32", reason="file names with bytes that are not UTF-8 are a POSIX thing"
)
def test_undecodable_file_name_round_trips_through_json(tmp_path: Path) -> None:
    root = tmp_path / "data"
    (root / "a").mkdir(parents=True)
    raw = os.path.join(os.fsencode(root / "a"), b"caf\xe9.png")  # Latin-1 bytes, not UTF-8
    buffer = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buffer, "PNG")
    with open(raw, "wb") as file:
        file.write(buffer.getvalue())
    folder = ImageFolder(root)
    folder.save_index(tmp_path / "i.json")
    again = ImageFolder.from_index(tmp_path / "i.json")
    assert again.path(0) == folder.path(0) and again[0][0].shape == (4, 4, 3)


@pytest.mark.parametrize("decode", ["auto", "pillow", "pil"])
@pytest.mark.parametrize("name", ["a/x.jpg", "b/y.png"])
def test_property_a_truncated_image_raises_naming_the_file_never_gives_other_pixels(
    tmp_path, name, decode
) -> None:
    """Cut anywhere (a sample of offsets, the last bytes included), an image raises an
    ImageDecodeError naming its file. Only a PNG cut in its last 20 bytes (the zlib checksum,
    the chunk CRC and the end chunk: after every pixel) may decode, to the pixels written."""
    noise = np.random.default_rng(0).integers(0, 256, (24, 32, 3), dtype=np.uint8)
    path = write(tmp_path / name, noise)
    write(tmp_path / ("b/y.png" if name.startswith("a/") else "a/x.jpg"))  # the other class
    folder = ImageFolder(tmp_path, decode=decode)
    index = 0 if name.startswith("a/") else 1
    assert os.path.samefile(folder.samples[index][0], path)
    expected = np.asarray(folder[index][0])
    whole = path.read_bytes()
    cuts = sorted({0, 1, 2, *range(3, len(whole), 97), *range(len(whole) - 24, len(whole))})
    decoded = []
    for cut in cuts:
        with truncated(path, cut):
            try:
                image = folder[index][0]
            except ImageDecodeError as exc:
                assert str(exc).startswith(f"cannot decode {folder.samples[index][0]}: "), cut
                assert "corrupt, truncated or not an image" in str(exc), cut
                continue
        assert np.array_equal(np.asarray(image), expected), f"cut at {cut}: other pixels"
        decoded.append(len(whole) - cut)
    assert max(decoded, default=0) <= (20 if name.endswith(".png") else 0), decoded


@pytest.mark.parametrize("url", ["s3://bucket/train", "gs://bucket/train/", "https://host/train"])
def test_a_url_root_is_refused_with_what_to_do_instead(url: str) -> None:
    with pytest.raises(ValueError, match="reads a local folder only") as caught:
        ImageFolder(url)
    assert repr(url) in str(caught.value) and "PackedDataset" in str(caught.value)
