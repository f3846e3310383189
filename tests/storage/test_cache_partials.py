"""Partial downloads: one killed mid-way (SIGKILL: no clean-up of its own) counts in the
cache's usage and is removed by the next download into the folder, never while the process
writing it is alive; a download that fails leaves nothing behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from stoker.storage import ShardCache

BIG = 8 * 2**20
LIMIT = 2**20
_CHILD = """
import json, sys
from stoker.storage import ShardCache, Storage
options, folder, url = json.loads(sys.argv[1])
storage = Storage(options, cache=ShardCache(folder, max_bytes={limit}), prefetch=0, retries=1)
storage.fetch(url)
"""


def _partials(folder: str) -> list[str]:
    return sorted(name for name in os.listdir(folder) if "partial" in name)


def _wait_for_partial(folder: str, child: subprocess.Popen[bytes], at_least: int) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert child.poll() is None, child.communicate()
        for name in _partials(folder):
            if os.path.getsize(os.path.join(folder, name)) >= at_least:
                return name
        time.sleep(0.05)
    raise AssertionError(f"no partial download of {at_least} bytes in {folder}")


def _write(data: bytes):
    def fetch(dest: str) -> None:
        with open(dest, "wb") as f:
            f.write(data)

    return fetch


def test_a_download_killed_mid_way_is_cleaned_by_the_next_one(s3, tmp_path) -> None:
    url = s3.put("big/shard.bin", os.urandom(BIG))
    s3.proxy.fail("big/shard.bin", "stall-mid-body", times=None)  # half the body, then it hangs
    folder = str(tmp_path / "cache")
    cache = ShardCache(folder, max_bytes=LIMIT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD.format(limit=LIMIT), json.dumps([s3.options, folder, url])],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        partial = _wait_for_partial(folder, child, BIG // 4)
        # The child is alive: another download leaves its partial file alone.
        cache.get("s3://bucket/small-1", 100, _write(b"a" * 100)).close()
        assert _partials(folder) == [partial]
    finally:
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=30)
    assert child.returncode == -signal.SIGKILL
    left = os.path.getsize(os.path.join(folder, partial))
    assert left >= BIG // 4
    assert cache.usage() == left + 100  # the partial file takes disk space: it counts
    cache.get("s3://bucket/small-2", 100, _write(b"b" * 100)).close()
    assert _partials(folder) == []  # its writer is dead: removed
    assert cache.usage() <= LIMIT


def test_a_failed_download_leaves_no_partial_file(tmp_path) -> None:
    folder = str(tmp_path / "cache")
    cache = ShardCache(folder)

    def fails(dest: str) -> None:
        with open(dest, "wb") as f:
            f.write(b"x" * 1000)
        raise ConnectionResetError("the connection broke mid-way")

    with pytest.raises(ConnectionResetError):
        cache.get("s3://bucket/a", 2000, fails)
    assert _partials(folder) == []
    assert cache.usage() == 0
