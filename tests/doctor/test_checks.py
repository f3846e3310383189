"""stoker.doctor.check: each flag fires on the dataset that deserves it."""

from __future__ import annotations

import re

import numpy as np
import pytest

from doctor.synthetic import (
    SMALL,
    Images,
    finding,
    flags,
    seeded_noise,
    standardised,
    unit_images,
    unseeded_noise,
)
from stoker import ArrayDataset, Dataset, IterableDataset
from stoker.doctor import check

# ------------------------------------------------------------------ the value-range and layout
# flags


def test_float_images_in_0_255_are_flagged() -> None:
    report = check(Images(unit_images() * 255), **SMALL)
    assert flags(report) == {"0-255"}
    warn = finding(report, "sample", "warn")
    assert "pixel values that were never scaled; divide by 255" in warn.message
    stats = finding(report, "stats")
    assert stats.data["scale"] == 255.0, (
        "statistics are reported on the 0-1 scale Normalize expects"
    )
    assert report.exit_code == 0, "warnings do not fail"


def test_uint8_images_are_flagged() -> None:
    images = (unit_images() * 255).astype(np.uint8)
    report = check(Images(images), **SMALL)
    assert flags(report) == {"uint8"}
    assert "raw uint8 pixels (0-255)" in finding(report, "sample", "warn").message


def test_images_in_0_1_that_forgot_normalize_are_flagged_and_stats_are_exact() -> None:
    images = unit_images()
    report = check(Images(images), **SMALL)
    assert flags(report) == {"0-1"}
    assert (
        "scaled but not standardised (ToTensor without Normalize)"
        in finding(report, "sample", "warn").message
    )
    # stats over every sample (stats_samples == len) equal numpy's float64 per-channel figures
    channels = images.astype(np.float64).transpose(1, 0, 2, 3).reshape(3, -1)
    np.testing.assert_allclose(report.mean, channels.mean(axis=1), rtol=1e-10)
    np.testing.assert_allclose(report.std, channels.std(axis=1), rtol=1e-10)
    assert report.stats_field == "sample[0]"
    text = report.render()
    paste = re.search(r"paste: Normalize\(mean=\[([^\]]+)\], std=\[([^\]]+)\]\)", text)
    assert paste is not None, text
    assert [float(v) for v in paste.group(1).split(",")] == pytest.approx(report.mean, abs=1e-4)


def test_channels_last_float_images_are_flagged() -> None:
    report = check(Images(standardised(shape=(16, 16, 3))), **SMALL)
    assert flags(report) == {"HWC"}
    warn = finding(report, "sample", "warn")
    assert (
        "shape (16, 16, 3), channels last (HWC), where models expect CHW (3, 16, 16)"
        in warn.message
    )
    assert finding(report, "stats").message.endswith(
        "(3 channels, HWC); already standardised (mean ~0, std ~1): no Normalize to add"
    )
    assert not any(line.startswith("paste:") for line in finding(report, "stats").details)


def test_a_plain_numpy_array_dataset_is_clean() -> None:
    images = standardised()
    report = check(ArrayDataset(images, np.arange(64) % 8), **SMALL)
    assert report.ok and not report.warnings, report.render()
    assert "looks standardised" in report.render()
    bare = check(images, **SMALL)  # a bare ndarray is a map-style dataset too
    assert bare.ok and not bare.warnings and finding(bare, "labels").status == "skip"
    assert finding(bare, "sample").message == "sample 0 is a ndarray of 1 field"


def test_nan_values_fail() -> None:
    images = standardised()
    images[0, 1, 2, 3] = np.nan
    report = check(Images(images), **SMALL)
    assert finding(report, "sample", "fail").message == "sample[0] holds 1 NaN or inf values"
    assert report.exit_code == 1
    assert report.render().splitlines()[-1].startswith("result: FAILED (")


# ------------------------------------------------------------------ the same index twice


def test_deterministic_transform() -> None:
    report = check(Images(standardised()), **SMALL)
    assert finding(report, "transform").data == {"random": False}
    assert "deterministic transform: sample 0 is identical when fetched twice" in report.render()


def test_random_transform_drawing_from_sample_rng_is_reproducible() -> None:
    report = check(Images(standardised(), transform=seeded_noise), **SMALL)
    statuses = [(f.status, dict(f.data)) for f in report.findings if f.check == "transform"]
    assert statuses == [("ok", {"random": True}), ("ok", {"reproducible": True})]


def test_random_transform_from_an_unseeded_generator_is_flagged() -> None:
    report = check(Images(standardised(), transform=unseeded_noise), **SMALL)
    warn = finding(report, "transform", "warn")
    assert warn.data == {"reproducible": False}
    assert "draw from stoker.sample_rng() instead" in warn.message


# ------------------------------------------------------------------ labels, batches, shuffle


def test_imbalanced_labels_are_flagged() -> None:
    labels = np.zeros(200, dtype=np.int64)
    labels[::50] = 1  # 4 of 200
    report = check(
        Images(standardised(200), labels), batch_size=16, num_batches=2, stats_samples=200
    )
    warn = finding(report, "labels", "warn")
    assert warn.message == (
        "sample[1] is imbalanced: class 0 has 98% of 200 samples, 49x class 1; "
        "consider WeightedRandomSampler or a weighted loss"
    )
    assert warn.data["counts"] == {0: 196, 1: 4}


def test_balanced_labels_pass_and_dataset_targets_are_used() -> None:
    class WithTargets(Images):
        @property
        def targets(self) -> np.ndarray:
            return self.labels

    report = check(WithTargets(standardised(400), np.arange(400) % 5), **SMALL)
    ok = finding(report, "labels", "ok")
    assert ok.data["source"] == "the dataset's targets"
    assert ok.data["counts"] == dict.fromkeys(range(5), 80)
    assert ok.message == "sample[1]: 5 classes, most common 0 (20%)"


def test_dict_samples_find_their_label_by_name() -> None:
    class Records(Dataset):
        def __len__(self) -> int:
            return 40

        def __getitem__(self, i):
            return {"x": np.full(3, i, dtype=np.float32), "target": i % 2, "id": 1000 + i}

    report = check(Records(), **SMALL)
    assert finding(report, "labels").data["field"] == "sample['target']"
    stats = finding(report, "stats")  # a short 1-D float field: a mean and std per feature
    assert stats.message == "mean and std of sample['x'] over 40 samples (3 features)"
    assert report.mean == pytest.approx([19.5] * 3) and report.std == pytest.approx(
        [np.arange(40).std()] * 3
    )
    batches = finding(report, "batches")
    assert batches.data["shapes"] == {
        "sample['x']": "float32 (8, 3)",
        "sample['target']": "int64 (8,)",
        "sample['id']": "int64 (8,)",
    }


def test_batches_and_shuffle_across_epochs() -> None:
    report = check(Images(standardised()), batch_size=8, num_batches=3)
    batches = finding(report, "batches", "ok")
    assert batches.message == "3 batches of 8 through DataLoader(shuffle=True)"
    assert batches.data["shapes"] == {
        "sample[0]": "float32 (8, 3, 16, 16)",
        "sample[1]": "int64 (8,)",
    }
    shuffle = finding(report, "shuffle", "ok")
    assert shuffle.data == {"changes": True}
    first, second = (re.search(r"epoch \d starts (.*)", d).group(1) for d in shuffle.details)
    assert first != second


def test_samples_that_do_not_batch_fail_with_the_collate_error() -> None:
    class Ragged(Dataset):
        def __len__(self) -> int:
            return 20

        def __getitem__(self, i):
            return np.zeros((3, 8 + i % 3, 8), dtype=np.float32), 0

    report = check(Ragged(), **SMALL)
    fail = finding(report, "batches", "fail")
    assert fail.message.startswith("loading batches of 8 raised CollateError")
    assert report.exit_code == 1


class Stream(IterableDataset):
    def __iter__(self):
        for i in range(50):
            yield np.full((3, 8, 8), i / 50, dtype=np.float32), i % 3


def test_an_iterable_dataset_skips_the_index_checks_and_flags_a_fixed_order() -> None:
    report = check(Stream(), **SMALL)
    assert finding(report, "length").message == "a stream (iterable dataset) without a length"
    assert finding(report, "transform").status == "skip"
    warn = finding(report, "shuffle", "warn")
    assert "the stream yields the same batches in the same order every epoch" in warn.message
    assert finding(report, "stats").data["samples"] == 50
    assert finding(report, "labels").data["source"] == "the first samples"


# ------------------------------------------------------------------ broken datasets


def test_an_empty_dataset_fails_and_stops() -> None:
    report = check(ArrayDataset(np.zeros((0, 3))))
    assert [(f.check, f.status) for f in report.findings] == [
        ("length", "fail"),
        ("checks", "skip"),
    ]
    assert "the dataset is empty" in report.render()


def test_a_failing_getitem_fails_the_sample_check() -> None:
    class Broken(Dataset):
        def __len__(self) -> int:
            return 10

        def __getitem__(self, i):
            raise FileNotFoundError("data/000.jpg")

    report = check(Broken())
    assert (
        finding(report, "sample", "fail").message
        == "fetching sample 0 raised FileNotFoundError: data/000.jpg"
    )
    assert report.exit_code == 1


def test_argument_errors() -> None:
    with pytest.raises(ValueError, match=r"batch_size must be a positive integer, got 0"):
        check(standardised(), batch_size=0)
    with pytest.raises(ValueError, match=r"index must be a non-negative integer, got -1"):
        check(standardised(), index=-1)
