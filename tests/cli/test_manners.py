"""Every ``stoker`` command behaves alike, run as a real process: exit statuses, help, Ctrl-C,
a closed pipe, progress in a log, and no files in the current folder unless asked.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import stoker
from harness import leaks
from harness.children import fault_env, finish, with_default_signals

SRC = str(Path(stoker.__file__).resolve().parents[1])  # the stoker under test, for the children
COMMANDS = ("demo", "pack", "doctor", "bench")

DATASETS = textwrap.dedent(
    """
    import os
    import time

    import numpy as np
    from stoker import ArrayDataset

    rng = np.random.default_rng(0)
    dataset = ArrayDataset(rng.standard_normal((64, 3, 8, 8)).astype(np.float32), np.arange(64) % 4)


    class Slow:
        def __len__(self):
            return 10_000

        def __getitem__(self, i):
            time.sleep(0.01)
            return np.zeros(4, dtype=np.float32), i % 2


    slow = Slow()


    class Marked(Slow):  # Slow, and creates $STOKER_TEST_STARTED as it reads its first sample

        def __getitem__(self, i):
            started = os.environ.get("STOKER_TEST_STARTED")
            if started and not os.path.exists(started):
                open(started, "w").close()
            return super().__getitem__(i)


    marked = Marked()
    """
)


def _env() -> dict[str, str]:
    env = fault_env()  # a command that does not exit in time is shown with its stacks
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [SRC, env.get("PYTHONPATH")]))
    env.pop("COLUMNS", None)
    return env


def stoker_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "stoker", *args]


def run(
    *args: str, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        stoker_cmd(*args),
        capture_output=True,
        text=True,
        env=_env(),
        cwd=cwd,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture
def datasets(tmp_path: Path) -> str:
    """``path/to/datasets.py``: a file target, outside the folder the commands run in."""
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "datasets.py").write_text(DATASETS)
    return str(folder / "datasets.py")


def test_no_command_prints_the_help_and_exits_0() -> None:
    result = run()
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout.startswith("usage: stoker") and "doctor" in result.stdout


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_help_exits_0_and_renders_percent_signs(command: str) -> None:
    result = run(*filter(None, [command]), "--help")
    assert result.returncode == 0 and result.stderr == ""
    assert "%%" not in result.stdout and "%(" not in result.stdout
    if command == "bench":
        assert "within 5% of the best rate" in " ".join(result.stdout.split())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nosuch"], "invalid choice: 'nosuch'"),
        (["doctor"], "the following arguments are required: TARGET"),
        (["bench"], "the following arguments are required: TARGET"),
        (["pack", "src"], "the following arguments are required: DST"),
        (["demo", "--nope"], "unrecognized arguments: --nope"),
        (["doctor", "x", "--nope"], "unrecognized arguments: --nope"),
    ],
)
def test_a_missing_argument_or_unknown_option_is_exit_2(args: list[str], message: str) -> None:
    result = run(*args)
    assert result.returncode == 2, result.stderr
    assert result.stdout == "" and message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["doctor", "{missing}"], "stoker doctor: TARGET '{missing}' is neither a directory"),
        (["bench", "{missing}"], "stoker bench: TARGET '{missing}' is neither a directory"),
        (["pack", "{missing}", "{tmp}/out"], "stoker pack: error: SRC '{missing}' does not exist"),
        (["doctor", "no_such_module_xyz:data"], "cannot import the module 'no_such_module_xyz'"),
        (["bench", "no_such_module_xyz:data"], "cannot import the module 'no_such_module_xyz'"),
    ],
)
def test_a_missing_target_is_exit_2_in_every_command(
    args: list[str], message: str, tmp_path: Path
) -> None:
    fill = {"missing": str(tmp_path / "missing"), "tmp": str(tmp_path)}
    result = run(*(a.format(**fill) for a in args), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert message.format(**fill) in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["doctor", "T", "--batch-size", "0"], "argument --batch-size: must be 1 or more, got 0"),
        (["doctor", "T", "--size", "-5"], "argument --size: must be 0 or more, got -5"),
        (
            ["doctor", "T", "--num-workers", "-1"],
            "argument --num-workers: must be 0 or more, got -1",
        ),
        (
            ["doctor", "T", "--stats-samples", "x"],
            "argument --stats-samples: expected an integer, got 'x'",
        ),
        (["bench", "T", "--size", "-5"], "argument --size: must be 1 or more, got -5"),
        (["bench", "T", "--batches", "0"], "argument --batches: must be 1 or more, got 0"),
        (["bench", "T", "--workers", "2,-1"], "argument --workers: each value must be 0 or more"),
        (["pack", "S", "D", "--workers", "0"], "argument --workers: must be 1 or more, got 0"),
        (
            ["pack", "S", "D", "--shard-size", "-5"],
            "argument --shard-size: a size needs a positive",
        ),
        (["demo", "--step-ms", "-1"], "argument --step-ms: must be a finite number of 0 or more"),
        (["demo", "--step-ms", "inf"], "argument --step-ms: must be a finite number of 0 or more"),
        (["demo", "--step-ms", "nan"], "argument --step-ms: must be a finite number of 0 or more"),
        (["demo", "--step-ms", "x"], "argument --step-ms: expected a number, got 'x'"),
    ],
)
def test_a_bad_value_is_exit_2_before_anything_runs(
    args: list[str], message: str, tmp_path: Path
) -> None:
    result = run(*args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"usage: stoker {args[0]} ")  # argparse's, before any work
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_prints_one_line_exits_130_and_stops_the_workers(
    datasets: str, tmp_path: Path
) -> None:
    # a session of its own: Ctrl-C in a terminal signals the whole process group
    proc = subprocess.Popen(
        with_default_signals(  # Ctrl-C as from a shell
            stoker_cmd("bench", f"{datasets}:slow", "--workers", "2", "--batches", "100000")
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=_env(),
        cwd=tmp_path,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        workers: list[leaks.Proc] = []
        while len(workers) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
            workers = leaks.descendants(proc.pid)
        assert len(workers) >= 2, "the workers never started"
        time.sleep(0.5)  # batches are flowing
        os.killpg(proc.pid, signal.SIGINT)
        _, err = finish(proc, 60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.splitlines()[-1] == "stoker: interrupted"
    assert err.count("stoker: interrupted") == 1
    assert leaks.wait_gone(workers) == []


def _image_folder(root: Path, corrupt: bool = False) -> Path:
    """``root/cat/*.png``, ``root/dog/*.png``: tiny real images (and a truncated one)."""
    Image = pytest.importorskip("PIL.Image", reason="the folder holds real images")
    for name in ("cat/0.png", "cat/1.png", "dog/2.png", "dog/3.png"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8, 6), (40, 90, 200)).save(root / name)
    if corrupt:
        (root / "dog" / "4.png").write_bytes((root / "dog" / "3.png").read_bytes()[:40])
    return root


def _with_closed_stdout(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Runs stoker with the reader gone before the first line: `stoker ... | head -0`."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            stoker_cmd(*args),
            stdout=write,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env=_env(),
            cwd=cwd,
            timeout=120,
        )
    finally:
        os.close(write)


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["doctor", "{datasets}:dataset"],
        ["bench", "{datasets}:dataset", "--workers", "0", "--batches", "2", "--batch-size", "4"],
        ["demo", "--quick", "--no-torch", "--cache", "{tmp}/cache"],
    ],
    ids=lambda args: args[0],
)
def test_a_closed_pipe_ends_quietly_with_141(
    args: list[str], datasets: str, tmp_path: Path
) -> None:
    fill = {"datasets": datasets, "tmp": str(tmp_path)}
    result = _with_closed_stdout([a.format(**fill) for a in args], tmp_path)
    assert result.returncode == 141, result.stderr
    assert result.stderr == ""


def test_a_closed_pipe_ends_pack_quietly_with_141_and_keeps_the_pack(tmp_path: Path) -> None:
    from stoker.formats.packed import PackedDataset

    src = _image_folder(tmp_path / "images", corrupt=True)
    dst = tmp_path / "packed"
    result = _with_closed_stdout(["pack", str(src), str(dst), "--workers", "2"], tmp_path)
    assert result.returncode == 141, result.stderr
    # stderr keeps the progress lines (their reader is still there), and only those
    assert result.stderr.splitlines() == ["stoker pack: 5/5 files (100%), 1 skipped"]
    packed = PackedDataset(str(dst), verify="open")
    assert len(packed) == 4 and packed.classes == ["cat", "dog"]
    assert (dst / "skipped.txt").read_text().startswith("dog/4.png\tcorrupt image: ")


def test_progress_in_a_log_is_a_few_plain_lines(datasets: str, tmp_path: Path) -> None:
    result = run("bench", f"{datasets}:dataset", "--workers", "0,1", "--batches", "20",
                 "--batch-size", "4", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "\r" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 4, result.stderr  # a line as each setting starts and ends
    assert lines[0] == "  [1/2] workers=0: 25 batches ..."


def test_bench_writes_nothing_in_the_current_folder_unless_asked(
    datasets: str, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    args = ("bench", f"{datasets}:dataset", "--workers", "0", "--batches", "3", "--batch-size", "8")
    result = run(*args, cwd=work)
    assert result.returncode == 0, result.stderr
    assert list(work.iterdir()) == []
    assert "plot:" not in result.stdout
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib (the cli extra)")
    result = run(*args, "--plot", "sweep.png", cwd=work)
    assert result.returncode == 0, result.stderr
    assert [p.name for p in work.iterdir()] == ["sweep.png"]
    assert f"plot: {work / 'sweep.png'}" in result.stdout


def _interrupt(
    args: list[str], cwd: Path, started: Path, fifo: Path | None = None
) -> tuple[int, str]:
    """Runs stoker, sends Ctrl-C (SIGINT to its process group, as a terminal does) once
    ``started`` exists; returns the exit status and stderr. A reader blocked on ``fifo``
    is then given end-of-file, as a stuck read would end."""
    env = _env()
    env["STOKER_TEST_STARTED"] = str(started)
    proc = subprocess.Popen(
        with_default_signals(stoker_cmd(*args)),  # Ctrl-C as from a shell
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not started.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert started.exists(), "the command never started its work"
        time.sleep(0.3)
        os.killpg(proc.pid, signal.SIGINT)
        if fifo is not None:
            time.sleep(0.3)
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # the blocked open returns
        _, err = finish(proc, 60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, err


def test_ctrl_c_in_pack_exits_130_and_leaves_no_destination_behind(tmp_path: Path) -> None:
    src = _image_folder(tmp_path / "images")
    fifo = src / "dog" / "9.png"
    os.mkfifo(fifo)  # reading it blocks: the pack is under way when Ctrl-C comes
    listing = tmp_path / "files.txt"
    listing.write_text("cat/0.png\tcat\ncat/1.png\tcat\ndog/9.png\tdog\ndog/2.png\tdog\n")
    dst = tmp_path / "out" / "packed"
    args = ["pack", str(src), str(dst), "--files", str(listing), "--workers", "1"]
    status, err = _interrupt(args, tmp_path, started=dst, fifo=fifo)
    assert status == 130, err
    assert err.splitlines() == ["stoker: interrupted"]
    assert not dst.exists()  # the folder pack created, half written, is gone
    assert (tmp_path / "out").is_dir()  # what was there before stays


def test_ctrl_c_in_doctor_exits_130_with_one_line(datasets: str, tmp_path: Path) -> None:
    started = tmp_path / "started"
    status, err = _interrupt(["doctor", f"{datasets}:marked"], tmp_path, started)
    assert status == 130, err
    assert err.splitlines() == ["stoker: interrupted"]


def test_pack_progress_in_a_log_is_a_few_plain_lines(tmp_path: Path) -> None:
    pytest.importorskip("tqdm", reason="with tqdm installed, a log still gets plain lines")
    src = _image_folder(tmp_path / "images")
    result = run("pack", str(src), str(tmp_path / "packed"), "--workers", "2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "\r" not in result.stderr and "\r" not in result.stdout
    assert result.stderr.splitlines() == ["stoker pack: 4/4 files (100%), 0 skipped"]


def test_demo_progress_in_a_log_is_a_few_plain_lines(tmp_path: Path) -> None:
    pytest.importorskip("tqdm", reason="with tqdm installed, a log still gets plain lines")
    pytest.importorskip("PIL", reason="the demo writes JPEG files")
    result = run("demo", "--quick", "--no-torch", "--cache", str(tmp_path / "cache"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "\r" not in result.stderr and "\r" not in result.stdout
    assert result.stderr == ""
    stages = [line for line in result.stdout.splitlines() if line.startswith("  stage ")]
    assert [line.split()[:3] for line in stages] == [
        ["stage", str(n), "stoker"] for n in (1, 2, 3, 4)
    ]
