"""Latency, transient failures and dead objects, injected by the proxy in front of the server."""

from __future__ import annotations

import logging
import sys
import threading
import time

import numpy as np
import pytest

from stoker import DataLoader, DatasetError, MissingExtraError
from stoker.formats.packed import PackedDataset, PackedWriter
from stoker.formats.tar import TarShards, write_tar_shards
from stoker.formats.text import JsonLines, TextLines
from stoker.storage import RemoteReadError, RetryPolicy, ShardCache, Storage, is_transient

FAST_RETRY = RetryPolicy(attempts=4, base_delay_s=0.01)


def _files(s3, count: int, prefix: str = "data") -> list[str]:
    return [s3.put(f"{prefix}/part-{f:03d}.txt", f"{f}-a\n{f}-b\n".encode()) for f in range(count)]


def _expected(count: int) -> list[str]:
    return [f"{f}-{x}" for f in range(count) for x in "ab"]


def _timed_read(ds: TextLines, work_s: float) -> float:
    start = time.perf_counter()
    for i, _ in enumerate(ds):
        if i % 2 == 1:
            time.sleep(work_s)  # the model's work on each file's lines
    return time.perf_counter() - start


def test_prefetcher_hides_latency(s3) -> None:
    _files(s3, 6)
    s3.proxy.delay_s = 0.2
    lazy = TextLines(s3.url("data"), storage_options=s3.options, prefetch=0)
    eager = TextLines(s3.url("data"), storage_options=s3.options, prefetch=3)
    serial = _timed_read(lazy, 0.2)  # download, then work, file after file: about 6 x 0.4 s
    overlapped = _timed_read(eager, 0.2)  # downloads run during the work: about 0.2 + 6 x 0.2 s
    assert overlapped < 0.8 * serial, (overlapped, serial)


def test_transient_503s_and_resets_are_retried(s3) -> None:
    _files(s3, 4)
    s3.proxy.fail("part-001", "503", times=2)
    s3.proxy.fail("part-002", "reset", times=1)
    ds = TextLines(s3.url("data"), storage_options=s3.options, retries=FAST_RETRY)
    assert list(ds) == _expected(4)
    assert s3.proxy.count("part-001") == 3  # two 503s, then the download
    assert s3.proxy.count("part-002") >= 2


def test_a_dead_object_is_skipped_and_reported_with_its_url(s3, caplog) -> None:
    _files(s3, 4)
    s3.proxy.fail("part-002", "503", times=None)
    ds = TextLines(s3.url("data"), storage_options=s3.options, retries=FAST_RETRY, on_error="skip")
    with caplog.at_level(logging.WARNING, logger="stoker"):
        got = list(ds)
    assert got == [line for line in _expected(4) if not line.startswith("2-")]
    assert ds.skipped == 1
    assert s3.proxy.count("part-002") >= FAST_RETRY.attempts
    assert s3.url("data/part-002.txt") in caplog.text
    assert "after 4 attempts" in caplog.text


def test_a_dead_object_raises_with_its_url(s3) -> None:
    _files(s3, 3)
    s3.proxy.fail("part-001", "503", times=None)
    ds = JsonLines([s3.url("data/part-001.txt")], storage_options=s3.options, retries=FAST_RETRY)
    with pytest.raises(DatasetError, match=r"s3://bucket-.*/data/part-001\.txt") as caught:
        list(ds)
    assert isinstance(caught.value.__cause__, RemoteReadError)
    assert caught.value.__cause__.url == s3.url("data/part-001.txt")


def test_a_missing_object_is_not_retried(s3) -> None:
    ds = TextLines([s3.url("data/absent.txt")], storage_options=s3.options, retries=FAST_RETRY)
    with pytest.raises(DatasetError, match="not a transient error"):
        list(ds)
    assert s3.proxy.count("absent.txt", "GET") <= 1


def test_tar_shard_dead_object_skip_and_raise(s3, tmp_path) -> None:
    samples = [{"__key__": f"{i:04d}", "cls": i} for i in range(6)]
    for path in write_tar_shards(samples, str(tmp_path / "s-%03d.tar"), max_samples_per_shard=2):
        with open(path, "rb") as f:
            s3.put(f"tars/{path.rsplit('/', 1)[1]}", f.read())
    s3.proxy.fail("s-001.tar", "503", times=None)
    skipping = TarShards(
        s3.url("tars"), storage_options=s3.options, retries=FAST_RETRY, on_error="skip"
    )
    assert [s["__key__"] for s in skipping] == ["0000", "0001", "0004", "0005"]
    assert skipping.skipped == 1
    raising = TarShards(s3.url("tars"), storage_options=s3.options, retries=FAST_RETRY)
    with pytest.raises(RemoteReadError, match=r"s3://.*/tars/s-001\.tar after 4 attempts"):
        list(raising)


def _packed(s3, tmp_path, records: int = 60) -> tuple[str, PackedDataset]:
    folder = str(tmp_path / "packed")
    with PackedWriter(folder, max_shard_bytes=2600) as writer:
        for i in range(records):
            writer.add({"x": np.full(64, i, dtype=np.int32), "label": i})
    return s3.put_folder(folder, "packed"), PackedDataset(folder)


def test_packed_resume_mid_epoch_fetches_no_consumed_shard(s3, tmp_path) -> None:
    url, local = _packed(s3, tmp_path)
    starts = [0]
    for shard in local.manifest["shards"]:
        starts.append(starts[-1] + shard["records"])
    per_shard = local.manifest["shards"][0]["records"]
    assert len(starts) > 4 and all(s["records"] == per_shard for s in local.manifest["shards"][:-1])

    first = PackedDataset(url, storage_options=s3.options, prefetch=1)
    loader = DataLoader(first, batch_size=per_shard)
    it = iter(loader)
    for _ in range(3):  # three shards consumed
        next(it)
    state = loader.state_dict()
    del it
    first.close()
    s3.proxy.reset()

    again = PackedDataset(url, storage_options=s3.options, prefetch=1)
    resumed = DataLoader(again, batch_size=per_shard)
    resumed.load_state_dict(state)
    labels = np.concatenate([b["label"] for b in resumed]).tolist()
    again.close()
    assert labels == list(range(3 * per_shard, starts[-1]))
    for shard in range(3):
        assert s3.proxy.count(f"shard-{shard:05d}.npy") == 0
    assert s3.proxy.count(f"shard-{3:05d}.npy") == 1


def test_packed_dead_shard_names_its_url_and_the_loader_can_skip_it(s3, tmp_path) -> None:
    url, _ = _packed(s3, tmp_path, records=30)
    s3.proxy.fail("shard-00001.npy", "503", times=None)
    ds = PackedDataset(url, storage_options=s3.options, retries=FAST_RETRY, prefetch=0)
    with pytest.raises(RemoteReadError, match=r"s3://.*/packed/shard-00001\.npy"):
        ds[len(ds) - 1] if ds.manifest["shards"][0]["records"] == 0 else ds[
            ds.manifest["shards"][0]["records"]
        ]
    loader = DataLoader(ds, batch_size=None, on_error="skip", max_errors=0.5)
    got = [int(s["label"]) for s in loader]
    ds.close()
    assert 0 < len(got) < 30 and got == sorted(got)


def test_concurrent_readers_download_an_object_once(tmp_path) -> None:
    cache = ShardCache(tmp_path, max_bytes=None)
    downloads = []

    def fetch(dest: str) -> None:
        downloads.append(dest)
        time.sleep(0.1)
        with open(dest, "wb") as f:
            f.write(b"x" * 100)

    held = []
    start = threading.Barrier(4)  # all four miss together

    def read() -> None:
        start.wait()
        held.append(cache.get("s3://b/k", 100, fetch))  # kept open: the others must not wait for it

    threads = [threading.Thread(target=read) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads), (
        "readers that missed together wait for each other"
    )
    assert len(downloads) == 1 and len(held) == 4 and sum(h.hit for h in held) == 3
    for h in held:
        h.close()


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (ConnectionResetError("reset by peer"), True),
        (TimeoutError(), True),
        (OSError("503 Service Unavailable"), True),
        (OSError("Please reduce your request rate (SlowDown)"), True),
        (FileNotFoundError("s3://b/k"), False),
        (PermissionError("AccessDenied"), False),
        (ValueError("bad"), False),
    ],
)
def test_is_transient(error: BaseException, transient: bool) -> None:
    assert is_transient(error) is transient


def test_retry_policy_backs_off_exponentially() -> None:
    policy = RetryPolicy(attempts=6, base_delay_s=0.1, max_delay_s=0.5)
    assert [policy.delay(n) for n in range(1, 6)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    with pytest.raises(ValueError, match="attempts"):
        RetryPolicy(attempts=0)


def test_missing_storage_extra_names_it(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "fsspec", None)
    with pytest.raises(MissingExtraError, match=r"pip install 'stoker\[storage\]'"):
        Storage().filesystem("s3://bucket/key")
    with pytest.raises(MissingExtraError, match=r"stoker\[storage\]"):
        TextLines("gs://bucket/prefix/")


def _get_in_process(folder: str, log: str) -> None:
    cache = ShardCache(folder, max_bytes=None)

    def fetch(dest: str) -> None:
        with open(log, "a") as f:
            f.write("download\n")
        time.sleep(0.2)
        with open(dest, "wb") as f:
            f.write(b"y" * 1000)

    with cache.get("s3://b/shared", 1000, fetch) as held, open(held.path, "rb") as f:
        assert f.read() == b"y" * 1000


def test_processes_sharing_a_cache_download_an_object_once(tmp_path) -> None:
    import multiprocessing

    context = multiprocessing.get_context("fork")
    log = str(tmp_path / "log")
    procs = [
        context.Process(target=_get_in_process, args=(str(tmp_path / "cache"), log))
        for _ in range(3)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    with open(log) as f:
        assert f.read().count("download") == 1
