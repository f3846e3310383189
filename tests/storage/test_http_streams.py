"""Tar shards streamed over plain HTTP (no cache) through a flaky network: a failed read is
retried, resuming at its byte offset where the server takes ranges and restarting the shard
otherwise, every sample delivered once; a network that stays down is reported as the
network, not as a damaged shard."""

from __future__ import annotations

import logging
import os
import time

import pytest

from stoker import DatasetError
from stoker.formats.tar import TarShards, write_tar_shards
from stoker.storage import RemoteReadError, RetryPolicy

FAST = RetryPolicy(attempts=3, base_delay_s=0.01)
PER_SHARD = 12


def _shards(folder, count: int = 3, suffix: str = ".tar") -> list[str]:
    """``count`` shards of 12 samples of about 2 KB each: half a shard ends mid-member."""
    samples = [
        {"__key__": f"{i:05d}", "cls": i, "bin": bytes([i % 251]) * (1500 + 37 * i)}
        for i in range(count * PER_SHARD)
    ]
    paths = write_tar_shards(
        samples, os.path.join(folder, f"shard-%04d{suffix}"), max_samples_per_shard=PER_SHARD
    )
    return [os.path.basename(p) for p in paths]


def _keys(count: int = 3, without: tuple[int, ...] = ()) -> list[str]:
    return [f"{i:05d}" for i in range(count * PER_SHARD) if i // PER_SHARD not in without]


def _read(base: str, names: list[str], **kwargs) -> TarShards:
    return TarShards([f"{base}/{name}" for name in names], **kwargs)


def _check(samples: list[dict]) -> list[str]:
    for s in samples:
        i = int(s["__key__"])
        assert s["cls"] == str(i).encode() and s["bin"] == bytes([i % 251]) * (1500 + 37 * i)
    return [s["__key__"] for s in samples]


@pytest.mark.parametrize("ranges", [True, False])
def test_a_503_burst_is_retried(tmp_path, http_origin, ranges) -> None:
    names = _shards(tmp_path)
    base, proxy, _ = http_origin(str(tmp_path), ranges=ranges)
    proxy.fail("shard-0001", "503", times=2)
    assert _check(list(_read(base, names, retries=FAST))) == _keys()
    assert proxy.count("shard-0001") == 3  # two 503s, then the shard


def test_a_body_cut_short_resumes_at_its_byte_offset(tmp_path, http_origin) -> None:
    names = _shards(tmp_path)
    size = os.path.getsize(tmp_path / names[1])
    base, proxy, _ = http_origin(str(tmp_path), ranges=True)
    proxy.fail("shard-0001", "truncate", times=1)
    assert _check(list(_read(base, names, retries=FAST))) == _keys()
    # the second request asks for the rest only, from the first byte that did not arrive
    assert proxy.ranges("shard-0001") == [None, f"bytes={size // 2}-"]


@pytest.mark.parametrize("action", ["reset-mid-body", "truncate"])
def test_without_ranges_the_shard_restarts_and_delivers_each_sample_once(
    tmp_path, http_origin, action
) -> None:
    names = _shards(tmp_path)
    base, proxy, _ = http_origin(str(tmp_path), ranges=False)
    proxy.fail("shard-0001", action, times=2)
    assert _check(list(_read(base, names, retries=FAST))) == _keys()
    assert proxy.count("shard-0001") == 3


def test_a_reset_mid_body_resumes(tmp_path, http_origin) -> None:
    names = _shards(tmp_path)
    base, proxy, _ = http_origin(str(tmp_path), ranges=True)
    proxy.fail("shard-0000", "reset-mid-body", times=1)
    proxy.fail("shard-0002", "reset-mid-body", times=2)
    assert _check(list(_read(base, names, retries=FAST))) == _keys()
    assert proxy.count("shard-0000") == 2 and proxy.count("shard-0002") == 3
    # a reset may drop what had arrived: a request after one asks for the rest, if any came
    for name in names[0], names[2]:
        half = os.path.getsize(tmp_path / name) // 2
        for asked in proxy.ranges(name)[1:]:
            assert asked is None or 0 < int(asked.removeprefix("bytes=").rstrip("-")) <= half


def test_a_gzipped_shard_resumes_under_its_decompression(tmp_path, http_origin) -> None:
    names = _shards(tmp_path, suffix=".tar.gz")
    base, proxy, _ = http_origin(str(tmp_path), ranges=True)
    proxy.fail("shard-0001", "truncate", times=1)
    proxy.fail("shard-0002", "reset-mid-body", times=1)
    assert _check(list(_read(base, names, retries=FAST, verify="open"))) == _keys()


def test_a_stall_mid_body_times_out_and_resumes(tmp_path, http_origin) -> None:
    names = _shards(tmp_path)
    base, proxy, _ = http_origin(str(tmp_path), ranges=True)
    proxy.fail("shard-0001", "stall-mid-body", times=1)
    policy = RetryPolicy(attempts=2, base_delay_s=0.01, read_timeout_s=0.3)
    start = time.monotonic()
    assert _check(list(_read(base, names, retries=policy))) == _keys()
    assert time.monotonic() - start < 5.0  # one read timeout, not the server's stall of 60 s
    assert proxy.count("shard-0001") == 2


def test_a_network_down_for_every_attempt_is_reported_as_the_network(tmp_path, http_origin) -> None:
    names = _shards(tmp_path)
    base, proxy, _ = http_origin(str(tmp_path), ranges=True)
    proxy.fail("shard-0001", "503", times=None)
    with pytest.raises(RemoteReadError) as caught:
        list(_read(base, names, retries=FAST))
    text = str(caught.value)
    assert f"{base}/shard-0001.tar" in text and "after 3 attempts" in text
    assert "503" in text and "network" in text and "Rewrite" not in text, text
    assert caught.value.url == f"{base}/shard-0001.tar"
    assert isinstance(caught.value, DatasetError)
    assert proxy.count("shard-0001") == 3


def test_resets_mid_body_every_time_name_the_url_and_the_bytes_that_arrived(
    tmp_path, http_origin
) -> None:
    names = _shards(tmp_path)
    base, proxy, _ = http_origin(str(tmp_path), ranges=True)
    proxy.fail("shard-0001", "truncate", times=None)
    with pytest.raises(RemoteReadError) as caught:
        list(_read(base, names, retries=FAST))
    text = str(caught.value)
    assert f"{base}/shard-0001.tar after 3 attempts" in text and "Rewrite" not in text, text
    assert "closed the connection before the end of its answer" in text, text
    size = os.path.getsize(tmp_path / names[1])
    assert "bytes had arrived" in text and f" of {size:,} bytes" in text, text
    assert "network" in text, text


def test_a_dead_shard_is_skipped_and_logged_as_the_network(tmp_path, http_origin, caplog) -> None:
    names = _shards(tmp_path)
    base, proxy, _ = http_origin(str(tmp_path), ranges=True)
    proxy.fail("shard-0001", "reset", times=None)
    ds = _read(base, names, retries=FAST, on_error="skip")
    with caplog.at_level(logging.WARNING, logger="stoker"):
        got = _check(list(ds))
    assert got == _keys(without=(1,)) and ds.skipped == 1
    assert f"{base}/shard-0001.tar after 3 attempts" in caplog.text
    assert "Rewrite" not in caplog.text


def test_a_missing_shard_is_not_retried(tmp_path, http_origin) -> None:
    names = _shards(tmp_path)
    base, proxy, _ = http_origin(str(tmp_path), ranges=True)
    expected = r"/absent\.tar at the first attempt \(not a transient error"
    with pytest.raises(RemoteReadError, match=expected) as caught:
        list(_read(base, [*names, "absent.tar"], retries=FAST))
    assert "404" in str(caught.value)
    assert proxy.count("absent.tar") == 1


def test_a_shard_replaced_between_two_requests_is_not_stitched_together(
    tmp_path, http_origin
) -> None:
    names = _shards(tmp_path)
    base, proxy, _ = http_origin(str(tmp_path), ranges=True, changing=True)
    proxy.fail("shard-0001", "truncate", times=1)
    with pytest.raises(RemoteReadError, match="changed") as caught:
        list(_read(base, names, retries=FAST))
    assert f"{base}/shard-0001.tar" in str(caught.value)


def test_a_damaged_shard_is_still_blamed_on_the_shard(tmp_path, http_origin) -> None:
    names = _shards(tmp_path)
    path = tmp_path / names[1]
    path.write_bytes(path.read_bytes()[: 5 * 1024])  # the file itself is cut: no network fault
    base, proxy, _ = http_origin(str(tmp_path), ranges=True)
    with pytest.raises(DatasetError, match="is truncated or corrupt") as caught:
        list(_read(base, names, retries=FAST))
    assert not isinstance(caught.value, RemoteReadError)
    assert "Rewrite or remove the shard" in str(caught.value)
    assert proxy.count("shard-0001") == 1


def test_a_stalled_streamed_shard_fails_within_the_read_timeout(tmp_path, http_origin) -> None:
    (path,) = write_tar_shards(
        [{"__key__": "a", "bin": b"x" * 50_000}], str(tmp_path / "shard-%d.tar")
    )
    base, proxy, _ = http_origin(str(tmp_path))
    proxy.fail("shard-0", "stall", times=None)
    policy = RetryPolicy(attempts=1, read_timeout_s=0.4)
    start = time.monotonic()
    with pytest.raises(RemoteReadError, match="at the first attempt") as caught:
        list(TarShards(f"{base}/{os.path.basename(path)}", retries=policy))
    assert time.monotonic() - start < 2.0
    assert "read_timeout_s=0.4" in str(caught.value)
    assert proxy.count("shard-0") == 1


def test_infinite_timeouts_wait_for_ever_and_still_stream(tmp_path, http_origin) -> None:
    names = _shards(tmp_path, count=1)
    base, proxy, _ = http_origin(str(tmp_path))
    proxy.fail("shard-0000", "truncate", times=1)
    forever = RetryPolicy(
        base_delay_s=0.01, connect_timeout_s=float("inf"), read_timeout_s=float("inf")
    )
    assert _check(list(_read(base, names, retries=forever))) == _keys(count=1)
