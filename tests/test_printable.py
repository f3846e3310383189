"""stoker._printable: user data (file names, keys, URLs) shown with its control characters
escaped, in the library's messages as in the command line's lines."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stoker import DataLoader, ImageDecodeError
from stoker._printable import printable, printable_lines
from stoker.bad_samples import skipped_sample
from stoker.doctor import DoctorReport, Finding

CLEAR = "bad\x1b[2Jname.jpg"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("photos/cat/1.jpg", "photos/cat/1.jpg"),
        ("chat_été/猫.jpg", "chat_été/猫.jpg"),  # printable beyond ASCII stays as it is
        (CLEAR, "bad\\x1b[2Jname.jpg"),
        ("a\x07b\x7fc\x9bd", "a\\x07b\\x7fc\\x9bd"),  # BEL, DEL, the 8-bit CSI
        ("two\nlines\tand\rreturn", "two\\nlines\\tand\\rreturn"),
        ("right\u202eto-left", "right\\u202eto-left"),  # an override that reverses the text
        (os.fsdecode(b"caf\xff.jpg"), "caf\\xff.jpg"),  # a byte not valid in the encoding
        ("C:\\data\\x.jpg", "C:\\data\\x.jpg"),  # backslashes stay single
    ],
)
def test_printable_escapes_what_the_terminal_would_act_on(text: str, shown: str) -> None:
    assert printable(text) == shown
    assert printable(Path(text)) == printable(os.fspath(Path(text)))


def test_printable_lines_keeps_the_line_breaks_of_the_text() -> None:
    assert printable_lines(f"first {CLEAR}\nsecond\x1b[1A") == (
        "first bad\\x1b[2Jname.jpg\nsecond\\x1b[1A"
    )


def test_a_doctor_report_renders_names_escaped() -> None:
    finding = Finding("files", "fail", f"1 file is bad: {CLEAR}", (f"photos/{CLEAR}: corrupt",))
    text = DoctorReport(f"image folder photos/{CLEAR}", (finding,)).render()
    assert "\x1b" not in text and text.count("bad\\x1b[2Jname.jpg") == 3


def test_a_skipped_sample_is_described_escaped() -> None:
    error = OSError(f"cannot read {CLEAR}")
    error.filename = f"photos/{CLEAR}"
    text = skipped_sample(object(), 3, error).describe()
    assert "\x1b" not in text and "photos/bad\\x1b[2Jname.jpg" in text


def test_a_corrupt_image_is_named_escaped(tmp_path: Path) -> None:
    pytest.importorskip("PIL", reason="decodes with Pillow (the image extra)")
    from stoker.formats.image_folder import ImageFolder

    (tmp_path / "cat").mkdir()
    (tmp_path / "cat" / CLEAR).write_bytes(b"not an image")
    with pytest.raises(ImageDecodeError) as caught:
        ImageFolder(tmp_path)[0]
    assert "\x1b" not in str(caught.value) and "bad\\x1b[2Jname.jpg" in str(caught.value)
    loader = DataLoader(ImageFolder(tmp_path), batch_size=None, on_error="skip")
    assert list(loader) == []
    report = str(loader.error_report())
    assert "\x1b" not in report and "bad\\x1b[2Jname.jpg" in report
