"""TextLines and JsonLines on damaged files: a bad line costs that line; bad gzip is named."""

from __future__ import annotations

import gzip
import json
import logging
import os
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from formats.damage import bits_to_try, flipped, silent_deflate_flips, truncated
from stoker import DatasetError
from stoker.formats.text import JsonLines, TextLines

INVALID_UTF8 = [b"\xff", b"\xc3", b"\xe2\x28\xa1", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"]


@pytest.fixture(autouse=True)
def no_topology_in_the_environment(monkeypatch) -> None:
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


def jsonl_bytes(n: int) -> list[bytes]:
    return [json.dumps({"i": i, "text": f"ligne {i} é"}).encode() for i in range(n)]


def write_lines(path, lines: list[bytes]) -> str:
    data = b"".join(line + b"\n" for line in lines)
    with open(path, "wb") as f:
        f.write(gzip.compress(data, mtime=0) if str(path).endswith(".gz") else data)
    return str(path)


def spoil(line: bytes, bad: bytes, at: int) -> bytes:
    at = min(at, len(line) - 1)
    return line[:at] + bad + line[at:]


@pytest.mark.parametrize("name", ["big.jsonl", "big.jsonl.gz"])
def test_one_invalid_utf8_byte_costs_exactly_its_line(tmp_path, name, caplog) -> None:
    lines = jsonl_bytes(5000)
    lines[2500] = spoil(lines[2500], b"\xff", 12)
    path = write_lines(tmp_path / name, lines)
    ds = JsonLines([path], on_error="skip")
    with caplog.at_level(logging.WARNING, logger="stoker"):
        got = [r["i"] for r in ds]
    assert got == [i for i in range(5000) if i != 2500]
    assert ds.skipped == 1
    (record,) = [r for r in caplog.records if "skipped" in r.getMessage()]
    assert f"{path}, line 2501: UndecodableText: not valid 'utf-8' text" in record.getMessage()


def test_an_invalid_utf8_byte_raises_naming_the_file_and_line(tmp_path) -> None:
    lines = [b"first", b"second", spoil(b"third line", b"\xc3", 5), b"fourth"]
    path = write_lines(tmp_path / "t.txt", lines)
    it = iter(TextLines([path]))
    assert [next(it), next(it)] == ["first", "second"]
    with pytest.raises(DatasetError) as caught:
        next(it)
    assert str(caught.value) == (
        f"{path}, line 3: not valid 'utf-8' text: cannot decode the byte(s) b'\\xc3'. "
        "Fix the line, or pass on_error='skip' to skip bad lines."
    )


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 400),
    bad=st.lists(
        st.tuples(st.integers(0, 399), st.sampled_from(INVALID_UTF8), st.integers(0, 30)),
        max_size=4,
    ),
    gz=st.booleans(),
    kind=st.sampled_from(["json", "text"]),
)
def test_property_each_undecodable_line_costs_that_line_only(
    tmp_path_factory, n, bad, gz, kind
) -> None:
    lines = jsonl_bytes(n)
    spoiled = set()
    for index, junk, at in bad:
        if index < n:
            lines[index] = spoil(lines[index], junk, at)
            spoiled.add(index)
    folder = tmp_path_factory.mktemp("lines")
    path = write_lines(folder / ("x.jsonl.gz" if gz else "x.jsonl"), lines)
    cls = JsonLines if kind == "json" else TextLines
    ds = cls([path], on_error="skip")
    got = list(ds)
    kept = [i for i in range(n) if i not in spoiled]
    expected = (
        [json.loads(lines[i]) for i in kept]
        if kind == "json"
        else [lines[i].decode() for i in kept]
    )
    assert got == expected
    assert ds.skipped == len(spoiled)


def silent_text_flip(compressed: bytes) -> int:
    """A bit whose flip inflates to other lines of valid UTF-8, as many as before."""
    original = gzip.decompress(compressed)
    for bit in silent_deflate_flips(compressed):
        damaged = bytearray(compressed)
        damaged[bit // 8] ^= 1 << (bit % 8)
        inflated = zlib.decompress(bytes(damaged[10:-8]), -15)
        try:
            inflated.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if inflated.count(b"\n") == original.count(b"\n") and inflated.endswith(b"\n"):
            return bit
    raise AssertionError("no flip of this file inflates to other valid lines")


def test_verify_open_checks_a_gzip_file_before_delivering_any_of_it(tmp_path, caplog) -> None:
    data = b"".join(line + b"\n" for line in jsonl_bytes(300))
    compressed = gzip.compress(data, mtime=0)
    good = write_lines(tmp_path / "a.txt", [b"before"])
    damaged = tmp_path / "b.txt.gz"
    damaged.write_bytes(compressed)
    with flipped(damaged, silent_text_flip(compressed)):
        # Checked when the file ends: every line came through, then the damage is named.
        delivered = []
        with pytest.raises(DatasetError) as caught:
            delivered.extend(TextLines([good, str(damaged)]))
        assert len(delivered) == 301
        assert delivered[1:] != [line.decode() for line in jsonl_bytes(300)]
        text = str(caught.value)
        assert (
            f"TextLines cannot read {str(damaged)!r} after line 300: BadGzipFile: CRC check failed"
            in text
        )
        assert "the lines read from it may be damaged too (pass verify='open'" in text
        # Checked before the first line: nothing of the damaged file is delivered.
        it = iter(TextLines([str(damaged)], verify="open"))
        with pytest.raises(DatasetError) as caught:
            next(it)
        text = str(caught.value)
        assert f"cannot read {str(damaged)!r} before its first line: BadGzipFile" in text
        ds = TextLines([good, str(damaged)], verify="open", on_error="skip")
        with caplog.at_level(logging.WARNING, logger="stoker"):
            assert list(ds) == ["before"]
        assert ds.skipped == 1
    assert len(list(JsonLines([str(damaged)], verify="open"))) == 300


def test_property_verify_open_is_not_fooled_by_any_flipped_bit_of_a_gzip_file(tmp_path) -> None:
    lines = jsonl_bytes(40)
    path = write_lines(tmp_path / "x.jsonl.gz", lines)
    expected = [json.loads(line) for line in lines]
    for bit in bits_to_try(os.path.getsize(path) * 8, 1500):
        with flipped(path, bit):
            try:
                got = list(JsonLines([path], verify="open"))
            except DatasetError as exc:
                assert str(path) in str(exc)
                continue
        assert got == expected, f"bit {bit}"


def test_property_without_verify_a_flipped_bit_of_a_gzip_file_still_ends_in_an_error(
    tmp_path,
) -> None:
    """verify=False: the gzip CRC-32 and length are checked when the file ends, so a flip
    that inflates to other text is still reported, after its lines were delivered."""
    lines = [f"ligne {i} é".encode() for i in range(40)]
    path = write_lines(tmp_path / "x.txt.gz", lines)
    expected = [line.decode() for line in lines]
    for bit in bits_to_try(os.path.getsize(path) * 8, 1500, seed=3):
        delivered = []
        with flipped(path, bit):
            try:
                delivered.extend(TextLines([path]))
            except DatasetError as exc:
                assert str(path) in str(exc)
                continue
        assert delivered == expected, f"bit {bit}: other lines and no error"


@pytest.mark.parametrize("verify", [False, "open"])
@pytest.mark.parametrize("cls", [TextLines, JsonLines])
def test_property_a_truncated_gzip_file_always_raises_after_the_lines_it_holds(
    tmp_path, cls, verify
) -> None:
    """Cut anywhere, a .gz file raises naming the line it stopped after; the lines before the
    cut come through whole (verify=False; TextLines would show a cut line) or none does
    (verify="open")."""
    lines = jsonl_bytes(40)
    path = write_lines(tmp_path / "x.jsonl.gz", lines)
    whole = [json.loads(line) if cls is JsonLines else line.decode() for line in lines]
    for size in range(os.path.getsize(path)):
        delivered = []
        with truncated(path, size), pytest.raises(DatasetError) as caught:
            delivered.extend(cls([path], verify=verify))
        text = str(caught.value)
        assert f"{str(path)!r}" in text and "truncated or corrupt" in text, size
        assert delivered == whole[: len(delivered)], size
        where = f"after line {len(delivered)}" if delivered else "before its first line"
        assert where in text, (size, text)
        assert not (delivered and verify == "open"), size


def lines_around(data: bytes, offset: int) -> tuple[int, int]:
    """How many whole lines end before byte ``offset``, and after the line holding it (its
    newline included: damage to a newline touches the line it ends and the next)."""
    before = data.count(b"\n", 0, offset)
    end = data.find(b"\n", offset + (data[offset : offset + 1] == b"\n"))
    after = data.count(b"\n", end + 1) if end >= 0 else 0
    return before, after


def assert_only_the_damaged_lines_differ(got, whole, before, after, most, where) -> None:
    """``got`` holds the first ``before`` and the last ``after`` lines of ``whole`` unchanged,
    in place, and at most ``most`` others in between: what the damaged line became."""
    assert got[:before] == whole[:before], where
    if after:
        assert got[-after:] == whole[-after:], where
    assert before + after <= len(got) <= before + after + most, where


@pytest.mark.parametrize("cls", [TextLines, JsonLines])
def test_property_damage_to_a_plain_file_touches_the_damaged_line_only(tmp_path, cls) -> None:
    """No checksum protects plain text: a flipped bit changes or costs (on_error='skip') the line
    that holds it (a newline made or unmade splits or joins it), a cut costs the rest of the
    line it falls in; no other line changes, moves or vanishes."""
    lines = [json.dumps({"i": i, "text": f"ligne {i} é*J"}).encode() for i in range(20)]
    path = write_lines(tmp_path / "x.jsonl", lines)
    with open(path, "rb") as f:
        data = f.read()
    whole = list(cls([path]))
    for bit in bits_to_try(len(data) * 8, 500, seed=4):
        before, after = lines_around(data, bit // 8)
        ds = cls([path], on_error="skip")
        with flipped(path, bit):
            got = list(ds)
        # what the damaged line became: itself changed, two lines (a new newline), or skipped
        most = 2 if cls is TextLines else 1
        assert_only_the_damaged_lines_differ(got, whole, before, after, most, f"bit {bit}")
        assert len(got) + ds.skipped >= before + after + 1, f"bit {bit}: a line vanished"
    for size in range(0, len(data), 3):
        before = data.count(b"\n", 0, size)
        ds = cls([path], on_error="skip")
        with truncated(path, size):
            got = list(ds)
        assert_only_the_damaged_lines_differ(got, whole, before, 0, 1, f"cut at {size}")
        if size > 0 and data[size - 1 : size] != b"\n":  # a line was cut: delivered or reported
            assert len(got) + ds.skipped == before + 1, f"cut at {size}"


def test_verify_is_checked() -> None:
    with pytest.raises(ValueError, match="verify must be False or 'open', got 'read'"):
        TextLines(__file__, verify="read")
