"""TarShards and write_tar_shards: WebDataset-style samples, sharding, decoding, damage."""

from __future__ import annotations

import collections
import functools
import hashlib
import http.server
import io
import json
import logging
import os
import pathlib
import tarfile
import threading

import numpy as np
import pytest

from stoker import DataLoader, DatasetError
from stoker.formats.tar import TarShards, default_decoders, write_tar_shards


@pytest.fixture(autouse=True)
def no_topology_in_the_environment(monkeypatch) -> None:
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


def samples(n: int, start: int = 0) -> list[dict]:
    return [
        {
            "__key__": f"{i:06d}",
            "cls": i % 3,
            "txt": f"caption {i}",
            "json": {"i": i, "tags": ["a", "b"]},
        }
        for i in range(start, start + n)
    ]


def write(tmp_path, n: int, per_shard: int, name: str = "shard-%04d.tar") -> list[str]:
    return write_tar_shards(samples(n), str(tmp_path / name), max_samples_per_shard=per_shard)


# ------------------------------------------------------------------ round trip


def test_round_trip_raw_bytes(tmp_path) -> None:
    paths = write(tmp_path, 5, 2)
    assert [os.path.basename(p) for p in paths] == [
        "shard-0000.tar",
        "shard-0001.tar",
        "shard-0002.tar",
    ]
    got = list(TarShards(paths))
    assert [s["__key__"] for s in got] == [f"{i:06d}" for i in range(5)]
    first = got[0]
    assert set(first) == {"__key__", "__url__", "cls", "txt", "json"}
    assert first["cls"] == b"0" and first["txt"] == b"caption 0"
    assert json.loads(first["json"]) == {"i": 0, "tags": ["a", "b"]}
    assert first["__url__"] == paths[0] and got[4]["__url__"] == paths[2]


def test_round_trip_decoded(tmp_path) -> None:
    pytest.importorskip("PIL", reason="image decoding uses Pillow")
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, size=(12, 9, 3), dtype=np.uint8)
    gray = rng.integers(0, 256, size=(5, 4), dtype=np.uint8)
    features = rng.normal(size=(4, 2)).astype(np.float32)
    sample = {
        "__key__": "a",
        "png": image,
        "gray.png": gray,
        "npy": features,
        "cls": 7,
        "txt": "héllo",
        "json": [1],
    }
    paths = write_tar_shards([sample], str(tmp_path / "s-%d.tar"))
    (got,) = list(TarShards(paths, decode=True))
    np.testing.assert_array_equal(got["png"], image)
    assert got["png"].dtype == np.uint8 and got["png"].shape == (12, 9, 3), "HWC uint8"
    np.testing.assert_array_equal(got["gray.png"], np.repeat(gray[:, :, None], 3, axis=2))
    np.testing.assert_array_equal(got["npy"], features)
    assert got["cls"] == 7 and got["txt"] == "héllo" and got["json"] == [1]


def test_jpeg_decodes_to_hwc_rgb(tmp_path) -> None:
    pytest.importorskip("PIL", reason="image decoding uses Pillow")
    image = np.full((16, 20, 3), (200, 30, 90), dtype=np.uint8)
    paths = write_tar_shards([{"__key__": "k", "jpg": image}], str(tmp_path / "s-%d.tar"))
    (got,) = list(TarShards(paths, decode=True))
    assert got["jpg"].shape == (16, 20, 3) and got["jpg"].dtype == np.uint8
    assert np.abs(got["jpg"].astype(int) - image).max() <= 8, "a flat colour survives JPEG"


def test_decode_with_a_dict_or_a_function(tmp_path) -> None:
    paths = write(tmp_path, 3, 10)
    by_ext = list(TarShards(paths, decode={"cls": lambda b: int(b) * 10}))
    assert [s["cls"] for s in by_ext] == [0, 10, 20]
    assert by_ext[0]["txt"] == b"caption 0", "extensions not in the dict stay bytes"
    whole = list(TarShards(paths, decode=lambda s: (s["__key__"], int(s["cls"]))))
    assert whole == [("000000", 0), ("000001", 1), ("000002", 2)]
    assert default_decoders()["json"](b'{"a": 2}') == {"a": 2}
    with pytest.raises(TypeError, match=r"decode must be None \(bytes\), True .*got 3"):
        TarShards(paths, decode=3)


def test_members_group_by_key_with_folders_and_skip_odd_names(tmp_path) -> None:
    path = tmp_path / "hand.tar"
    with tarfile.open(path, "w") as tf:
        for name, data in [
            ("train/000.jpg", b"J0"),
            ("train/000.seg.png", b"S0"),
            ("train/._000.jpg", b"apple double"),
            ("README", b"no extension"),
            ("train/001.JPG", b"J1"),
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        tf.addfile(tarfile.TarInfo("train/dir/"))
    got = [{k: v for k, v in s.items() if k != "__url__"} for s in TarShards([str(path)])]
    assert got == [
        {"__key__": "train/000", "jpg": b"J0", "seg.png": b"S0"},
        {"__key__": "train/001", "jpg": b"J1"},
    ]


def test_a_repeated_extension_in_one_sample_is_an_error(tmp_path) -> None:
    path = tmp_path / "dup.tar"
    with tarfile.open(path, "w") as tf:
        for name in ("a.txt", "a.txt"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tf.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(DatasetError) as caught:
        list(TarShards([str(path)]))
    assert str(caught.value) == (
        f"tar shard {str(path)!r}, sample 'a': 'a.txt' appears twice; every file of a sample "
        "needs its own extension. Fix the shard, or pass on_error='skip' to skip such samples."
    )


# ------------------------------------------------------------------ sharding


@pytest.mark.parametrize("worker_mode", ["process", "thread"])
@pytest.mark.parametrize("per_shard", [3, 20], ids=["shard-level", "record-level"])
def test_every_sample_once_over_two_ranks_and_two_workers(tmp_path, per_shard, worker_mode) -> None:
    paths = write(tmp_path, 31, per_shard)  # 11 shards, or 2 shards for 4 readers
    seen: collections.Counter = collections.Counter()
    for rank in range(2):
        ds = TarShards(paths, decode=True, rank=rank, world_size=2)
        loader = DataLoader(ds, batch_size=4, num_workers=2, worker_mode=worker_mode)
        for batch in loader:
            assert batch["cls"].dtype.kind == "i", "decoded labels collate into an int array"
            seen.update(batch["__key__"])
    assert sorted(seen) == [f"{i:06d}" for i in range(31)]
    assert max(seen.values()) == 1, "a sample was read by two (rank, worker) readers"


def test_shuffle_shards_per_epoch(tmp_path) -> None:
    paths = write(tmp_path, 12, 1)
    ds = TarShards(paths, shuffle_shards=True, seed=2)
    keys = []
    for epoch in (0, 1, 0):
        ds.set_epoch(epoch)
        keys.append([s["__key__"] for s in ds])
    assert keys[0] == keys[2] and keys[0] != keys[1]
    assert sorted(keys[1]) == [f"{i:06d}" for i in range(12)]
    assert [s["__key__"] for s in TarShards(paths)] == sorted(keys[0])


# ------------------------------------------------------------------ which shards


def test_shards_from_a_directory_a_glob_braces_and_file_urls(tmp_path) -> None:
    paths = write(tmp_path, 6, 2)
    (tmp_path / "notes.txt").write_text("not a shard")
    assert TarShards(tmp_path).shards == paths
    assert TarShards(str(tmp_path / "shard-*.tar")).shards == paths
    braces = TarShards(str(tmp_path / "shard-{0000..0002}.tar"))
    assert braces.shards == paths
    url = TarShards([f"file://{paths[1]}"])
    assert [s["__key__"] for s in url] == ["000002", "000003"]
    with pytest.raises(
        FileNotFoundError, match=r"entry 1 of the file list, '.*shard-0003\.tar', is not a file"
    ):
        TarShards(str(tmp_path / "shard-{0002..0003}.tar"))


def test_http_shards_stream(tmp_path) -> None:
    paths = write(tmp_path, 4, 2)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))

    class Quiet(handler.func):  # type: ignore[name-defined, misc]
        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(tmp_path))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        ds = TarShards(base + "/shard-{0000..0001}.tar", decode=True)
        assert [s["cls"] for s in ds] == [0, 1, 2, 0]
        assert ds.shards[0].endswith("/shard-0000.tar") and len(ds.shards) == len(paths)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


# ------------------------------------------------------------------ damaged shards


def damaged_copies(tmp_path) -> dict[str, str]:
    """Ways a shard breaks: truncated mid-file, at a member boundary, mid-header, just before
    the end-of-archive blocks (a writer that died before closing); garbage."""
    (path,) = write(tmp_path, 4, 10, name="whole-%d.tar")
    raw = pathlib.Path(path).read_bytes()
    cuts = {
        "mid-file": 512 + 100,
        "member-boundary": 3 * 1024,
        "mid-header": 3 * 1024 + 200,
        "no-end": 12 * 1024,
    }
    out = {}
    for label, cut in cuts.items():
        out[label] = str(tmp_path / f"{label}.tar")
        pathlib.Path(out[label]).write_bytes(raw[:cut])
    garbage = bytearray(raw)
    garbage[3 * 1024 : 3 * 1024 + 512] = b"\x07" * 512
    out["garbled-header"] = str(tmp_path / "garbled-header.tar")
    pathlib.Path(out["garbled-header"]).write_bytes(bytes(garbage))
    out["not-a-tar"] = str(tmp_path / "not-a-tar.tar")
    pathlib.Path(out["not-a-tar"]).write_bytes(b"hello" * 300)
    return out


def test_member_size_layout_assumed_by_damaged_copies(tmp_path) -> None:
    (path,) = write(tmp_path, 4, 10, name="whole-%d.tar")
    with tarfile.open(path) as tf:
        offsets = [m.offset for m in tf.getmembers()]
    assert offsets == [1024 * k for k in range(12)], (
        "each small member takes one header and one data block"
    )


@pytest.mark.parametrize(
    "damage", ["mid-file", "member-boundary", "mid-header", "no-end", "garbled-header", "not-a-tar"]
)
def test_a_damaged_shard_raises_naming_it(tmp_path, damage) -> None:
    bad = damaged_copies(tmp_path)[damage]
    with pytest.raises(
        DatasetError,
        match=rf"tar shard '.*{damage}\.tar' is truncated or corrupt: .*on_error='skip'",
    ):
        list(TarShards([bad]))


def test_a_damaged_shard_is_skipped_and_counted(tmp_path, caplog) -> None:
    bad = damaged_copies(tmp_path)["no-end"]
    good = write_tar_shards(samples(2, start=100), str(tmp_path / "good-%d.tar"))
    ds = TarShards([bad, *good], on_error="skip")
    with caplog.at_level(logging.WARNING, logger="stoker"):
        keys = [s["__key__"] for s in ds]
    # the last sample of a damaged shard may miss files, so it is dropped with the rest
    assert keys == ["000000", "000001", "000002", "000100", "000101"]
    assert ds.skipped == 1
    assert "no-end.tar" in caplog.text and "stops without its end marker" in caplog.text
    calls = []
    handled = TarShards([bad, *good], on_error=lambda exc: calls.append(str(exc)) is None)
    assert len(list(handled)) == 5 and len(calls) == 1 and "no-end.tar" in calls[0]
    with pytest.raises(DatasetError, match="no-end"):
        list(TarShards([bad, *good], on_error=lambda exc: False))


def test_a_sample_that_fails_to_decode_names_the_shard_key_and_file(tmp_path) -> None:
    paths = write_tar_shards(
        [
            {"__key__": "ok", "cls": 1},
            {"__key__": "bad", "cls": "one"},
            {"__key__": "ok2", "cls": 2},
        ],
        str(tmp_path / "s-%d.tar"),
    )
    pattern = (
        r"tar shard '.*s-0\.tar', sample 'bad': cannot decode the sample's 'cls' file: ValueError"
    )
    with pytest.raises(DatasetError, match=pattern):
        list(TarShards(paths, decode=True))
    ds = TarShards(paths, decode=True, on_error="skip")
    assert [s["cls"] for s in ds] == [1, 2] and ds.skipped == 1


# ------------------------------------------------------------------ the writer


def test_writer_is_deterministic_and_gzips(tmp_path) -> None:
    a = write_tar_shards(samples(5), str(tmp_path / "a-{:02d}.tar"), max_samples_per_shard=3)
    b = write_tar_shards(samples(5), str(tmp_path / "b-{:02d}.tar"), max_samples_per_shard=3)
    digest = lambda p: hashlib.sha256(pathlib.Path(p).read_bytes()).hexdigest()
    assert [digest(p) for p in a] == [digest(p) for p in b]
    gz = write_tar_shards(samples(5), str(tmp_path / "c-%02d.tar.gz"), max_samples_per_shard=3)
    assert pathlib.Path(gz[0]).read_bytes()[:2] == b"\x1f\x8b"
    assert [s["__key__"] for s in TarShards(gz)] == [f"{i:06d}" for i in range(5)]


def test_writer_splits_by_bytes_and_numbers_keys(tmp_path) -> None:
    paths = write_tar_shards(
        [{"bin": b"x" * 100}] * 5, str(tmp_path / "s-%d.tar"), max_bytes_per_shard=250
    )
    assert len(paths) == 2
    assert [s["__key__"] for s in TarShards(paths)] == [f"{i:09d}" for i in range(5)]


def test_an_interrupted_write_leaves_no_complete_looking_shard(tmp_path) -> None:
    def stream():
        yield from samples(3)
        raise RuntimeError("source died")

    with pytest.raises(RuntimeError, match="source died"):
        write_tar_shards(stream(), str(tmp_path / "s-%d.tar"), max_samples_per_shard=2)
    assert sorted(os.listdir(tmp_path)) == ["s-0.tar"], (
        "only the finished shard exists, no partial file"
    )
    assert len(list(TarShards([str(tmp_path / "s-0.tar")]))) == 2


def test_writer_argument_errors(tmp_path) -> None:
    with pytest.raises(
        ValueError, match=r"dst_pattern must hold a shard number placeholder .*got '.*out\.tar'"
    ):
        write_tar_shards(samples(1), str(tmp_path / "out.tar"))
    with pytest.raises(
        ValueError, match=r"max_samples_per_shard must be a positive integer, got 0"
    ):
        write_tar_shards(samples(1), str(tmp_path / "%d.tar"), max_samples_per_shard=0)
    with pytest.raises(ValueError, match=r"sample 0 has the key 'a\.b'; .*no '\.' in its name"):
        write_tar_shards([{"__key__": "a.b", "txt": "x"}], str(tmp_path / "%d.tar"))
    with pytest.raises(
        ValueError, match=r"samples 0 and 1 share the key 'k'; a reader would merge them"
    ):
        write_tar_shards(
            [{"__key__": "k", "txt": "a"}, {"__key__": "k", "cls": 1}], str(tmp_path / "%d.tar")
        )
    with pytest.raises(TypeError, match=r"sample 'k': cannot write list as 'txt'"):
        write_tar_shards([{"__key__": "k", "txt": [1]}], str(tmp_path / "%d.tar"))
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".partial")]


def test_a_truncated_gzipped_shard_raises_naming_it(tmp_path) -> None:
    (path,) = write_tar_shards(samples(50), str(tmp_path / "z-%d.tar.gz"))
    raw = pathlib.Path(path).read_bytes()
    pathlib.Path(path).write_bytes(raw[: len(raw) // 2])
    with pytest.raises(DatasetError, match=r"tar shard '.*z-0\.tar\.gz' is truncated or corrupt"):
        list(TarShards([path]))


def test_raw_bytes_batch_through_the_loader(tmp_path) -> None:
    paths = write(tmp_path, 5, 5)
    (batch,) = list(DataLoader(TarShards(paths), batch_size=5))
    assert batch["__key__"] == [f"{i:06d}" for i in range(5)]
    assert batch["cls"] == [b"0", b"1", b"2", b"0", b"1"]


def test_numpy_integers_are_counts_seeds_and_epochs(tmp_path) -> None:
    paths = write_tar_shards(
        samples(5),
        str(tmp_path / "n-%02d.tar"),
        max_samples_per_shard=np.int64(2),
        max_bytes_per_shard=np.int32(1 << 20),
    )
    assert len(paths) == 3
    shards = TarShards(
        paths, shuffle_shards=True, seed=np.int64(7), max_member_bytes=np.int64(1 << 20)
    )
    shards.set_epoch(np.int64(1))
    plain = TarShards(paths, shuffle_shards=True, seed=7, max_member_bytes=1 << 20)
    plain.set_epoch(1)
    assert [s["__key__"] for s in shards] == [s["__key__"] for s in plain]
    assert (
        type(shards.seed) is int
        and type(shards.epoch) is int
        and type(shards.max_member_bytes) is int
    )
