"""Storage's private download cache belongs to the process that made it."""

from __future__ import annotations

import gc
import os

from stoker.storage.remote import Storage


def test_a_forked_child_dropping_the_storage_leaves_its_parents_temporary_cache() -> None:
    storage = Storage()
    folder = storage.local_cache().folder
    marker = os.path.join(folder, "downloaded.tar")
    with open(marker, "wb") as f:
        f.write(b"a shard in use by the parent")
    pid = os.fork()
    if pid == 0:  # the child drops its copy, as a worker collecting garbage does, then exits
        status = 1
        try:
            del storage
            gc.collect()
            status = 0
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert os.path.exists(marker), f"the forked child removed {folder}"
    del storage
    gc.collect()
    assert not os.path.exists(folder), f"{folder} outlived its storage"
