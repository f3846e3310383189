"""Faults inside workers, done for real: exceptions, SIGKILL, os._exit, hangs, init errors.

Every test is followed by the leak check of ``conftest.py``.
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from engine.engine_datasets import (
    BlocksFrom,
    BreaksWhenUnpickled,
    Exits,
    Hangs,
    InitFailed,
    NeedsAModuleItCannotFind,
    Raises,
    RaisesUnpicklable,
    SampleBroken,
    Samples,
    collate_unpicklable_at,
    failing_init,
    use_up_file_descriptors,
)
from stoker import DataLoader, WorkerError

MODES = ("process", "thread")
_ERROR_WITHIN_S = 10.0  # generous: the engine notices a death at once, a slow CI box may not


def notes(exc: BaseException) -> str:
    return "\n".join(getattr(exc, "__notes__", []))


def drain(
    loader: DataLoader, catch: type[BaseException]
) -> tuple[list[list[int]], list[BaseException]]:
    """Iterates to the end, collecting batches and the errors raised on the way."""
    batches, errors = [], []
    it = iter(loader)
    while True:
        try:
            batch = next(it)
        except StopIteration:
            return batches, errors
        except catch as exc:
            errors.append(exc)
            continue
        batches.append(batch[0].tolist())


# ------------------------------------------------------------- exceptions in the dataset


@pytest.mark.parametrize("in_order", [True, False], ids=["in_order", "as_ready"])
@pytest.mark.parametrize("mode", MODES)
def test_dataset_exception_arrives_with_its_type_and_the_worker_story(
    mode: str, in_order: bool
) -> None:
    loader = DataLoader(
        Raises(20, bad=9), batch_size=2, num_workers=2, worker_mode=mode, in_order=in_order
    )
    batches, errors = drain(loader, SampleBroken)
    assert len(errors) == 1
    error = errors[0]
    assert type(error) is SampleBroken
    worker = int(re.search(r"raised by worker (\d)", str(error)).group(1))
    text = notes(error)
    assert f"stoker worker {worker}" in text  # the worker that really raised it
    assert "indices [8, 9]" in text
    assert "Worker traceback" in text and "in __getitem__" in text and "raise SampleBroken" in text
    if mode == "process":
        assert re.search(r"\(pid \d+\)", text)
    expected = [[i, i + 1] for i in range(0, 20, 2) if i != 8]
    assert (
        batches if in_order else sorted(batches)
    ) == expected  # the epoch went on after the error


@pytest.mark.parametrize("mode", MODES)
def test_exception_that_cannot_be_rebuilt_becomes_a_worker_error(mode: str) -> None:
    loader = DataLoader(RaisesUnpicklable(6), batch_size=2, num_workers=2, worker_mode=mode)
    it = iter(loader)
    with pytest.raises(WorkerError, match=r"NeedsKeyword: cannot rebuild me: sample 1") as excinfo:
        next(it)
    assert "indices [0, 1]" in notes(excinfo.value) and "in __getitem__" in notes(excinfo.value)
    assert [b[0].tolist() for b in it] == [[2, 3], [4, 5]]


@pytest.mark.parametrize("mode", MODES)
def test_worker_init_fn_error_reaches_the_trainer(mode: str) -> None:
    loader = DataLoader(
        Samples(10), batch_size=2, num_workers=2, worker_mode=mode, worker_init_fn=failing_init
    )
    with pytest.raises(InitFailed, match=r"worker_init_fn refuses to start worker 1") as excinfo:
        list(loader)
    text = notes(excinfo.value)
    assert "stoker worker 1" in text and "in worker_init_fn" in text
    assert "in failing_init" in text  # the worker's traceback


# ------------------------------------------------------------- dead workers


def test_sigkilled_worker_is_reported_with_pid_cause_and_indices(tmp_path) -> None:
    release = tmp_path / "release"  # never created: indices >= 4 stay in flight until the kill
    loader = DataLoader(BlocksFrom(40, 4, str(release)), batch_size=2, num_workers=1)
    it = iter(loader)
    first = next(it)
    assert first[0].tolist() == [0, 1]
    pid = int(first[1][0])
    assert pid != os.getpid()
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    with pytest.raises(WorkerError) as excinfo:
        for _ in range(2):  # [2, 3] may already be waiting to be delivered
            next(it)
    elapsed = time.monotonic() - killed_at
    text = str(excinfo.value)
    assert f"(pid {pid})" in text and "SIGKILL" in text and "out-of-memory" in text
    assert "[4, 5]" in text  # the batch it was loading when it died
    assert "on_worker_death='restart'" in text  # says how to survive it
    assert elapsed < _ERROR_WITHIN_S, f"the death was reported after {elapsed:.1f} s"
    with pytest.raises(StopIteration):
        next(it)  # the epoch is over, not stuck


@pytest.mark.parametrize("in_order", [True, False], ids=["in_order", "as_ready"])
def test_restart_replaces_a_sigkilled_worker_and_delivers_every_index_once(
    in_order: bool, tmp_path
) -> None:
    release = tmp_path / "release"
    loader = DataLoader(
        BlocksFrom(40, 4, str(release)),
        batch_size=2,
        num_workers=2,
        in_order=in_order,
        on_worker_death="restart",
    )
    it = iter(loader)
    first = next(it)
    victim = int(first[1][0])
    os.kill(victim, signal.SIGKILL)
    release.touch()
    with pytest.warns(
        RuntimeWarning, match=rf"\(pid {victim}\) was killed by SIGKILL .*started a replacement"
    ):
        rest = list(it)
    batches = [first[0].tolist()] + [b[0].tolist() for b in rest]
    indices = [i for b in batches for i in b]
    assert sorted(indices) == list(range(40))  # every index exactly once
    if in_order:
        assert indices == list(range(40))
    assert (
        len({int(p) for b in rest for p in b[1]} - {victim}) == 2
    )  # the survivor and the replacement


def test_worker_calling_os_exit_is_reported_with_its_status() -> None:
    loader = DataLoader(Exits(20, bad=5, status=3), batch_size=2, num_workers=2)
    with pytest.raises(WorkerError, match=r"exited with status 3") as excinfo:
        list(loader)
    assert "[4, 5]" in str(excinfo.value)


# ------------------------------------------------------------- hangs


@pytest.mark.parametrize("mode", MODES)
def test_hanging_worker_times_out_with_its_stack(mode: str, tmp_path) -> None:
    # A thread cannot be killed: its hang ends when the test creates the release file.
    release = str(tmp_path / "release") if mode == "thread" else None
    loader = DataLoader(
        Hangs(10, bad=4, release_path=release),
        batch_size=2,
        num_workers=2,
        worker_mode=mode,
        timeout=1,
    )
    it = iter(loader)
    assert [next(it)[0].tolist() for _ in range(2)] == [[0, 1], [2, 3]]
    started = time.monotonic()
    try:
        with pytest.raises(WorkerError) as excinfo:
            next(it)
    finally:
        if release is not None:
            open(release, "w").close()
    elapsed = time.monotonic() - started
    text = str(excinfo.value)
    assert "DataLoader timed out after 1 seconds waiting for" in text and "indices [4, 5]" in text
    assert "sleep_forever_in_dataset" in text and "__getitem__" in text  # the worker's stack
    assert "pid None" not in text
    if mode == "process":
        assert re.search(r"from worker \d \(pid \d+\)", text)
    assert elapsed < _ERROR_WITHIN_S


def test_a_timeout_after_the_stack_files_were_removed_still_names_the_stack_and_closes() -> None:
    """Another trainer sharing /tmp (another PID namespace) removed stoker-stack-*: the
    timeout error still comes (saying there is no stack), and the pool closes."""
    import glob
    import tempfile

    from stoker._proc import descendants

    loader = DataLoader(Hangs(10, bad=4), batch_size=2, num_workers=2, timeout=1)
    it = iter(loader)
    assert [next(it)[0].tolist() for _ in range(2)] == [[0, 1], [2, 3]]
    mine = glob.glob(os.path.join(tempfile.gettempdir(), f"stoker-stack-{os.getpid()}-*"))
    assert len(mine) == 2
    for path in mine:
        os.unlink(path)
    with pytest.raises(WorkerError) as excinfo:
        next(it)
    text = str(excinfo.value)
    assert "DataLoader timed out after 1 seconds waiting for" in text and "indices [4, 5]" in text
    assert "(no stack: FileNotFoundError" in text
    deadline = time.monotonic() + 10
    while descendants(os.getpid()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert descendants(os.getpid()) == [], "the stuck workers were left running"


def refuse_batches_with_seven(samples: list) -> list:
    """A collate_fn that fails on one batch."""
    if any(sample[0] == 7 for sample in samples):
        raise ZeroDivisionError("collate_fn cannot divide sample 7")
    return [sample[0] for sample in samples]


@pytest.mark.parametrize("mode", MODES)
def test_collate_fn_exception_arrives_like_a_dataset_exception(mode: str) -> None:
    loader = DataLoader(
        Samples(10),
        batch_size=2,
        num_workers=2,
        worker_mode=mode,
        collate_fn=refuse_batches_with_seven,
    )
    it = iter(loader)
    assert [next(it) for _ in range(3)] == [[0, 1], [2, 3], [4, 5]]
    with pytest.raises(ZeroDivisionError, match="cannot divide sample 7") as excinfo:
        next(it)
    assert "indices [6, 7]" in notes(excinfo.value)
    assert "in refuse_batches_with_seven" in notes(excinfo.value)
    assert list(it) == [[8, 9]]


@pytest.mark.parametrize("policy", ["raise", "restart"])
def test_persistent_loader_survives_a_worker_killed_between_epochs(policy: str) -> None:
    loader = DataLoader(
        Samples(20), batch_size=2, num_workers=2, persistent_workers=True, on_worker_death=policy
    )
    first_pids = {int(p) for b in loader for p in b[1]}
    victim = min(first_pids)
    os.kill(victim, signal.SIGKILL)
    if policy == "raise":
        with pytest.raises(WorkerError, match=rf"\(pid {victim}\) was killed by SIGKILL"):
            list(loader)
        # the broken pool was shut down: the next epoch starts fresh workers
        batches = list(loader)
        assert {int(p) for b in batches for p in b[1]}.isdisjoint(first_pids)
    else:
        with pytest.warns(RuntimeWarning, match=rf"\(pid {victim}\) was killed by SIGKILL"):
            batches = list(loader)
        assert victim not in {int(p) for b in batches for p in b[1]}
    assert [b[0].tolist() for b in batches] == [[i, i + 1] for i in range(0, 20, 2)]
    loader.close()


# ------------------------------------------------------------- failures outside the fetch


@pytest.mark.parametrize("policy", ["raise", "restart"])
def test_a_batch_that_cannot_be_pickled_is_that_batchs_error_not_a_dead_worker(policy: str) -> None:
    """The worker encodes its answer outside the dataset's guarded region; a batch pickle
    refuses used to kill the worker (four of them, with restart) and blame os._exit."""
    loader = DataLoader(
        Samples(12),
        batch_size=2,
        num_workers=2,
        collate_fn=collate_unpicklable_at(5),
        on_worker_death=policy,
    )
    it = iter(loader)
    got = [next(it) for _ in range(2)]
    with pytest.raises(TypeError) as excinfo:
        next(it)
    assert str(excinfo.value) == "cannot pickle '_thread.lock' object"
    assert (
        "stoker could not send this batch to the trainer: a process worker pickles what "
        "collate_fn returns" in notes(excinfo.value)
    )
    assert "while loading indices [4, 5]" in notes(excinfo.value)
    rest = list(it)  # the workers are alive: the epoch goes on
    assert got + rest == [[0, 1], [2, 3], [6, 7], [8, 9], [10, 11]]


def test_a_worker_that_cannot_start_says_why() -> None:
    loader = DataLoader(
        BreaksWhenUnpickled(8), batch_size=2, num_workers=2, multiprocessing_context="spawn"
    )
    with pytest.raises(NeedsAModuleItCannotFind) as excinfo:
        next(iter(loader))
    assert str(excinfo.value) == "this dataset of 8 samples cannot be rebuilt in a worker"
    text = notes(excinfo.value)
    assert (
        "while the worker was starting (receiving the dataset, collate_fn and worker_init_fn)"
        in text
    )
    assert "os._exit" not in text


def test_a_worker_killed_by_sigbus_hears_both_causes(tmp_path) -> None:
    """A mapped file that shrinks under a worker kills it with SIGBUS, like a full /dev/shm."""
    from engine.engine_datasets import MappedPages

    path = tmp_path / "pages.bin"
    path.write_bytes(bytes(range(1, 9)) * 4096)  # 32 KiB: 8 pages, each starting with 1
    loader = DataLoader(MappedPages(str(path), 8), batch_size=1, num_workers=1, prefetch_factor=1)
    it = iter(loader)
    assert next(it).tolist() == [1]  # the worker has mapped the file
    with open(path, "r+b") as f:
        f.truncate(0)  # the file shrinks while it is mapped
    with pytest.raises(WorkerError) as excinfo:
        list(it)
    text = str(excinfo.value)
    assert (
        "was killed by SIGBUS (a bus error: a memory-mapped file was read past its end. Either "
        "/dev/shm is full" in text
    )
    assert (
        "or a file the dataset maps (a packed shard, an .npy opened with mmap_mode) shrank or "
        "was rewritten" in text
    )


_OUT_OF_FDS = r"""
import os, resource, sys
sys.path.insert(0, sys.argv[1])
from engine.engine_datasets import Samples
from stoker import DataLoader

loader = DataLoader(Samples(12, width=8192), batch_size=4, num_workers=1, prefetch_factor=1,
                    timeout=30)
it = iter(loader)
it.start()  # the worker runs; its first 256 KiB batch will come through a one-off segment
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
fds = len(os.listdir("/proc/self/fd")) - 1  # (less the one listdir held)
resource.setrlimit(resource.RLIMIT_NOFILE, (fds, hard))  # no fd left to map it
try:
    next(it)
except OSError as exc:
    print("raised", type(exc).__name__, exc.errno, "|".join(getattr(exc, "__notes__", [])))
finally:
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
rest = [b[0].tolist() for b in it]
print("rest", rest)
"""


def test_a_batch_the_trainer_cannot_map_is_that_batchs_error_not_a_hang(tmp_path) -> None:
    """Out of file descriptors while a batch arrives: the batch's own error, at once, and the
    epoch goes on; the message used to be dropped, and next() waited forever."""
    import subprocess
    import sys
    from pathlib import Path

    tests = str(Path(__file__).resolve().parents[1])
    done = subprocess.run(
        [sys.executable, "-c", _OUT_OF_FDS, tests], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    raised, rest = done.stdout.splitlines()[-2:]
    assert raised.startswith("raised OSError 24 ")  # EMFILE
    assert (
        "Raised in the trainer while it received the batch at indices [0, 1, 2, 3] from worker "
        "0: the batch's shared memory could not be mapped. The worker and the rest of the epoch "
        "are unaffected."
    ) in raised
    assert rest == "rest [[4, 5, 6, 7], [8, 9, 10, 11]]"


_SLOTS_RUN_OUT = r"""
import os, resource, sys, warnings
sys.path.insert(0, sys.argv[1])
from engine.engine_datasets import Samples
from stoker import DataLoader

warnings.simplefilter("always")
loader = DataLoader(Samples(16, width=8192), batch_size=4, num_workers=1, prefetch_factor=1,
                    timeout=30)
it = iter(loader)
batches = [next(it)]  # the slot pool exists now, with one slot
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")), hard))
try:
    batches.append(next(it))  # dispatching the next task needs a new slot: none can be made
finally:
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
batches.extend(it)
print("got", [b[0].tolist() for b in batches])
"""


def test_a_slot_that_cannot_be_made_mid_epoch_loses_nothing(tmp_path) -> None:
    """Making a slot failed inside next() after the sampler's indices were drawn: the
    indices were lost, and an already loaded batch could be dropped. Now the task goes out
    without a slot, the pool stays as it is, and one warning says so."""
    import subprocess
    import sys
    from pathlib import Path

    tests = str(Path(__file__).resolve().parents[1])
    done = subprocess.run(
        [sys.executable, "-c", _SLOTS_RUN_OUT, tests], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (
        done.stdout.splitlines()[-1]
        == "got [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]"
    )
    assert done.stderr.count("stoker could not create another shared-memory slot for batches") == 1
    assert "[Errno 24] Too many open files" in done.stderr
    assert "Nothing is lost." in done.stderr


_SHM_FILLS_UP = r"""
import os, sys, warnings
sys.path.insert(0, sys.argv[1])
from engine.engine_datasets import Samples
from stoker import DataLoader

warnings.simplefilter("always")
# 1 MiB batches
loader = DataLoader(Samples(24, width=32768), batch_size=4, num_workers=2, timeout=60)
it = iter(loader)
batches = [next(it)]
slots = loader._live_pool().slots  # made for the first batch, not yet all created
print("slots before", len(slots.names), "of", slots.capacity)
fd = os.open("/dev/shm/filler", os.O_CREAT | os.O_WRONLY)
size = 0
while True:  # fill /dev/shm to its last page
    try:
        os.posix_fallocate(fd, size, 4096)
    except OSError:
        break
    size += 4096
os.close(fd)
batches.extend(it)
print("slots after", len(slots.names))
print("got", [i for b in batches for i in b[0].tolist()])
"""


def test_dev_shm_filling_up_mid_epoch_loses_no_sample(tmp_path) -> None:
    """A real, private /dev/shm of 16 MiB (a tmpfs in a mount namespace of its own, so no
    other process is touched), filled to the last page after the first batch."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    if shutil.which("unshare") is None:
        pytest.skip("needs util-linux's unshare to give the test a /dev/shm of its own")
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(
            f"cannot create a mount namespace here ({probe.stderr.strip()}): needs root or "
            "CAP_SYS_ADMIN"
        )
    tests = str(Path(__file__).resolve().parents[1])
    script = tmp_path / "fill.py"
    script.write_text(_SHM_FILLS_UP)
    command = f"mount -t tmpfs -o size=16M tmpfs /dev/shm && {sys.executable} {script} {tests}"
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", command],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    before, after, got = done.stdout.splitlines()[-3:]
    assert got == f"got {list(range(24))}"
    # the fault happened: slots were still to be made when /dev/shm filled up, none was made
    # after, and the one warning says why
    made, _, capacity = before.split()[2:]
    assert int(made) < int(capacity), before
    assert after == f"slots after {made}"
    warned = "stoker could not create another shared-memory slot for batches (cannot reserve"
    assert done.stderr.count(warned) == 1, done.stderr[-3000:]
    assert "No space left on device" in done.stderr


def test_a_worker_that_cannot_map_a_slot_sends_the_batch_through_the_pipe() -> None:
    """Real file-descriptor exhaustion in the worker: mapping a slot fails with EMFILE. The
    batch comes anyway, and the warning names the worker, the indices and the OSError."""
    loader = DataLoader(
        Samples(40, width=32768),  # 1 MiB batches: they go to shared-memory slots
        batch_size=4,
        num_workers=1,
        multiprocessing_context="fork",
        worker_init_fn=use_up_file_descriptors,
        timeout=30,
    )
    with pytest.warns(RuntimeWarning) as warned:
        batches = list(loader)
    assert [int(i) for b in batches for i in b[0]] == list(range(40))
    assert all((b[4] == b[0][:, None]).all() for b in batches)  # each row holds its index
    texts = [str(w.message) for w in warned if "shared-memory slot" in str(w.message)]
    assert len(texts) == 1, texts  # once per worker, however many batches it concerns
    assert re.fullmatch(
        r"stoker worker 0 \(pid \d+\) could not map its shared-memory slot for indices "
        r"\[(\d+), \d+, \d+, \d+\] \(OSError: \[Errno 24\] Too many open files\); that "
        r"batch, and any later one whose slot it cannot map, travels through the pipe instead, "
        r"which is slower\. Nothing is lost\. If the worker ran out of file descriptors, raise "
        r"the open-file limit \(ulimit -n\) or open fewer files in the dataset\.",
        texts[0],
    ), texts[0]


_REPLACEMENT_FAILS = r"""
import os, resource, signal, sys, warnings
sys.path.insert(0, sys.argv[1])
from engine.engine_datasets import Samples
from stoker import DataLoader, WorkerError

warnings.simplefilter("ignore")
loader = DataLoader(Samples(40), batch_size=2, num_workers=2, persistent_workers=True,
                    on_worker_death="restart", timeout=30)
it = iter(loader)
first = next(it)
while 1 not in loader._pool.pids:  # worker 1 has said it is ready
    next(it)
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
# no pipe for a new worker
resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")), hard))
os.kill(loader._pool.pids[1], signal.SIGKILL)
try:
    list(it)
except WorkerError as exc:
    print("raised", str(exc).replace("\n", " "))
finally:
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
for epoch in range(2):  # a fresh pool each time the loader is iterated again
    print("epoch", sorted(int(i) for b in loader for i in b[0]) == list(range(40)))
loader.close()
"""


def test_a_replacement_that_cannot_start_fails_the_loader_cleanly(tmp_path) -> None:
    """The next epochs used to meet a half-closed pool ('handle is closed', then a hang)."""
    import subprocess
    import sys
    from pathlib import Path

    tests = str(Path(__file__).resolve().parents[1])
    done = subprocess.run(
        [sys.executable, "-c", _REPLACEMENT_FAILS, tests],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    raised, *epochs = done.stdout.splitlines()[-3:]
    assert raised.startswith("raised DataLoader worker 1 (pid ")
    assert "was killed by SIGKILL" in raised
    assert (
        "and its replacement could not start (OSError: [Errno 24] Too many open files). The "
        "workers are stopped; the next iter(loader) starts new ones." in raised
    )
    assert epochs == ["epoch True", "epoch True"]


def test_a_loader_inside_a_worker_says_how_to_nest_it() -> None:
    from engine.engine_datasets import NestedLoader

    with pytest.raises(RuntimeError) as excinfo:
        list(DataLoader(NestedLoader(), batch_size=1, num_workers=1))
    assert str(excinfo.value) == (
        "this DataLoader runs inside a worker process (of another DataLoader, or any daemonic "
        "process), and such a process cannot start processes of its own. Give the inner "
        "DataLoader num_workers=0, or worker_mode='thread'."
    )
    assert "while loading indices [0]" in notes(excinfo.value)
    assert [
        int(b)
        for b in DataLoader(NestedLoader(), batch_size=None, num_workers=1, worker_mode="thread")
    ] == [6, 6]


def _slow_init_that_reports(worker_id: int) -> None:
    time.sleep(2.5)


@pytest.mark.parametrize("mode", MODES)
def test_a_worker_slow_to_start_is_reported_with_its_stack_and_still_waited_for(
    mode: str, monkeypatch, caplog
) -> None:
    # With no timeout a worker that does not start is never silent: after a while the
    # trainer logs where it is, once, and goes on waiting (a slow worker_init_fn is fine).
    from stoker.engine import boot

    monkeypatch.setattr(boot, "STARTUP_REPORT_S", 0.5)
    loader = DataLoader(
        Samples(8),
        batch_size=2,
        num_workers=1,
        worker_mode=mode,
        worker_init_fn=_slow_init_that_reports,
    )
    with caplog.at_level("WARNING", logger="stoker"):
        batches = [b[0].tolist() for b in loader]
    assert batches == [[0, 1], [2, 3], [4, 5], [6, 7]]
    reports = [
        r.getMessage() for r in caplog.records if "has not finished starting" in r.getMessage()
    ]
    assert len(reports) == 1, reports
    text = reports[0]
    who = r"pid \d+" if mode == "process" else r"not started yet|pid \d+"
    assert re.match(rf"DataLoader worker 0 \(({who})\) has not finished starting after \d s", text)
    assert "pass timeout= to make this an error" in text
    assert "_slow_init_that_reports" in text  # the worker's own stack, where it waits
