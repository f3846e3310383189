"""TarShards on damaged shards: gzip trailers, links, devices, oversized members, bit flips."""

from __future__ import annotations

import gzip
import io
import logging
import os
import tarfile
import zlib

import numpy as np
import pytest

from formats.damage import bits_to_try, flipped, silent_deflate_flips, truncated
from stoker import DatasetError
from stoker.formats import tar
from stoker.formats.tar import TarShards, write_tar_shards


@pytest.fixture(autouse=True)
def no_topology_in_the_environment(monkeypatch) -> None:
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


def samples(n: int) -> list[dict]:
    return [{"__key__": f"{i:04d}", "txt": f"caption {i} " * 3, "cls": i % 3} for i in range(n)]


def plain_shard(tmp_path, n: int) -> bytes:
    (path,) = write_tar_shards(samples(n), str(tmp_path / "plain-%d.tar"))
    with open(path, "rb") as f:
        return f.read()


def without_url(sample: dict) -> dict:
    return {k: v for k, v in sample.items() if k != "__url__"}


def read_all(paths, **kwargs) -> list[dict]:
    return [without_url(s) for s in TarShards(paths, **kwargs)]


def members(data: bytes) -> list[tuple[str, bytes]]:
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        return [(m.name, archive.extractfile(m).read()) for m in archive]


def silent_tar_flip(compressed: bytes) -> int:
    """A bit of a gzipped tar, in an early member, whose flip changes that member's data only."""
    original = members(gzip.decompress(compressed))
    for bit in silent_deflate_flips(compressed):
        damaged = bytearray(compressed)
        damaged[bit // 8] ^= 1 << (bit % 8)
        try:
            got = members(zlib.decompress(bytes(damaged[10:-8]), -15))
        except tarfile.TarError:
            continue
        if [name for name, _ in got] == [name for name, _ in original] and got[:10] != original[
            :10
        ]:
            return bit
    raise AssertionError("no flip of this shard changes member data only")


def test_a_flipped_bit_in_a_gzipped_shard_is_reported_not_delivered_silently(
    tmp_path, caplog
) -> None:
    compressed = gzip.compress(plain_shard(tmp_path, 30), mtime=0)
    path = tmp_path / "damaged.tar.gz"
    path.write_bytes(compressed)
    expected = read_all([str(path)])
    with flipped(path, silent_tar_flip(compressed)):
        delivered = []
        with pytest.raises(DatasetError) as caught:
            delivered.extend(TarShards([str(path)]))
        # tarfile alone hands out all 30; the last is held back until the shard has ended
        assert len(delivered) == 29 and [without_url(s) for s in delivered] != expected[:29]
        text = str(caught.value)
        assert (
            f"tar shard {str(path)!r} is truncated or corrupt: BadGzipFile: CRC check failed"
            in text
        )
        assert "may be damaged too (pass verify='open'" in text
        it = iter(TarShards([str(path)], verify="open"))
        with pytest.raises(DatasetError) as caught:
            next(it)
        assert "It was checked before any of its samples was delivered (verify='open')." in str(
            caught.value
        )
        ds = TarShards([str(path)], verify="open", on_error="skip")
        with caplog.at_level(logging.WARNING, logger="stoker"):
            assert list(ds) == []
        assert ds.skipped == 1
    assert read_all([str(path)], verify="open") == expected


def test_property_verify_open_is_not_fooled_by_any_flipped_bit_of_a_gzipped_shard(tmp_path) -> None:
    path = tmp_path / "s.tar.gz"
    path.write_bytes(gzip.compress(plain_shard(tmp_path, 4), mtime=0))
    expected = read_all([str(path)])
    for bit in bits_to_try(os.path.getsize(path) * 8, 2000):
        with flipped(path, bit):
            try:
                got = read_all([str(path)], verify="open")
            except DatasetError as exc:
                assert str(path) in str(exc)
                continue
        assert got == expected, f"bit {bit}"


def test_property_without_verify_a_flipped_bit_of_a_gzipped_shard_still_ends_in_an_error(
    tmp_path,
) -> None:
    path = tmp_path / "s.tar.gz"
    path.write_bytes(gzip.compress(plain_shard(tmp_path, 4), mtime=0))
    expected = read_all([str(path)])
    for bit in bits_to_try(os.path.getsize(path) * 8, 1500, seed=1):
        delivered = []
        with flipped(path, bit):
            try:
                delivered.extend(read_all([str(path)]))
            except DatasetError:
                continue
        assert delivered == expected, f"bit {bit}: wrong samples and no error"


def test_property_a_flipped_header_bit_of_a_plain_tar_is_caught_and_data_bits_stay_in_their_member(
    tmp_path,
) -> None:
    """Plain tar checksums its headers, not its data: a data flip stays inside one member."""
    data = plain_shard(tmp_path, 3)
    path = tmp_path / "s.tar"
    path.write_bytes(data)
    expected = read_all([str(path)])
    for bit in bits_to_try(len(data) * 8, 3000, seed=2):
        with flipped(path, bit):
            try:
                got = read_all([str(path)])
            except DatasetError as exc:
                assert str(path) in str(exc)
                continue
        assert [s["__key__"] for s in got] == [s["__key__"] for s in expected], f"bit {bit}"
        changed = [
            (i, ext) for i, s in enumerate(got) for ext in s if s[ext] != expected[i].get(ext)
        ]
        assert len(changed) <= 1, f"bit {bit} changed {changed}"
        for i, ext in changed:
            assert len(got[i][ext]) == len(expected[i][ext]), f"bit {bit}"


@pytest.mark.parametrize("verify", [False, "open"])
@pytest.mark.parametrize("suffix", [".tar", ".tar.gz"])
def test_property_a_shard_truncated_anywhere_raises_or_reads_whole(
    tmp_path, suffix, verify
) -> None:
    """Truncation is always detected; what came before it is delivered intact (verify=False),
    or nothing of a gzipped shard is (verify="open")."""
    data = plain_shard(tmp_path, 3)
    path = tmp_path / f"s{suffix}"
    path.write_bytes(gzip.compress(data, mtime=0) if suffix == ".tar.gz" else data)
    expected = read_all([str(path)])
    size = os.path.getsize(path)
    for cut in range(0, size, 1 if suffix == ".tar.gz" else 11):  # from 0: an empty file
        delivered = []
        with truncated(path, cut):
            try:
                delivered.extend(without_url(s) for s in TarShards([str(path)], verify=verify))
            except DatasetError as exc:
                assert f"{str(path)!r}" in str(exc) and "is truncated or corrupt" in str(exc)
                assert delivered == expected[: len(delivered)], cut
                assert not (delivered and suffix == ".tar.gz" and verify == "open"), cut
                continue
        # Only the zero blocks after the end-of-archive marker can go unnoticed.
        assert suffix == ".tar" and cut >= data.index(b"\0" * 1024, len(data) - 10240), cut
        assert delivered == expected


def link_shard(path) -> None:
    with tarfile.open(path, "w") as archive:

        def add(
            name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"x", link: str = ""
        ) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, link
            info.size = len(data) if kind == tarfile.REGTYPE else 0
            archive.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)

        add("0000.txt", data=b"zero")
        add("0000.jpg", tarfile.SYMTYPE, link="/etc/passwd")
        add("0001.txt", data=b"one")
        add("0001.cls", tarfile.LNKTYPE, link="0000.txt")
        add("0002.txt", data=b"two")
        add("0002.dev", tarfile.CHRTYPE)
        add("0003.fifo", tarfile.FIFOTYPE)
        add("0004.txt", data=b"four")
        add("folder", tarfile.DIRTYPE)


def test_links_and_device_members_are_reported_with_their_sample(tmp_path, caplog) -> None:
    path = tmp_path / "links.tar"
    link_shard(path)
    with pytest.raises(DatasetError) as caught:
        list(TarShards([str(path)]))
    assert str(caught.value) == (
        f"tar shard {str(path)!r}, sample '0000': '0000.jpg' is a symbolic link to '/etc/passwd', "
        "not a file: only regular files hold sample data. Fix the shard, or pass "
        "on_error='skip' to skip such samples."
    )
    ds = TarShards([str(path)], on_error="skip")
    with caplog.at_level(logging.WARNING, logger="stoker"):
        got = [s["__key__"] for s in ds]
    assert got == ["0004"]
    assert ds.skipped == 4
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "sample '0001': '0001.cls' is a hard link to '0000.txt'" in logged
    assert "sample '0002': '0002.dev' is a character device" in logged
    assert "sample '0003': '0003.fifo' is a FIFO" in logged


def test_a_member_larger_than_max_member_bytes_is_refused_without_reading_it(tmp_path) -> None:
    assert tar.DEFAULT_MAX_MEMBER_BYTES == 2**30
    big = {"__key__": "big", "bin": bytes(8 << 20), "txt": "ok"}
    (path,) = write_tar_shards([samples(1)[0], big, samples(2)[1]], str(tmp_path / "b-%d.tar.gz"))
    assert os.path.getsize(path) < 100_000  # gzip shrinks 8 MiB of zeros to a few KB
    with pytest.raises(DatasetError) as caught:
        list(TarShards([path], max_member_bytes=1 << 20))
    assert str(caught.value) == (
        f"tar shard {path!r}, sample 'big': 'big.bin' holds 8,388,608 bytes (once decompressed), "
        "more than max_member_bytes=1,048,576, so it was not read; pass a larger "
        "max_member_bytes (or None) if it is genuine. Fix the shard, or pass on_error='skip' "
        "to skip such samples."
    )
    ds = TarShards([path], max_member_bytes=1 << 20, on_error="skip")
    assert [s["__key__"] for s in ds] == ["0000", "0001"] and ds.skipped == 1
    assert [s["__key__"] for s in TarShards([path], max_member_bytes=None)] == [
        "0000",
        "big",
        "0001",
    ]
    with pytest.raises(
        ValueError, match="max_member_bytes must be a positive integer or None, got 0"
    ):
        TarShards([path], max_member_bytes=0)


def test_npy_members_are_checked_before_numpy_trusts_their_header(tmp_path) -> None:
    objects, bomb = io.BytesIO(), io.BytesIO()
    np.save(objects, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    header = {"descr": "<f8", "fortran_order": False, "shape": (10**10,)}
    np.lib.format.write_array_header_1_0(bomb, header)
    bomb.write(bytes(16))  # 16 bytes of data, 80 GB declared
    shards = write_tar_shards(
        [
            {"__key__": "objects", "npy": objects.getvalue()},
            {"__key__": "bomb", "npy": bomb.getvalue()},
        ],
        str(tmp_path / "npy-%d.tar"),
    )
    ds = TarShards(shards, decode=True, on_error="skip")
    assert list(ds) == [] and ds.skipped == 2
    it = iter(TarShards(shards, decode=True))
    with pytest.raises(DatasetError) as caught:
        next(it)
    text = str(caught.value)
    assert (
        "sample 'objects': cannot decode the sample's 'npy' file: ValueError: it holds Python "
        "objects" in text
    )
    assert "stoker does not unpickle data it reads" in text and "allow_pickle" not in text
    with pytest.raises(DatasetError) as caught:
        list(TarShards(shards[0:1], decode=True, on_error=lambda exc: "objects" in str(exc)))
    assert (
        "sample 'bomb': cannot decode the sample's 'npy' file: ValueError: its header declares "
        "(10000000000,) of float64 (80,000,000,000 bytes of data), but 16 bytes follow it: the "
        "member is damaged" in str(caught.value)
    )
