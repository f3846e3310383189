"""Text and JSON-lines files as iterable datasets, sharded over ranks and workers.

:class:`TextLines` yields the lines of a set of text files, :class:`JsonLines` the parsed
records of JSON-lines files (one JSON value per line). Both split their files over
``(rank, worker)`` with :mod:`stoker.sharding`: whole files while there are at least as
many files as readers, every ``k``-th record of a shared file when there are fewer. So
every record is read exactly once per epoch, whatever the numbers of ranks and workers.

Files come as a list, a glob pattern (``"data/*.jsonl.gz"``, ``**`` allowed) or a
directory (read recursively, each folder once whatever its links, hidden names skipped). Patterns
and directories are sorted,
so every rank sees the same list; a list is kept in the order given. URLs (``s3://``,
``gs://``, ``http(s)://``, ...: an object, a prefix or a pattern) are listed the same way and
downloaded through :mod:`stoker.storage` (``pip install 'stoker[storage]'``). Paths are held in a
:class:`~stoker.compact.StringArray`, so forked workers never copy them. Files ending in
``.gz`` are decompressed on the fly; their checksum is checked when they end, or before
their first record with ``verify="open"``. A line that is not valid text in the encoding
costs that line only: it is reported with its file and line number (or skipped and
counted with ``on_error="skip"``), and the lines around it are read as usual.

With ``shuffle_files=True`` the file order is shuffled per epoch from ``(seed, epoch)``;
:class:`stoker.DataLoader` calls :meth:`~TextLines.set_epoch` itself at every epoch, a
hand-written loop calls it like ``DistributedSampler.set_epoch``.

Example:
    >>> import os, tempfile
    >>> from stoker import DataLoader
    >>> folder = tempfile.mkdtemp()
    >>> with open(os.path.join(folder, "a.jsonl"), "w") as f:
    ...     _ = f.write('{"x": 1}\\n{"x": 2}\\n')
    >>> [r["x"] for r in DataLoader(JsonLines(folder), batch_size=None)]
    [1, 2]
"""

from __future__ import annotations

import codecs
import json
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from stoker._errors import DatasetError
from stoker._printable import printable
from stoker._skipped import SKIPPED
from stoker._validate import check_choice, check_int
from stoker.compact import StringArray
from stoker.datasets import IterableDataset
from stoker.formats._compressed import (
    GZIP_DAMAGE,
    GZIP_ERRORS,
    check_gzip,
    is_gzip_name,
    open_gzip,
)
from stoker.formats._walk import glob_files, walk_files
from stoker.seeding import epoch_rng
from stoker.storage.fetch import RemoteReadError
from stoker.storage.remote import Storage, is_remote, list_remote, open_files
from stoker.streams._records import RecordStream

__all__ = ["JsonLines", "TextLines"]

logger = logging.getLogger("stoker")

_ON_ERROR = ("raise", "skip")
_VERIFY = (False, "open")
_GLOB_CHARS = frozenset("*?[")
_JSON_SUFFIXES = (".jsonl", ".ndjson", ".json", ".jsonl.gz", ".ndjson.gz", ".json.gz")
_READ_ERRORS = (*GZIP_ERRORS, UnicodeDecodeError)
# Bytes that are not valid text in the file's encoding are decoded as lone surrogates
# U+DC00 + byte (like "surrogateescape", for every byte value), which no strict decoder
# produces; so one bad byte spoils only its own line, and that line is found and reported.
_UNDECODABLE_ERRORS = "stoker.undecodable"
_UNDECODABLE = re.compile("[\udc00-\udcff]+")


def _mark_undecodable(exc: UnicodeError) -> tuple[str, int]:
    if not isinstance(exc, UnicodeDecodeError):
        raise exc
    return "".join(chr(0xDC00 + b) for b in exc.object[exc.start : exc.end]), exc.end


codecs.register_error(_UNDECODABLE_ERRORS, _mark_undecodable)


class UndecodableText(ValueError):
    """A line holds bytes that are not valid text in the file's encoding."""

    def __init__(self, text: str, encoding: str) -> None:
        marked = _UNDECODABLE.findall(text)
        raw = bytes(ord(c) - 0xDC00 for c in "".join(marked))
        shown = raw[:16] + (b"..." if len(raw) > 16 else b"")
        super().__init__(f"not valid {encoding!r} text: cannot decode the byte(s) {shown!r}")


FileSpec = str | os.PathLike[str] | Iterable[str | os.PathLike[str]]


def _resolve_files(
    files: Any,
    *,
    owner: str,
    suffixes: tuple[str, ...] | None = None,
    must_exist: Callable[[str], bool] | None = None,
    storage: Storage | None = None,
) -> StringArray:
    """The list of files that ``files`` (a list, a glob pattern or a directory) names.

    Patterns and directories are sorted (the same list on every rank); a list keeps its
    order. ``suffixes`` filters a directory's files (case-insensitive). ``must_exist``
    decides which list entries are checked on disk (default: all of them).
    """
    if isinstance(files, bytes):
        msg = f"{owner} takes paths as str or os.PathLike, got bytes {files!r}; decode it first"
        raise TypeError(msg)
    remote = list_remote(files, owner=owner, suffixes=suffixes, storage=storage)
    if remote is not None:  # a URL: one object, a prefix or a pattern, listed and sorted
        files = remote
    if isinstance(files, (str, os.PathLike)):
        spec = os.fspath(files)
        if os.path.isdir(spec):
            found = _walk(spec, suffixes)
            where = f"the directory {spec!r}"
            if suffixes:
                where += f" (files ending in {', '.join(suffixes)})"
        elif _GLOB_CHARS & set(spec):
            found = glob_files(spec)
            where = f"the pattern {spec!r}"
        elif (must_exist is not None and not must_exist(spec)) or os.path.isfile(spec):
            found, where = [spec], spec  # a URL, or one file
        else:
            msg = (
                f"{owner}: {spec!r} is neither a file, a directory nor a glob pattern "
                "(no such file). Pass existing paths, a directory or a pattern like 'data/*.txt'."
            )
            raise FileNotFoundError(msg)
    else:
        try:
            entries = list(files)
        except TypeError:
            msg = (
                f"{owner} takes a list of paths, a glob pattern or a directory, "
                f"got {type(files).__name__}: {files!r}"
            )
            raise TypeError(msg) from None
        found = []
        for position, entry in enumerate(entries):
            if not isinstance(entry, (str, os.PathLike)):
                msg = (
                    f"{owner}: entry {position} of the file list is a {type(entry).__name__} "
                    f"({entry!r}); every entry must be a path (str or os.PathLike)"
                )
                raise TypeError(msg)
            path = os.fspath(entry)
            check = (must_exist is None or must_exist(path)) and not is_remote(path)
            if check and not os.path.isfile(path):
                msg = f"{owner}: entry {position} of the file list, {path!r}, is not a file"
                raise FileNotFoundError(msg)
            found.append(path)
        where = "the file list"
    if not found:
        msg = f"{owner}: {where} matched no files; check the path, or pass the files as a list"
        raise ValueError(msg)
    return StringArray(found)


def _walk(root: str, suffixes: tuple[str, ...] | None) -> list[str]:
    """The files under ``root``, sorted, each directory walked once (see ``_walk.walk_files``)."""

    def keep(name: str) -> bool:
        return not suffixes or name.lower().endswith(suffixes)

    return sorted(found.path for found in walk_files(root, keep=keep))


def _check_verify(verify: Any) -> bool | str:
    """``verify`` of the streaming readers: False or ``"open"`` (True means ``"open"``)."""
    verify = "open" if verify is True else verify
    if verify not in _VERIFY:
        msg = f"verify must be False or 'open', got {verify!r}"
        raise ValueError(msg)
    return verify


def _file_order(count: int, shuffle: bool, seed: int, epoch: int) -> list[int]:
    """The file indices in the order epoch ``epoch`` reads them (the same on every rank)."""
    if not shuffle:
        return list(range(count))
    return epoch_rng(seed, epoch).permutation(count).tolist()


def _note(exc: BaseException, text: str) -> None:
    add_note = getattr(exc, "add_note", None)  # Python >= 3.11
    if add_note is not None:
        add_note(text)


class _LineFiles(RecordStream, IterableDataset[Any]):
    """What TextLines and JsonLines share: files, sharding, epochs, bad-record policy."""

    _suffixes: tuple[str, ...] | None = None
    _skip_marker = SKIPPED

    def __init__(
        self,
        files: FileSpec,
        *,
        encoding: str,
        transform: Callable[[Any], Any] | None,
        on_error: str,
        verify: bool | str,
        shuffle_files: bool,
        seed: int,
        rank: int | None,
        world_size: int | None,
        shuffle_buffer: int | None = None,
        storage: Storage | None = None,
    ) -> None:
        owner = type(self).__name__
        if transform is not None and not callable(transform):
            msg = f"transform must be callable (it receives one record) or None, got {transform!r}"
            raise TypeError(msg)
        if not isinstance(encoding, str):
            msg = f"encoding must be a codec name such as 'utf-8', got {encoding!r}"
            raise TypeError(msg)
        self.storage = storage or Storage()
        self.files = _resolve_files(
            files, owner=owner, suffixes=self._suffixes, storage=self.storage
        )
        self.encoding = encoding
        self.transform = transform
        self.on_error = check_choice("on_error", on_error, _ON_ERROR)
        self.verify = _check_verify(verify)
        self.shuffle_files = bool(shuffle_files)
        self.seed = check_int("seed", seed)
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self.skipped = 0
        self._init_stream(shuffle_buffer)

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch whose file order the next iteration uses (with ``shuffle_files``)."""
        self.epoch = check_int("epoch", epoch)

    def file_order(self, epoch: int | None = None) -> list[str]:
        """The files in the order epoch ``epoch`` (default: the current one) reads them."""
        epoch = self.epoch if epoch is None else epoch
        return [
            self.files[i]
            for i in _file_order(len(self.files), self.shuffle_files, self.seed, epoch)
        ]

    # record positions, state_dict and shuffle_buffer: stoker.streams._records.RecordStream
    def _record_order(self) -> list[int]:
        return _file_order(len(self.files), self.shuffle_files, self.seed, self.epoch)

    def _opened_files(self, order: list[int], first: int = 0) -> Any:
        return open_files(
            self.files, order, self.storage, rank=self.rank, world_size=self.world_size, first=first
        )

    def _open_records(self, file_index: int, local: Any = None) -> Iterator[tuple[int, int, str]]:
        return self._read_file(file_index, local=local)

    def _finish_record(self, raw: tuple[int, int, str]) -> Any:
        return self._record(*raw)

    # -- reading -------------------------------------------------------------------
    def _lines(self, stream: Any) -> Iterator[tuple[int, str]]:
        """``(line number, text)`` of an open file's lines that are records, before sharding."""
        raise NotImplementedError

    def _read_file(
        self, file_index: int, local: Callable[[int], str] | None = None
    ) -> Iterator[tuple[int, int, str]]:
        path = self.files[file_index]
        compressed = is_gzip_name(path)
        line_number = 0
        try:
            source = path if local is None or not is_remote(path) else local(file_index)
            if compressed and self.verify == "open":
                check_gzip(source)
            opener = open_gzip if compressed else open
            with opener(source, "rt", encoding=self.encoding, errors=_UNDECODABLE_ERRORS) as stream:
                for line_number, text in self._lines(stream):  # reported on error
                    yield file_index, line_number, text
        except _READ_ERRORS as exc:
            where = f"after line {line_number}" if line_number else "before its first line"
            damaged = isinstance(exc, GZIP_DAMAGE)
            damage = "The file is truncated or corrupt" if damaged else "The file cannot be read"
            if damaged and line_number and compressed and self.verify != "open":
                damage += (
                    ", and the lines read from it may be damaged too (pass verify='open' to "
                    "check each compressed file in full before reading it)"
                )
            advice = (
                f"{damage}. Fix or remove it, or pass on_error='skip' to skip what is left of it."
            )
            if isinstance(exc, RemoteReadError) and exc.network:  # its message says the network
                advice = "Pass on_error='skip' to skip the files that cannot be downloaded."
            text = str(exc).rstrip().rstrip(".")
            msg = (
                f"{type(self).__name__} cannot read {path!r} {where}: {type(exc).__name__}: "
                f"{text}. {advice}"
            )
            if self.on_error == "raise":
                raise DatasetError(msg) from exc
            self.skipped += 1
            logger.warning("skipped the rest of a file: %s", msg)

    def _parse(self, text: str) -> Any:
        return text

    def _record(self, file_index: int, line_number: int, text: str) -> Any:
        try:
            if not text.isascii() and _UNDECODABLE.search(text):
                raise UndecodableText(text, self.encoding)
            value = self._parse(text)
            return value if self.transform is None else self.transform(value)
        except Exception as exc:
            path = self.files[file_index]
            if self.on_error == "skip":
                self.skipped += 1
                logger.warning(
                    "skipped a bad record at %s, line %d: %s: %s",
                    printable(path),
                    line_number,
                    type(exc).__name__,
                    exc,
                )
                return SKIPPED
            if isinstance(exc, json.JSONDecodeError):
                snippet = text if len(text) <= 80 else text[:77] + "..."
                msg = (
                    f"{printable(path)}, line {line_number}: invalid JSON ({exc.msg} at column "
                    f"{exc.colno}): {snippet!r}. Fix the line, or pass on_error='skip' to skip bad "
                    "lines."
                )
                raise DatasetError(msg) from exc
            if isinstance(exc, UndecodableText):
                msg = (
                    f"{printable(path)}, line {line_number}: {exc}. Fix the line, or pass "
                    "on_error='skip' to skip bad lines."
                )
                raise DatasetError(msg) from None
            _note(exc, f"while reading {printable(path)}, line {line_number}")
            raise

    def __repr__(self) -> str:
        head = ", ".join(repr(self.files[i]) for i in range(min(2, len(self.files))))
        more = ", ..." if len(self.files) > 2 else ""
        noun = "file" if len(self.files) == 1 else "files"
        return f"{type(self).__name__}({len(self.files)} {noun}: [{head}{more}])"


class TextLines(_LineFiles):
    """The lines of text files, split over ranks and workers.

    Args:
        files: a list of paths, a glob pattern or a directory (see the module docs);
            ``.gz`` files are decompressed.
        encoding: the files' text encoding.
        strip: strip whitespace from both ends of each line; with ``False`` only the
            line ending is removed.
        skip_empty: leave out lines that are empty (after stripping).
        transform: called on each line (a ``str``); its result is the sample.
        on_error: ``"raise"`` (default) or ``"skip"``: a line that is not valid text in
            ``encoding``, a line whose transform raises, or the rest of a file that cannot
            be read is logged on the ``stoker`` logger with its file and line number,
            counted in :attr:`skipped` and left out (a bad line costs that line only).
        verify: ``False`` (default) or ``"open"``. A gzipped file's checksum (its CRC-32
            and length) is checked when the file ends, so damage is reported after the
            file's lines were delivered; with ``"open"`` each gzipped file is read in
            full and checked before its first line is delivered (it is decompressed
            twice). Plain text files carry no checksum.
        shuffle_files: shuffle the file order every epoch (see :meth:`set_epoch`).
        seed: seeds that shuffle.
        rank, world_size: fix the distributed topology instead of finding it when
            iteration starts (``torch.distributed``, then ``RANK`` / ``WORLD_SIZE``).
        shuffle_buffer: shuffle the records through a buffer of this many (see
            :mod:`stoker.streams`): seeded from the loader's epoch seed (from ``seed``
            outside a loader), resumable with :meth:`state_dict`.
        storage_options, cache, prefetch, retries: for URLs (``s3://``, ``gs://``,
            ``http(s)://``, ...; see :class:`stoker.storage.Storage` and
            docs/object-storage.md): the fsspec options, the local cache folder or
            :class:`~stoker.storage.ShardCache`, files downloaded ahead, attempts per file.

    Attributes:
        files: the paths, as a :class:`~stoker.compact.StringArray`.
        skipped: bad files and lines skipped so far by this object (each worker
            process counts its own).

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "a.txt")
        >>> with open(path, "w") as f:
        ...     _ = f.write(" hello \\n\\nworld\\n")
        >>> list(TextLines([path], skip_empty=True))
        ['hello', 'world']
    """

    def __init__(
        self,
        files: FileSpec,
        *,
        encoding: str = "utf-8",
        strip: bool = True,
        skip_empty: bool = False,
        transform: Callable[[str], Any] | None = None,
        on_error: str = "raise",
        verify: bool | str = False,
        shuffle_files: bool = False,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        shuffle_buffer: int | None = None,
        storage_options: dict[str, Any] | None = None,
        cache: Any = None,
        prefetch: int = 2,
        retries: Any = 5,
    ) -> None:
        super().__init__(
            files,
            encoding=encoding,
            transform=transform,
            on_error=on_error,
            verify=verify,
            shuffle_files=shuffle_files,
            seed=seed,
            rank=rank,
            world_size=world_size,
            shuffle_buffer=shuffle_buffer,
            storage=Storage(storage_options, cache, prefetch, retries),
        )
        self.strip = bool(strip)
        self.skip_empty = bool(skip_empty)

    def _lines(self, stream: Any) -> Iterator[tuple[int, str]]:
        strip, skip_empty = self.strip, self.skip_empty
        for number, line in enumerate(stream, start=1):
            text = line.strip() if strip else (line[:-1] if line.endswith("\n") else line)
            if skip_empty and not text:
                continue
            yield number, text


class JsonLines(_LineFiles):
    """The records of JSON-lines files (one JSON value per line), split over ranks and workers.

    Blank lines are left out. A line that is not valid JSON raises
    :class:`~stoker.DatasetError` naming the file and the line number, or with
    ``on_error="skip"`` is logged, counted in :attr:`skipped` and left out.

    Args:
        files: a list of paths, a glob pattern or a directory (a directory contributes
            its ``.jsonl``, ``.ndjson`` and ``.json`` files, gzipped or not).
        transform: called on each parsed record; its result is the sample.
        on_error: ``"raise"`` (default) or ``"skip"`` bad lines (not JSON, or not valid
            text in ``encoding``), records whose transform raises and the rest of files
            that cannot be read; each skip is logged with its file and line number.
        verify: ``False`` (default) or ``"open"``: check each gzipped file in full before
            its first record is delivered (see :class:`TextLines`).
        encoding: the files' text encoding.
        shuffle_files: shuffle the file order every epoch (see :meth:`set_epoch`).
        seed: seeds that shuffle.
        rank, world_size: fix the distributed topology (see :class:`TextLines`).
        shuffle_buffer: shuffle the records through a buffer of this many (see
            :mod:`stoker.streams`): seeded from the loader's epoch seed (from ``seed``
            outside a loader), resumable with :meth:`state_dict`.
        storage_options, cache, prefetch, retries: for URLs (see :class:`TextLines`).

    Attributes:
        files: the paths, as a :class:`~stoker.compact.StringArray`.
        skipped: bad lines and files skipped so far by this object (each worker
            process counts its own).

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "a.jsonl")
        >>> with open(path, "w") as f:
        ...     _ = f.write('{"id": 1}\\nnot json\\n{"id": 3}\\n')
        >>> ds = JsonLines([path], on_error="skip", transform=lambda r: r["id"])
        >>> list(ds), ds.skipped
        ([1, 3], 1)
    """

    _suffixes = _JSON_SUFFIXES

    def __init__(
        self,
        files: FileSpec,
        *,
        transform: Callable[[Any], Any] | None = None,
        on_error: str = "raise",
        verify: bool | str = False,
        encoding: str = "utf-8",
        shuffle_files: bool = False,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        shuffle_buffer: int | None = None,
        storage_options: dict[str, Any] | None = None,
        cache: Any = None,
        prefetch: int = 2,
        retries: Any = 5,
    ) -> None:
        super().__init__(
            files,
            encoding=encoding,
            transform=transform,
            on_error=on_error,
            verify=verify,
            shuffle_files=shuffle_files,
            seed=seed,
            rank=rank,
            world_size=world_size,
            shuffle_buffer=shuffle_buffer,
            storage=Storage(storage_options, cache, prefetch, retries),
        )

    def _lines(self, stream: Any) -> Iterator[tuple[int, str]]:
        for number, line in enumerate(stream, start=1):
            if line.strip():
                yield number, line

    def _parse(self, text: str) -> Any:
        return json.loads(text)
