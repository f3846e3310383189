"""A cache folder other users could write: symbolic links planted at the names the cache uses
are never followed, the folder is refused unless only its owner can write it (or it is
sticky, as /tmp), entries that are not the user's own are never used, and nothing in the
folder but the cache's own files is ever deleted."""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator

import pytest

from stoker.storage import ShardCache
from stoker.storage.cache import _DOWNLOAD_LOCK, _LOCK

URL = "s3://bucket/train/shard-000.tar"
PRECIOUS = b"precious"  # a victim file's bytes: 8, the size of the object below
OBJECT = b"12345678"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="acts as another user (needs root)")


def _writer(data: bytes, seen: list[str] | None = None) -> Callable[[str], None]:
    def fetch(dest: str) -> None:
        if seen is not None:
            seen.append(dest)
        with open(dest, "wb") as f:
            f.write(data)

    return fetch


def _read(cache: ShardCache) -> tuple[bytes, bool]:
    """The object's bytes through ``cache`` and whether they were a hit."""
    with cache.get(URL, 8, _writer(OBJECT)) as held, open(held.path, "rb") as f:
        return f.read(), held.hit


def _victim(tmp_path) -> str:
    victim = tmp_path / "victim"
    victim.write_bytes(PRECIOUS)
    os.utime(victim, ns=(10**18, 10**18))
    return str(victim)


def _untouched(victim: str) -> None:
    with open(victim, "rb") as f:
        assert f.read() == PRECIOUS
    assert os.stat(victim).st_mtime_ns == 10**18


def test_links_planted_at_the_lock_names_are_not_followed(tmp_path, caplog) -> None:
    cache = ShardCache(tmp_path / "cache")
    entry = cache.path_for(URL)
    created = [tmp_path / "created-by-lock", tmp_path / "created-by-download-lock"]
    os.symlink(created[0], entry + _LOCK)  # dangling: following it would create the file
    os.symlink(created[1], entry + _DOWNLOAD_LOCK)
    with caplog.at_level(logging.WARNING, logger="stoker"):
        assert _read(cache) == (OBJECT, False)
    assert not any(path.exists() for path in created)
    assert f"{entry}{_LOCK}" in caplog.text and "symbolic link" in caplog.text
    for name in (entry + _LOCK, entry + _DOWNLOAD_LOCK):
        assert not os.path.islink(name)


def test_a_download_never_writes_through_a_planted_link(tmp_path) -> None:
    victim = _victim(tmp_path)
    cache = ShardCache(tmp_path / "cache")
    entry = cache.path_for(URL)
    # the name a download of this thread used to write to, predictable from the pid
    planted = f"{entry}.partial-{os.getpid()}-{threading.get_ident()}"
    os.symlink(victim, planted)
    seen: list[str] = []
    with cache.get(URL, 8, _writer(OBJECT, seen)) as held, open(held.path, "rb") as f:
        assert f.read() == OBJECT
    _untouched(victim)
    assert seen[0] != planted and os.path.dirname(seen[0]) == cache.folder
    assert not os.path.islink(entry) and stat.S_ISREG(os.lstat(entry).st_mode)


def test_an_entry_that_is_a_link_out_of_the_folder_is_removed_not_read(tmp_path, caplog) -> None:
    victim = _victim(tmp_path)
    cache = ShardCache(tmp_path / "cache")
    entry = cache.path_for(URL)
    os.symlink(victim, entry)  # the victim has the object's size: it would pass as a hit
    with caplog.at_level(logging.WARNING, logger="stoker"):
        assert _read(cache) == (OBJECT, False)  # not the victim's bytes as a hit
    _untouched(victim)
    assert entry in caplog.text and "symbolic link" in caplog.text
    assert not os.path.islink(entry)


def test_a_link_named_like_an_entry_is_neither_counted_nor_followed(tmp_path) -> None:
    victim = _victim(tmp_path)
    cache = ShardCache(tmp_path / "cache")
    os.symlink(victim, cache.path_for("s3://bucket/other"))
    cache.get(URL, 8, _writer(OBJECT)).close()
    assert cache.usage() == 8
    _untouched(victim)


def test_eviction_deletes_the_caches_own_files_only(tmp_path) -> None:
    folder = tmp_path / "cache"
    folder.mkdir()
    notes = folder / "notes.txt"  # a user's file in the folder they named
    notes.write_bytes(b"n" * 20)
    os.utime(notes, ns=(10**9, 10**9))  # older than any entry
    cache = ShardCache(folder, max_bytes=10)
    cache.get("s3://bucket/a", 8, _writer(OBJECT)).close()
    cache.get("s3://bucket/b", 8, _writer(OBJECT)).close()
    assert notes.read_bytes() == b"n" * 20
    assert cache.usage() == 8
    assert cache.contains("s3://bucket/b") and not cache.contains("s3://bucket/a")


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702], ids=oct)
def test_a_folder_others_can_write_is_refused_unless_sticky(tmp_path, mode) -> None:
    folder = tmp_path / "shared"
    folder.mkdir()
    os.chmod(folder, mode)
    with pytest.raises(PermissionError) as caught:
        ShardCache(folder)
    text = str(caught.value)
    assert str(folder) in text and f"{mode:o}" in text and "sticky" in text
    os.chmod(folder, mode | stat.S_ISVTX)  # as /tmp: nobody can remove another's files
    ShardCache(folder).get(URL, 8, _writer(OBJECT)).close()


@needs_root
def test_a_folder_owned_by_another_user_is_refused(tmp_path) -> None:
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o755)
    os.chown(folder, 65534, 65534)
    with pytest.raises(PermissionError, match=r"owned by uid 65534") as caught:
        ShardCache(folder)
    assert str(folder) in str(caught.value)


@needs_root
def test_an_entry_owned_by_another_user_is_not_used(tmp_path, caplog) -> None:
    folder = tmp_path / "sticky"
    folder.mkdir()
    os.chmod(folder, 0o1777)
    cache = ShardCache(folder)
    entry = cache.path_for(URL)
    with open(entry, "wb") as f:
        f.write(b"forged!!")  # the object's size
    os.chown(entry, 65534, 65534)
    with caplog.at_level(logging.WARNING, logger="stoker"):
        assert _read(cache) == (OBJECT, False)
    assert entry in caplog.text and "uid 65534" in caplog.text
    assert os.lstat(entry).st_uid == os.geteuid()


@pytest.fixture
def sticky_folder() -> Iterator[str]:
    """A sticky folder every user can write, as a cache in /tmp shared by the users of a
    machine; under the system's temporary folder so that another user can reach it."""
    parent = tempfile.mkdtemp(prefix="stoker-test-sticky-")
    os.chmod(parent, 0o755)
    folder = os.path.join(parent, "cache")
    os.mkdir(folder)
    os.chmod(folder, 0o1777)
    try:
        yield folder
    finally:
        shutil.rmtree(parent, ignore_errors=True)


def _as_nobody(action: Callable[[], str]) -> str:
    """``action()`` run in a forked child that became user nobody (65534); its result."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no return from here
        status = 1
        try:
            os.close(read)
            os.setgid(65534)
            os.setuid(65534)
            try:
                result = action()
            except Exception as exc:
                result = f"{type(exc).__name__}: {exc}"
            os.write(write, result.encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        result = f.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, result
    return result


@needs_root
def test_a_link_another_user_planted_in_a_sticky_folder_is_refused(sticky_folder, tmp_path) -> None:
    victim = _victim(tmp_path)
    entry = _as_nobody(lambda: ShardCache(sticky_folder).path_for(URL))
    os.symlink(victim, entry)  # planted by root: nobody cannot remove it
    os.lchown(entry, 0, 0)

    result = _as_nobody(lambda: _read(ShardCache(sticky_folder))[0].decode())
    assert result.startswith("PermissionError: ") and entry in result, result
    assert "symbolic link" in result
    _untouched(victim)
