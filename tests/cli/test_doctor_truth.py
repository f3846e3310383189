"""`stoker doctor`, run as a real process on real files: bad files fail, stoker's own decoding
draws no dtype or layout warnings, no Normalize advice for normalised data, exit statuses."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import stoker

pytest.importorskip("PIL", reason="writes JPEG files with Pillow (the image extra)")
from PIL import Image

SRC = str(Path(stoker.__file__).resolve().parents[1])


def doctor(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [SRC, env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "stoker", "doctor", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )


def jpeg(seed: int, size: tuple[int, int] = (40, 48)) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


@pytest.fixture
def good_folder(tmp_path: Path) -> Path:
    root = tmp_path / "good"
    for c, name in enumerate(("cat", "dog")):
        (root / name).mkdir(parents=True)
        for i in range(20):
            (root / name / f"{i:02d}.jpg").write_bytes(jpeg(100 * c + i))
    return root


@pytest.fixture
def bad_folder(good_folder: Path) -> Path:
    whole = jpeg(999, (64, 64))
    (good_folder / "cat" / "zz_truncated.jpg").write_bytes(whole[: len(whole) // 2])
    (good_folder / "dog" / "x.jpg").write_text("this is a text file, not a JPEG\n")
    return good_folder


ARGS = ("--size", "32", "--batch-size", "4", "--num-batches", "2", "--stats-samples", "8")


def test_a_good_folder_is_ok_without_warnings_about_stokers_own_decoding(good_folder: Path) -> None:
    result = doctor(str(good_folder), *ARGS)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "  OK    files: all 40 files are readable images (decoded at reduced scale)" in out
    assert "  OK    sample: sample[0] holds the decoded pixels (uint8, HWC)" in out
    assert "WARN" not in out and "raw uint8" not in out and "channels last" not in out
    assert "paste: Normalize(mean=[" in out
    assert out.rstrip().splitlines()[-1] == "result: OK (10 ok, 0 warnings, 0 failures)"


def test_a_truncated_jpeg_and_a_text_file_fail_and_exit_1(bad_folder: Path) -> None:
    # sample 0 and the few samples the other checks read are all good files
    result = doctor(str(bad_folder), *ARGS)
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    lines = out.splitlines()
    assert (
        "  FAIL  files: 2 of 42 files are not a readable image (decoded at reduced scale)" in lines
    )
    truncated = next(line for line in lines if "zz_truncated.jpg" in line)
    assert truncated.strip().startswith(str(bad_folder / "cat" / "zz_truncated.jpg"))
    assert "corrupt image: OSError: image file is truncated" in truncated
    text = next(line for line in lines if "x.jpg" in line)
    named = str(bad_folder / "dog" / "x.jpg")
    assert f"corrupt image: UnidentifiedImageError: cannot identify image file {named!r}" in text
    assert "BytesIO" not in out  # Pillow's name for the bytes it read means nothing to users
    assert lines[-1].startswith("result: FAILED (") and "failure" in lines[-1]


def test_verify_misses_truncation_and_none_skips_the_files_check(bad_folder: Path) -> None:
    verify = doctor(str(bad_folder), *ARGS, "--check", "verify")
    assert (
        "  FAIL  files: 1 of 42 files is not a readable image (verified by Pillow" in verify.stdout
    )
    assert verify.returncode == 1
    skipped = doctor(str(bad_folder), *ARGS, "--check", "none")
    assert "  SKIP  files: the files were not checked (files='none')" in skipped.stdout


DATA = textwrap.dedent(
    """
    import numpy as np
    from stoker import ArrayDataset

    rng = np.random.default_rng(0)
    labels = np.arange(64) % 4
    standard = ArrayDataset(rng.standard_normal((64, 3, 16, 16)).astype(np.float32), labels)
    centred = ArrayDataset((rng.random((64, 3, 16, 16)) * 2 - 1).astype(np.float32), labels)
    unit = ArrayDataset(rng.random((64, 3, 16, 16)).astype(np.float32), labels)
    """
)


@pytest.fixture
def data_file(tmp_path: Path) -> str:
    (tmp_path / "data.py").write_text(DATA)
    return str(tmp_path / "data.py")


def test_no_normalize_advice_for_normalised_data(data_file: str) -> None:
    standard = doctor(f"{data_file}:standard")
    assert standard.returncode == 0
    assert "already standardised (mean ~0, std ~1): no Normalize to add" in standard.stdout
    assert "paste:" not in standard.stdout
    centred = doctor(f"{data_file}:centred")
    assert centred.returncode == 0
    assert "already normalised (values go down to -1, so a mean was subtracted)" in centred.stdout
    assert "paste:" not in centred.stdout


def test_unscaled_data_gets_the_advice_and_warnings_alone_exit_0(data_file: str) -> None:
    result = doctor(f"{data_file}:unit")
    assert result.returncode == 0
    assert "  WARN  sample: sample[0] is in [0, 1]" in result.stdout
    assert "paste: Normalize(mean=[0.4995, 0.4991, 0.4988]" in result.stdout
    assert result.stdout.rstrip().endswith("1 warning, 0 failures)")


def _stats(*args: str) -> dict[str, object]:
    result = doctor(*args, "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    [stats] = [f["data"] for f in report["findings"] if f["check"] == "stats"]
    return {"mean": stats["mean"], "std": stats["std"], "target": report["target"]}


def test_a_folder_and_its_packed_copies_report_the_same_pixel_stats(tmp_path: Path) -> None:
    from stoker.formats.packed import PackedWriter

    folder = tmp_path / "photos"
    for c, name in enumerate(("cat", "dog")):
        (folder / name).mkdir(parents=True)
        for i in range(3):  # large enough that --size 64 decodes the JPEGs at reduced size
            (folder / name / f"{i}.jpg").write_bytes(jpeg(10 * c + i, (260, 300)))
    packed = tmp_path / "packed"
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")]))
    )
    subprocess.run([sys.executable, "-m", "stoker", "pack", str(folder), str(packed)],
                   check=True, capture_output=True, env=env, timeout=300)  # fmt: skip
    # a pack of (image bytes, label) records written by a script: told apart by its schema
    written = tmp_path / "written"
    with PackedWriter(str(written), classes=["cat", "dog"]) as writer:
        for label, name in enumerate(("cat", "dog")):
            for path in sorted((folder / name).iterdir()):
                writer.add((path.read_bytes(), label))
    args = ("--size", "64", "--batch-size", "2", "--num-batches", "1", "--stats-samples", "6")
    from_folder = _stats(str(folder), *args)
    from_pack = _stats(str(packed), *args)
    from_written = _stats(str(written), *args)
    assert from_folder.pop("target") == f"image folder {folder} (resized and cropped to 64)"
    assert from_pack.pop("target") == f"packed images {packed} (decoded, resized and cropped to 64)"
    assert (
        from_written.pop("target")
        == f"packed images {written} (decoded, resized and cropped to 64)"
    )
    assert from_folder == from_pack == from_written
