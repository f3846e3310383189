"""Downloads through the fault proxy: a short body is retried, each attempt one request, and
the retries really wait, exponentially longer up to the policy's cap."""

from __future__ import annotations

import itertools
import os

import pytest

from stoker.formats.text import TextLines
from stoker.storage import RemoteReadError, RetryPolicy, Storage
from stoker.storage.fetch import download

BODY = b"".join(f"line {i:05d}\n".encode() for i in range(4000))  # 44 KB: cut in half


def test_a_download_cut_short_is_retried_and_arrives_whole(s3, tmp_path) -> None:
    url = s3.put("data/part-000.txt", BODY)
    # s3fs's own resumes of a cut body are off: each cut ends one of stoker's attempts
    s3.proxy.fail("part-000", "truncate", times=2)
    storage = Storage(s3.options)
    delays: list[float] = []
    dest = str(tmp_path / "copy")
    policy = RetryPolicy(attempts=3, base_delay_s=0.01)
    download(storage.filesystem(url), url, dest, size=len(BODY), policy=policy, sleep=delays.append)
    with open(dest, "rb") as f:
        assert f.read() == BODY
    assert s3.proxy.count("part-000") == 3  # two cut bodies, then the whole one
    assert delays == [0.01, 0.02]  # stoker's own retries, and only those


def test_a_reader_gets_the_whole_file_after_a_short_download(s3) -> None:
    s3.put("data/part-000.txt", BODY)
    s3.proxy.fail("part-000", "truncate", times=1)
    lines = list(TextLines(s3.url("data"), storage_options=s3.options, retries=3))
    assert lines == BODY.decode().splitlines()
    assert s3.proxy.count("part-000") == 2  # the cut one, then the whole body again


def test_downloads_cut_short_every_time_fail_naming_the_url(s3, tmp_path) -> None:
    url = s3.put("data/part-000.txt", BODY)
    s3.proxy.fail("part-000", "truncate", times=None)
    storage = Storage(s3.options)
    dest = str(tmp_path / "copy")
    policy = RetryPolicy(attempts=2, base_delay_s=0.01)
    delays: list[float] = []
    expected = r"cannot download s3://.*/data/part-000\.txt after 2 attempts"
    with pytest.raises(RemoteReadError, match=expected):
        download(
            storage.filesystem(url), url, dest, size=len(BODY), policy=policy, sleep=delays.append
        )
    assert s3.proxy.count("part-000") == 2  # one request per attempt
    assert delays == [0.01]
    assert not os.path.exists(dest)  # nothing half-written is left behind


def _over_http(s3) -> tuple[str, Storage]:
    """The object at a plain HTTP URL through the proxy: fsspec's HTTP file system does not
    retry by itself, so every retry and every wait below is stoker's."""
    s3.put("data/part-000.txt", BODY)
    s3.fs.call_s3("put_object_acl", Bucket=s3.bucket, Key="data/part-000.txt", ACL="public-read")
    return f"{s3.proxy.endpoint}/{s3.bucket}/data/part-000.txt", Storage()


def test_the_backoff_doubles_up_to_its_cap(s3, tmp_path) -> None:
    url, storage = _over_http(s3)
    s3.proxy.fail("part-000", "503", times=5)
    delays: list[float] = []
    policy = RetryPolicy(attempts=6, base_delay_s=0.1, max_delay_s=0.3)
    dest = str(tmp_path / "copy")
    download(storage.filesystem(url), url, dest, size=len(BODY), policy=policy, sleep=delays.append)
    assert delays == [0.1, 0.2, 0.3, 0.3, 0.3]
    assert s3.proxy.count("part-000") == 6
    with open(dest, "rb") as f:
        assert f.read() == BODY


def test_the_retries_really_wait_between_requests(s3, tmp_path) -> None:
    url, storage = _over_http(s3)
    s3.proxy.fail("part-000", "503", times=4)
    policy = RetryPolicy(attempts=5, base_delay_s=0.05, max_delay_s=0.15)
    dest = str(tmp_path / "copy")
    download(storage.filesystem(url), url, dest, size=len(BODY), policy=policy)  # time.sleep
    arrivals = s3.proxy.times("part-000")
    assert len(arrivals) == 5
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    for gap, delay in zip(gaps, [0.05, 0.1, 0.15, 0.15], strict=True):
        assert gap >= delay - 0.005, (gaps, delay)  # the request waited out its delay
    assert gaps[1] > gaps[0] + 0.03 and gaps[2] > gaps[0] + 0.06, gaps  # and the delays grew
