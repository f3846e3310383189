"""The doctor's report: the rendered checklist and its JSON."""

from __future__ import annotations

import json
import re

import pytest

from doctor.synthetic import SMALL, Images, unit_images
from stoker.doctor import check


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
