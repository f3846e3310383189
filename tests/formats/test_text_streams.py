"""TextLines and JsonLines: sharded streaming over ranks and workers, gzip, epochs, bad lines."""

from __future__ import annotations

import collections
import gzip
import json
import logging
import pickle

import pytest

from stoker import DataLoader, DatasetError
from stoker.compact import StringArray
from stoker.formats.text import JsonLines, TextLines


@pytest.fixture(autouse=True)
def no_topology_in_the_environment(monkeypatch) -> None:
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


def write_text(path, lines: list[str]) -> str:
    data = "".join(f"{line}\n" for line in lines)
    if str(path).endswith(".gz"):
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(data)
    else:
        with open(path, "w", encoding="utf-8") as f:
            f.write(data)
    return str(path)


def make_jsonl_corpus(folder, sizes: list[int]) -> list[dict]:
    """One file per size (every other one gzipped); returns every record written."""
    records = []
    for k, n in enumerate(sizes):
        rows = [{"file": k, "line": i} for i in range(n)]
        suffix = ".jsonl.gz" if k % 2 else ".jsonl"
        write_text(folder / f"part-{k:02d}{suffix}", [json.dumps(r) for r in rows])
        records.extend(rows)
    return records


def key(record: dict) -> tuple[int, int]:
    return record["file"], record["line"]


# ------------------------------------------------------------------ exactly once over ranks x
# workers


@pytest.mark.parametrize("worker_mode", ["process", "thread"])
@pytest.mark.parametrize(
    "sizes",
    [[5, 7, 0, 9, 3, 4, 6, 2, 8], [11, 6]],  # more files than readers; fewer files than readers
    ids=["file-level", "record-level"],
)
def test_every_record_once_over_two_ranks_and_two_workers(tmp_path, sizes, worker_mode) -> None:
    everything = make_jsonl_corpus(tmp_path, sizes)
    seen: collections.Counter = collections.Counter()
    per_rank = []
    for rank in range(2):
        ds = JsonLines(str(tmp_path), rank=rank, world_size=2)
        loader = DataLoader(ds, batch_size=None, num_workers=2, worker_mode=worker_mode)
        got = [key(r) for r in loader]
        per_rank.append(len(got))
        seen.update(got)
    assert sorted(seen) == sorted(key(r) for r in everything)
    assert max(seen.values()) == 1, "a record was read by two (rank, worker) readers"
    assert min(per_rank) > 0, "one rank read nothing: the split is not by rank"


def test_batched_loader_over_one_rank_reads_everything_once(tmp_path) -> None:
    paths = [
        write_text(tmp_path / f"{k}.txt", [f"{k}-{i}" for i in range(10 + k)]) for k in range(3)
    ]
    loader = DataLoader(TextLines(paths), batch_size=4, num_workers=2, worker_mode="thread")
    got = [line for batch in loader for line in batch]
    assert sorted(got) == sorted(f"{k}-{i}" for k in range(3) for i in range(10 + k))


def test_one_file_is_split_by_record_between_ranks(tmp_path) -> None:
    path = write_text(tmp_path / "one.txt", [str(i) for i in range(10)])
    rank0 = list(TextLines([path], rank=0, world_size=2))
    rank1 = list(TextLines([path], rank=1, world_size=2))
    assert rank0 == ["0", "2", "4", "6", "8"]
    assert rank1 == ["1", "3", "5", "7", "9"]


def test_torch_dataloader_workers_shard_the_stream(tmp_path) -> None:
    torch = pytest.importorskip("torch", reason="checks sharding under torch's own DataLoader")
    everything = make_jsonl_corpus(tmp_path, [4, 5, 6])
    lines = JsonLines(str(tmp_path))

    class TorchStream(torch.utils.data.IterableDataset):  # torch's loader wants its own base class
        def __iter__(self):
            return iter(lines)

    loader = torch.utils.data.DataLoader(TorchStream(), batch_size=None, num_workers=2)
    got = [key(r) for r in loader]
    assert sorted(got) == sorted(key(r) for r in everything)


# ------------------------------------------------------------------ which files


def test_files_from_a_list_a_pattern_and_a_directory(tmp_path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / ".hidden").mkdir()
    b = write_text(tmp_path / "b.txt", ["b"])
    a = write_text(tmp_path / "sub" / "a.txt", ["a"])
    write_text(tmp_path / ".hidden" / "x.txt", ["hidden"])
    write_text(tmp_path / ".skipme.txt", ["hidden"])
    assert TextLines([b, a]).files == [b, a]  # a list keeps its order
    assert TextLines(str(tmp_path / "**" / "*.txt")).files == sorted([a, b])
    by_dir = TextLines(tmp_path)
    assert by_dir.files == sorted([a, b]), "a directory is read recursively, hidden names skipped"
    assert isinstance(by_dir.files, StringArray)
    assert sorted(by_dir) == ["a", "b"]


def test_json_directory_takes_only_json_lines_files(tmp_path) -> None:
    write_text(tmp_path / "README.md", ["# not data"])
    write_text(tmp_path / "a.ndjson", ['{"v": 1}'])
    write_text(tmp_path / "b.JSONL", ['{"v": 2}'])
    assert sorted(r["v"] for r in JsonLines(tmp_path)) == [1, 2]


def test_missing_and_empty_inputs_are_explained(tmp_path) -> None:
    with pytest.raises(
        FileNotFoundError, match=r"'.*nope\.txt' is neither a file, a directory nor a glob"
    ):
        TextLines(str(tmp_path / "nope.txt"))
    with pytest.raises(ValueError, match=r"the directory '.*' .*matched no files"):
        JsonLines(tmp_path)
    with pytest.raises(ValueError, match=r"the pattern '.*\*\.txt' matched no files"):
        TextLines(str(tmp_path / "*.txt"))
    with pytest.raises(
        FileNotFoundError, match=r"entry 1 of the file list, '.*gone\.txt', is not a file"
    ):
        TextLines([write_text(tmp_path / "ok.txt", ["x"]), str(tmp_path / "gone.txt")])
    with pytest.raises(TypeError, match=r"entry 0 of the file list is a int \(3\)"):
        TextLines([3])
    with pytest.raises(
        ValueError, match=r"on_error must be one of \('raise', 'skip'\), got 'ignore'"
    ):
        TextLines(str(tmp_path / "ok.txt"), on_error="ignore")


# ------------------------------------------------------------------ lines


def test_strip_and_skip_empty(tmp_path) -> None:
    path = write_text(tmp_path / "a.txt", ["  one  ", "", "two\t", "   "])
    assert list(TextLines([path])) == ["one", "", "two", ""]
    assert list(TextLines([path], strip=False)) == ["  one  ", "", "two\t", "   "]
    assert list(TextLines([path], skip_empty=True)) == ["one", "two"]
    assert list(TextLines([path], strip=False, skip_empty=True)) == ["  one  ", "two\t", "   "]


def test_windows_line_endings_and_gzip(tmp_path) -> None:
    crlf = tmp_path / "crlf.txt"
    crlf.write_bytes(b"a\r\nb\r\n")
    gz = write_text(tmp_path / "z.txt.gz", ["zipped", "lines"])
    assert list(TextLines([str(crlf)], strip=False)) == ["a", "b"]
    assert list(TextLines([gz])) == ["zipped", "lines"]


def test_transform_and_encoding(tmp_path) -> None:
    path = tmp_path / "latin.txt"
    path.write_bytes("café\nnaïve\n".encode("latin-1"))
    assert list(TextLines([str(path)], encoding="latin-1", transform=str.upper)) == [
        "CAFÉ",
        "NAÏVE",
    ]
    with pytest.raises(DatasetError) as caught:
        list(TextLines([str(path)]))
    assert str(caught.value) == (
        f"{path}, line 1: not valid 'utf-8' text: cannot decode the byte(s) b'\\xe9'. "
        "Fix the line, or pass on_error='skip' to skip bad lines."
    )


def test_pickles_with_its_files(tmp_path) -> None:
    path = write_text(tmp_path / "a.txt", ["x", "y"])
    ds = pickle.loads(pickle.dumps(TextLines([path], skip_empty=True, shuffle_files=True, seed=3)))
    assert ds.files == [path] and ds.skip_empty and ds.seed == 3
    assert list(ds) == ["x", "y"]


# ------------------------------------------------------------------ epochs


def test_shuffle_files_changes_the_order_per_epoch_reproducibly(tmp_path) -> None:
    paths = [write_text(tmp_path / f"{k:02d}.txt", [str(k)]) for k in range(12)]
    ds = TextLines(paths, shuffle_files=True, seed=7)
    orders = []
    for epoch in (0, 1, 0):
        ds.set_epoch(epoch)
        orders.append(list(ds))
    assert orders[0] == orders[2], "the same epoch must give the same order"
    assert orders[0] != orders[1], "a new epoch must give a new order"
    assert sorted(orders[1]) == sorted(str(k) for k in range(12))
    assert ds.file_order(1) == [paths[int(x)] for x in orders[1]]
    assert list(TextLines(paths)) == [str(k) for k in range(12)], "no shuffle: the given order"
    assert list(TextLines(paths, shuffle_files=True, seed=8)) != orders[0], "the seed matters"
    with pytest.raises(ValueError, match=r"epoch must be a non-negative integer, got -1"):
        ds.set_epoch(-1)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_loader_sets_the_epoch(tmp_path, num_workers) -> None:
    paths = [write_text(tmp_path / f"{k:02d}.txt", [str(k)]) for k in range(8)]
    ds = TextLines(paths, shuffle_files=True, seed=1)
    loader = DataLoader(ds, batch_size=None, num_workers=num_workers, worker_mode="thread")
    epoch0, epoch1 = list(loader), list(loader)
    assert sorted(epoch0) == sorted(epoch1) == sorted(str(k) for k in range(8))
    assert epoch0 != epoch1
    ds.set_epoch(1)
    if num_workers == 0:
        assert epoch1 == list(ds), "epoch 1 through the loader is the dataset's epoch 1"


def test_every_rank_shuffles_the_files_the_same_way(tmp_path) -> None:
    paths = [write_text(tmp_path / f"{k:02d}.txt", [str(k)]) for k in range(9)]
    for epoch in range(3):
        got = []
        for rank in range(3):
            ds = TextLines(paths, shuffle_files=True, seed=5, rank=rank, world_size=3)
            ds.set_epoch(epoch)
            got += list(ds)
        assert sorted(got) == sorted(str(k) for k in range(9)), f"epoch {epoch}"


# ------------------------------------------------------------------ bad lines and files


def test_bad_json_line_names_the_file_and_line(tmp_path) -> None:
    path = write_text(tmp_path / "data.jsonl", ['{"a": 1}', "", '{"a": 2', '{"a": 3}'])
    with pytest.raises(
        DatasetError, match=r"data\.jsonl, line 3: invalid JSON \(Expecting ',' delimiter"
    ) as info:
        list(JsonLines([path]))
    assert "on_error='skip'" in str(info.value)


def test_bad_json_lines_are_skipped_and_counted(tmp_path, caplog) -> None:
    path = write_text(tmp_path / "data.jsonl", ['{"a": 1}', "oops", '{"a": 3}', "[1,"])
    ds = JsonLines([path], on_error="skip")
    with caplog.at_level(logging.WARNING, logger="stoker"):
        assert [r["a"] for r in ds] == [1, 3]
    assert ds.skipped == 2
    assert "data.jsonl, line 2" in caplog.text and "line 4" in caplog.text


def test_a_failing_transform_names_the_line(tmp_path) -> None:
    path = write_text(tmp_path / "data.jsonl", ['{"a": 1}', '{"b": 2}'])
    with pytest.raises(KeyError) as info:
        list(JsonLines([path], transform=lambda r: r["a"]))
    assert any(
        "data.jsonl, line 2" in note
        for note in getattr(info.value, "__notes__", ["data.jsonl, line 2"])
    )
    skipping = JsonLines([path], transform=lambda r: r["a"], on_error="skip")
    assert list(skipping) == [1] and skipping.skipped == 1


def test_truncated_gzip_raises_naming_the_file_or_is_skipped(tmp_path) -> None:
    good = write_text(tmp_path / "a.jsonl", ['{"v": 0}'])
    whole = gzip.compress("".join(f'{{"v": {i}}}\n' for i in range(1, 2000)).encode())
    broken = tmp_path / "b.jsonl.gz"
    broken.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(
        DatasetError,
        match=r"cannot read '.*b\.jsonl\.gz' after line \d+: EOFError.*truncated or corrupt",
    ):
        list(JsonLines([good, str(broken)]))
    ds = JsonLines([good, str(broken)], on_error="skip")
    values = [r["v"] for r in ds]
    assert values[0] == 0 and 1 < len(values) < 2000, "records before the damage are kept"
    assert values == list(range(len(values)))
    assert ds.skipped == 1


def test_repr_names_the_files(tmp_path) -> None:
    paths = [write_text(tmp_path / f"{k}.txt", ["x"]) for k in range(3)]
    text = repr(TextLines(paths))
    assert text.startswith("TextLines(3 files: [") and "0.txt" in text and text.endswith(", ...])")
    assert repr(JsonLines([write_text(tmp_path / "0.jsonl", ["1"])])).startswith(
        "JsonLines(1 file: ['"
    )
