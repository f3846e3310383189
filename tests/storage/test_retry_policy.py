"""A retry policy in requests and seconds: the attempts the user sets are the requests the
server sees (the clients' own retries are off), and each request waits at most the policy's
connect and read timeouts."""

from __future__ import annotations

import time

import pytest

from stoker import DatasetError
from stoker.formats.text import TextLines
from stoker.storage import RemoteReadError, RetryPolicy, Storage
from stoker.storage.fetch import download
from storage.conftest import assert_loopback

BODY = b"".join(f"line {i:05d}\n".encode() for i in range(2000))


def _user_options(s3) -> dict:
    """storage_options as a user writes them: the endpoint and credentials, nothing about
    retries or timeouts (spelled out here, whatever the fixture's options become)."""
    assert_loopback(s3.proxy.endpoint)
    return {
        "endpoint_url": s3.proxy.endpoint,
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"region_name": "us-east-1"},
    }


@pytest.mark.parametrize("attempts", [1, 3])
def test_the_attempts_are_the_requests_s3_sees(s3, attempts) -> None:
    url = s3.put("data/part-000.txt", BODY)
    s3.proxy.fail("part-000", "503", times=None)
    policy = RetryPolicy(attempts=attempts, base_delay_s=0.01)
    ds = TextLines([url], storage_options=_user_options(s3), retries=policy)
    with pytest.raises(DatasetError, match=r"s3://.*/data/part-000\.txt"):
        list(ds)
    assert s3.proxy.count("part-000") == attempts


def test_the_default_policy_sends_five_requests_with_its_own_waits(s3, tmp_path) -> None:
    url = s3.put("data/part-000.txt", BODY)
    s3.proxy.fail("part-000", "503", times=None)
    storage = Storage(_user_options(s3))  # retries=5
    delays: list[float] = []
    with pytest.raises(RemoteReadError, match="after 5 attempts"):
        download(
            storage.filesystem(url),
            url,
            str(tmp_path / "copy"),
            size=len(BODY),
            policy=storage.retry,
            sleep=delays.append,
        )
    assert s3.proxy.count("part-000") == 5
    assert delays == [0.2, 0.4, 0.8, 1.6]  # stoker's waits only: 3 s in all


def test_a_body_cut_short_is_one_attempt(s3, tmp_path) -> None:
    url = s3.put("data/part-000.txt", BODY)
    s3.proxy.fail("part-000", "truncate", times=2)
    storage = Storage(_user_options(s3))
    dest = str(tmp_path / "copy")
    delays: list[float] = []
    policy = RetryPolicy(attempts=3, base_delay_s=0.01)
    download(storage.filesystem(url), url, dest, size=len(BODY), policy=policy, sleep=delays.append)
    with open(dest, "rb") as f:
        assert f.read() == BODY
    assert s3.proxy.count("part-000") == 3 and delays == [0.01, 0.02]


def test_a_listing_is_retried_by_the_policy(s3) -> None:
    s3.put("data/part-000.txt", BODY)
    s3.proxy.fail("list-type", "503", times=1)
    policy = RetryPolicy(attempts=2, base_delay_s=0.01)
    lines = list(TextLines(s3.url("data"), storage_options=_user_options(s3), retries=policy))
    assert lines == BODY.decode().splitlines()
    s3.proxy.reset()
    s3.proxy.fail("list-type", "503", times=None)
    with pytest.raises(RemoteReadError, match=r"cannot list s3://.*/data after 2 attempts"):
        TextLines(s3.url("data"), storage_options=_user_options(s3), retries=policy)
    assert s3.proxy.count("/bucket-", "GET") == 2  # the listing's request, once per attempt


@pytest.mark.parametrize("attempts", [1, 2])
def test_a_stalled_s3_server_fails_within_the_read_timeout(s3, attempts) -> None:
    url = s3.put("data/part-000.txt", BODY)
    s3.proxy.fail("part-000", "stall", times=None)
    policy = RetryPolicy(attempts=attempts, base_delay_s=0.01, read_timeout_s=0.5)
    ds = TextLines([url], storage_options=_user_options(s3), retries=policy)
    start = time.monotonic()
    with pytest.raises(DatasetError) as caught:
        list(ds)
    elapsed = time.monotonic() - start
    assert elapsed < attempts * 0.5 + 2.0, elapsed
    assert s3.proxy.count("part-000") == attempts
    tries = "at the first attempt" if attempts == 1 else f"after {attempts} attempts"
    text = str(caught.value.__cause__)
    assert tries in text and "read_timeout_s=0.5" in text, text


def _public(s3, name: str) -> str:
    s3.put(name, BODY)
    s3.fs.call_s3("put_object_acl", Bucket=s3.bucket, Key=name, ACL="public-read")
    return f"{s3.proxy.endpoint}/{s3.bucket}/{name}"


@pytest.mark.parametrize("attempts", [1, 2])
def test_a_stalled_http_server_fails_within_the_read_timeout(s3, tmp_path, attempts) -> None:
    url = _public(s3, "data/part-000.txt")
    s3.proxy.fail("part-000", "stall-mid-body", times=None)
    policy = RetryPolicy(attempts=attempts, base_delay_s=0.01, read_timeout_s=0.5)
    storage = Storage(retries=policy)
    start = time.monotonic()
    with pytest.raises(RemoteReadError, match=r"read_timeout_s=0\.5"):
        download(storage.filesystem(url), url, str(tmp_path / "copy"), size=None, policy=policy)
    assert time.monotonic() - start < attempts * 0.5 + 2.0
    assert s3.proxy.count("part-000") == attempts


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("connect_timeout_s", 0, "connect_timeout_s must be a positive number of seconds, got 0"),
        ("read_timeout_s", -1.0, "read_timeout_s must be a positive number of seconds, got -1.0"),
        (
            "read_timeout_s",
            float("nan"),
            "read_timeout_s must be a positive number of seconds, got nan",
        ),
    ],
)
def test_bad_timeouts_are_refused_naming_them(field, value, message) -> None:
    with pytest.raises(ValueError) as caught:
        RetryPolicy(**{field: value})
    assert str(caught.value) == message


def test_infinite_timeouts_wait_for_ever_and_still_read(s3) -> None:
    url = s3.put("data/part-000.txt", BODY)
    public = _public(s3, "data/part-001.txt")
    forever = RetryPolicy(connect_timeout_s=float("inf"), read_timeout_s=float("inf"))
    assert list(TextLines([url], storage_options=_user_options(s3), retries=forever)) == (
        BODY.decode().splitlines()
    )
    assert list(TextLines([public], retries=forever)) == BODY.decode().splitlines()


def test_a_text_file_the_network_cannot_fetch_is_not_blamed(s3) -> None:
    url = s3.put("data/part-000.txt", BODY)
    s3.proxy.fail("part-000", "reset", times=None)
    ds = TextLines([url], storage_options=_user_options(s3), retries=RetryPolicy(attempts=2))
    with pytest.raises(DatasetError) as caught:
        list(ds)
    text = str(caught.value)
    assert f"cannot download {url} after 2 attempts" in text, text
    assert "The network or the server failed, not the data" in text, text
    assert "Fix or remove it" not in text and ".." not in text, text
    assert isinstance(caught.value.__cause__, RemoteReadError) and caught.value.__cause__.network
