"""stoker.doctor.check and `stoker doctor`: each flag fires on the dataset that deserves it."""

from __future__ import annotations

import json
import re
import textwrap

import numpy as np
import pytest

from stoker import ArrayDataset, Dataset, IterableDataset, sample_rng
from stoker.cli import main
from stoker.doctor import DoctorReport, Finding, check

# ------------------------------------------------------------------ synthetic datasets


class Images(Dataset):
    """``(image, label)`` pairs from a fixed array, with an optional transform."""

    def __init__(
        self, images: np.ndarray, labels: np.ndarray | None = None, transform=None
    ) -> None:
        self.images = images
        self.labels = np.arange(len(images)) % 4 if labels is None else labels
        self.transform = transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i):
        image = self.images[i]
        if self.transform is not None:
            image = self.transform(image)
        return image, int(self.labels[i])


def unit_images(n: int = 64, shape=(3, 16, 16)) -> np.ndarray:
    return np.random.default_rng(0).random((n, *shape)).astype(np.float32)


def standardised(n: int = 64, shape=(3, 16, 16)) -> np.ndarray:
    return np.random.default_rng(1).standard_normal((n, *shape)).astype(np.float32)


def seeded_noise(image: np.ndarray) -> np.ndarray:
    return image + sample_rng().normal(0, 0.1, image.shape).astype(np.float32)


def unseeded_noise(image: np.ndarray) -> np.ndarray:
    return image + np.random.default_rng().normal(0, 0.1, image.shape).astype(np.float32)


def flags(report: DoctorReport) -> set[str]:
    return {f.data["flag"] for f in report.findings if "flag" in f.data}


def finding(report: DoctorReport, check_name: str, status: str | None = None) -> Finding:
    found = [
        f
        for f in report.findings
        if f.check == check_name and (status is None or f.status == status)
    ]
    assert found, f"no {check_name}/{status} finding in:\n{report.render()}"
    return found[0]


SMALL = {"batch_size": 8, "num_batches": 2, "stats_samples": 64}


# ------------------------------------------------------------------ the value-range and layout flags


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
        "(3 channels, HWC); already standardised (mean ~0, std ~1)"
    )


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


# ------------------------------------------------------------------ the rendered report


def test_rendered_text_reads_as_a_checklist() -> None:
    report = check(Images(unit_images() * 255), **SMALL, target="my images")
    lines = report.render().splitlines()
    assert lines[0] == "stoker doctor: my images"
    assert lines[1] == "  OK    length: 64 samples"
    assert lines[2] == "  OK    sample: sample 0 is a tuple of 2 fields"
    assert re.fullmatch(
        r" {10}sample\[0\] +float32 \(3, 16, 16\)  min \S+  max \S+  mean \S+  std \S+", lines[3]
    )
    assert lines[4] == " " * 10 + "sample[1]            int = 0"
    assert lines[5].startswith("  WARN  sample: sample[0] is float with values in [")
    assert any(line.startswith("  OK    workers: pickles for process workers (") for line in lines)
    assert (
        " " * 10 + "on the 0-1 scale (pixels / 255), as Normalize after ToTensor expects:" in lines
    )
    assert lines[-1] == "result: OK (8 ok, 1 warning, 0 failures)"
    assert str(report) == report.render()


def test_json_round_trips() -> None:
    report = check(Images(unit_images()), **SMALL)
    data = json.loads(report.to_json())
    assert data["ok"] is True and data["exit_code"] == 0
    assert [f["check"] for f in data["findings"]][:2] == ["length", "sample"]
    assert data["normalize"]["field"] == "sample[0]"
    assert data["normalize"]["mean"] == pytest.approx(list(report.mean))


# ------------------------------------------------------------------ the command line


@pytest.fixture
def target_module(tmp_path, monkeypatch):
    """A module in the current directory with datasets for `module:attr` targets."""
    source = textwrap.dedent(
        """
        import numpy as np
        from stoker import ArrayDataset

        rng = np.random.default_rng(0)
        clean = ArrayDataset(rng.standard_normal((40, 3, 8, 8)).astype(np.float32), np.arange(40) % 2)

        def make_raw():
            return ArrayDataset(rng.random((40, 3, 8, 8)).astype(np.float32) * 255, np.arange(40) % 2)

        class WithNaN:
            def __len__(self):
                return 10
            def __getitem__(self, i):
                return np.full((3, 8, 8), np.nan, dtype=np.float32), 0

        not_a_dataset = 42
        """
    )
    (tmp_path / "doctor_targets_mod.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    return "doctor_targets_mod"


def test_cli_module_attr_object(target_module, capsys) -> None:
    assert (
        main(["doctor", f"{target_module}:clean", "--batch-size", "8", "--num-batches", "2"]) == 0
    )
    out = capsys.readouterr().out
    assert out.startswith(f"stoker doctor: {target_module}:clean\n")
    assert "  OK    batches: 2 batches of 8 through DataLoader(shuffle=True)" in out
    assert out.rstrip().endswith("0 failures)")


def test_cli_module_attr_factory_and_json(target_module, capsys) -> None:
    assert main(["doctor", f"{target_module}:make_raw", "--json", "--stats-samples", "20"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {f["data"].get("flag") for f in data["findings"]} >= {"0-255"}
    assert data["normalize"]["mean"][0] == pytest.approx(0.5, abs=0.05)


def test_cli_exit_code_1_on_failures(target_module, capsys, tmp_path) -> None:
    assert main(["doctor", f"{target_module}:WithNaN"]) == 1
    assert "  FAIL  sample: sample[0] holds 192 NaN or inf values" in capsys.readouterr().out
    assert main(["doctor", f"{target_module}:not_a_dataset"]) == 1
    assert "doctor_targets_mod:not_a_dataset is a int, not a dataset" in capsys.readouterr().out
    assert main(["doctor", f"{target_module}:missing"]) == 1
    assert "doctor_targets_mod has no attribute 'missing'" in capsys.readouterr().out
    assert main(["doctor", "no_such_module_xyz:thing"]) == 1
    assert "cannot import the module 'no_such_module_xyz'" in capsys.readouterr().out
    assert main(["doctor", str(tmp_path / "nowhere")]) == 1
    assert (
        "is neither a directory (an image folder or a packed dataset) nor module:attr"
        in capsys.readouterr().out
    )


def test_cli_python_file_target(target_module, tmp_path, capsys) -> None:
    assert main(["doctor", str(tmp_path / f"{target_module}.py") + ":clean", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True


def test_cli_packed_dataset_directory(tmp_path, capsys) -> None:
    packed = pytest.importorskip(
        "stoker.formats.packed", reason="the packed format is a sibling module"
    )
    rng = np.random.default_rng(0)
    with packed.PackedWriter(str(tmp_path / "packed")) as writer:
        for i in range(30):
            writer.add({"image": rng.random((3, 8, 8)).astype(np.float32), "label": i % 3})
    assert (
        main(["doctor", str(tmp_path / "packed"), "--batch-size", "4", "--num-batches", "2"]) == 0
    )
    out = capsys.readouterr().out
    assert out.startswith(f"stoker doctor: packed dataset {tmp_path / 'packed'}\n")
    assert "  OK    labels: sample['label']: 3 classes" in out
    assert "paste: Normalize(mean=[" in out


def test_cli_image_folder(tmp_path, capsys) -> None:
    pytest.importorskip("PIL", reason="writes PNG files with Pillow")
    pytest.importorskip("stoker.formats.image_folder", reason="ImageFolder is a sibling module")
    from PIL import Image

    rng = np.random.default_rng(0)
    for name in ["cat", "dog"]:
        (tmp_path / "images" / name).mkdir(parents=True)
        for i in range(6):
            pixels = rng.integers(0, 256, size=(20 + 3 * i, 24, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / "images" / name / f"{i}.png")
    args = [
        "doctor",
        str(tmp_path / "images"),
        "--size",
        "16",
        "--batch-size",
        "4",
        "--num-batches",
        "2",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "(resized and cropped to 16)" in out.splitlines()[0]
    assert "  OK    batches: 2 batches of 4 through DataLoader(shuffle=True)" in out
    assert "batch[0]             uint8 (4, 16, 16, 3)" in out
    assert "  WARN  sample: sample[0] is raw uint8 pixels (0-255)" in out
    assert "  OK    labels: sample[1]: 2 classes, most common 0 (50%)" in out
    assert "on the 0-1 scale (pixels / 255)" in out
    assert main(["doctor", str(tmp_path / "images"), "--size", "0", "--batch-size", "4"]) == 1
    assert "  FAIL  batches: loading batches of 4 raised CollateError" in capsys.readouterr().out
