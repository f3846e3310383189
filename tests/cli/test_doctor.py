"""`stoker doctor TARGET`: module:attr, Python file, packed and image-folder targets, exit codes."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

from stoker.cli import main


@pytest.fixture
def target_module(tmp_path, monkeypatch):
    """A module in the current directory with datasets for `module:attr` targets."""
    source = textwrap.dedent(
        """
        import numpy as np
        from stoker import ArrayDataset

        rng = np.random.default_rng(0)
        images = rng.standard_normal((40, 3, 8, 8)).astype(np.float32)
        clean = ArrayDataset(images, np.arange(40) % 2)

        def make_raw():
            images = rng.random((40, 3, 8, 8)).astype(np.float32) * 255
            return ArrayDataset(images, np.arange(40) % 2)

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


def test_cli_exit_code_1_on_failures_2_on_unusable_targets(target_module, capsys, tmp_path) -> None:
    assert main(["doctor", f"{target_module}:WithNaN"]) == 1
    assert "  FAIL  sample: sample[0] holds 192 NaN or inf values" in capsys.readouterr().out
    for target, message in (
        (
            f"{target_module}:not_a_dataset",
            "doctor_targets_mod:not_a_dataset is a int, not a dataset",
        ),
        (f"{target_module}:missing", "doctor_targets_mod has no attribute 'missing'"),
        ("no_such_module_xyz:thing", "cannot import the module 'no_such_module_xyz'"),
        (
            str(tmp_path / "nowhere"),
            "is neither a directory (an image folder or a packed dataset) nor module:attr",
        ),
    ):
        assert main(["doctor", target]) == 2
        captured = capsys.readouterr()
        assert (
            captured.out == ""
            and captured.err.startswith("stoker doctor: ")
            and message in captured.err
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
    assert "  OK    files: all 12 files are readable images (decoded at reduced scale)" in out
    assert "  OK    sample: sample[0] holds the decoded pixels (uint8, HWC)" in out
    assert "WARN" not in out  # no dtype or layout warnings about stoker's own decoding
    assert "  OK    labels: sample[1]: 2 classes, most common 0 (50%)" in out
    assert "on the 0-1 scale (pixels / 255)" in out
    assert main(["doctor", str(tmp_path / "images"), "--size", "0", "--batch-size", "4"]) == 1
    assert "  FAIL  batches: loading batches of 4 raised CollateError" in capsys.readouterr().out
