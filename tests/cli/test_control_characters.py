"""File names holding control characters reach the terminal escaped, never raw: a name like
``bad\\x1b[2Jname.jpg`` printed as it is would clear the screen of whoever reads the output.
The real commands run in a subprocess over real files named that way."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import stoker

pytest.importorskip("PIL", reason="writes JPEG files with Pillow (the image extra)")
from PIL import Image

SRC = str(Path(stoker.__file__).resolve().parents[1])
CLEAR = "bad\x1b[2Jname.jpg"  # ESC [ 2 J: clears the screen
TITLE = "ok\x1b]0;pwned\x07.jpg"  # OSC 0: sets the terminal's title
TWO_LINES = "two\nlines.jpg"
RAW = (b"\x1b", b"\x07", b"\x9b")  # ESC, BEL, the 8-bit CSI


def stoker_run(*args: str) -> subprocess.CompletedProcess[bytes]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [SRC, env.get("PYTHONPATH")]))
    env["PYTHONIOENCODING"] = "utf-8"
    return subprocess.run(
        [sys.executable, "-m", "stoker", *args],
        capture_output=True,
        env=env,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )


def jpeg(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (24, 32, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """Two classes of good images, one named with an OSC sequence, and two corrupt files
    whose names hold a screen-clearing sequence and a newline."""
    root = tmp_path / "photos"
    for label, name in enumerate(("cat", "dog")):
        (root / name).mkdir(parents=True)
        for i in range(3):
            (root / name / f"{i}.jpg").write_bytes(jpeg(10 * label + i))
    (root / "cat" / CLEAR).write_bytes(b"not an image")
    (root / "dog" / TWO_LINES).write_bytes(b"not an image either")
    (root / "dog" / TITLE).write_bytes(jpeg(99))
    return root


def _escaped(text: str) -> bytes:
    return text.encode("unicode_escape").replace(b"\\\\", b"\\")


def assert_escaped(result: subprocess.CompletedProcess[bytes], *names: str) -> str:
    output = result.stdout + result.stderr
    for raw in RAW:
        assert raw not in output, (raw, output)
    for name in names:
        assert _escaped(name) in output, (_escaped(name), output)
    assert b"two\nlines" not in output
    return output.decode()


def test_pack_prints_control_characters_escaped(folder: Path, tmp_path: Path) -> None:
    result = stoker_run("pack", str(folder), str(tmp_path / "packed"))
    assert result.returncode == 0, result.stderr
    text = assert_escaped(result, CLEAR, TWO_LINES)
    assert "bad\\x1b[2Jname.jpg" in text and "two\\nlines.jpg" in text
    # the list of skipped files keeps the real names, one per line, for a program to read
    listing = (tmp_path / "packed" / "skipped.txt").read_text(encoding="utf-8")
    assert f"cat/{CLEAR}\t" in listing


def test_pack_errors_name_such_paths_escaped(folder: Path, tmp_path: Path) -> None:
    missing = tmp_path / "gone\x1b[2J"
    assert_escaped(stoker_run("pack", str(missing), str(tmp_path / "out")), "gone\x1b[2J")
    listed = tmp_path / "list.txt"
    listed.write_text("cat/0.jpg\nno-such-\x1b[2J.jpg\n", encoding="utf-8")
    result = stoker_run("pack", str(folder), str(tmp_path / "out2"), "--files", str(listed))
    assert result.returncode == 0, result.stderr
    assert_escaped(result, "no-such-\x1b[2J.jpg")


def test_doctor_prints_control_characters_escaped(folder: Path) -> None:
    result = stoker_run("doctor", str(folder), "--size", "16", "--stats-samples", "4")
    assert result.returncode == 1, result.stderr  # the corrupt files fail the files check
    text = assert_escaped(result, CLEAR, TWO_LINES)
    assert "bad\\x1b[2Jname.jpg" in text
    as_json = stoker_run("doctor", str(folder), "--size", "16", "--stats-samples", "4", "--json")
    assert as_json.returncode == 1
    assert not any(raw in as_json.stdout + as_json.stderr for raw in RAW)


def test_doctor_names_a_missing_target_escaped(tmp_path: Path) -> None:
    result = stoker_run("doctor", str(tmp_path / "gone\x1b[2J"))
    assert result.returncode == 2
    assert_escaped(result, "gone\x1b[2J")


def test_bench_names_an_unreadable_image_escaped(tmp_path: Path) -> None:
    root = tmp_path / "photos"
    (root / "cat").mkdir(parents=True)
    (root / "cat" / CLEAR).write_bytes(b"not an image")
    result = stoker_run(
        "bench", str(root), "--size", "16", "--batches", "1", "--warmup", "0", "--workers", "0",
        "--no-plot", "--batch-size", "1",
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert_escaped(result, CLEAR)
