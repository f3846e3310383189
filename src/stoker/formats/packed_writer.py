"""``PackedWriter``: streams records into packed shards and finishes atomically.

See docs/packed-format.md for the layout. In short: records are appended to the data
file of the current shard (a 1-D uint8 ``.npy``); a shard is closed when the next record
would take it past ``max_shard_bytes``; each shard also gets an index (a structured
``.npy``: offset, length, crc32 and the field layout of every record) and a keys file
(the optional per-record source names). Every file is written under a ``.partial`` name;
:meth:`PackedWriter.close` fsyncs and renames them and then writes ``manifest.json``
the same way, last. A reader refuses a directory without a manifest, so a write that
crashed, or was aborted, never passes for a complete dataset.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, BinaryIO

import numpy as np

import stoker
from stoker._validate import check_int
from stoker.formats._packed_manifest import with_checksum
from stoker.formats._packed_spec import (
    ALIGN,
    BLOB_KINDS,
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST_NAME,
    NPY_HEADER_BYTES,
    PARTIAL_SUFFIX,
    Schema,
    align_up,
    fspath,
    npy_header,
    shard_file_names,
)

__all__ = ["DEFAULT_SHARD_BYTES", "PackedWriter"]

DEFAULT_SHARD_BYTES = 256 * 2**20
_OWN_FILE = re.compile(r"^(shard-\d{5,}\.(npy|index\.npy|keys\.npy)|manifest\.json)(\.partial)?$")
_ZEROS = bytes(ALIGN)
_INITIAL_ROWS = 1024
_WRITE_BUFFER_BYTES = 1 << 20


class PackedWriter:
    """Writes records into a directory of packed shards, one :meth:`add` at a time.

    A record is one value, a tuple of values or a dict of values (``str`` keys); each
    value is bytes-like, ``str``, a numpy array (any numeric, bool or fixed-size string
    dtype; the shape may change from record to record, the dtype and number of
    dimensions may not), an ``int`` (stored as int64) or a ``float`` (float64). The
    first record fixes the fields; every later record must have the same ones.

    Use it as a context manager: leaving the block normally finishes the dataset
    (:meth:`close`); leaving it with an exception aborts it (:meth:`abort`: the partial
    files are removed and no manifest is written).

    Args:
        path: the output directory. Created if missing; it must be empty unless
            ``overwrite=True``.
        max_shard_bytes: a shard is closed before a record would take its data past
            this size (a record larger than the limit gets a shard of its own).
        classes: class names, label ``i`` being ``classes[i]`` (or a ``{name: label}``
            mapping with labels ``0..n-1``); stored in the manifest.
        metadata: JSON-serialisable user metadata stored in the manifest. The dict
            stays available as :attr:`metadata` and may be updated until :meth:`close`.
        overwrite: replace a packed dataset already in ``path``: its manifest is
            removed first (so a crash mid-way leaves no complete-looking dataset), then
            its shard files. Files that are not part of the format are left alone.

    Example:
        >>> import tempfile, numpy as np
        >>> from stoker.formats.packed import PackedDataset, PackedWriter
        >>> folder = tempfile.mkdtemp()
        >>> with PackedWriter(folder, classes=["cat", "dog"]) as writer:
        ...     _ = writer.add((b"jpeg bytes", np.arange(3, dtype=np.int16), 1), key="dog/1.jpg")
        ...     _ = writer.add((b"more", np.arange(5, dtype=np.int16), 0), key="cat/7.jpg")
        >>> data, values, label = PackedDataset(folder)[1]
        >>> bytes(data), values.tolist(), label
        (b'more', [0, 1, 2, 3, 4], 0)
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_shard_bytes: int = DEFAULT_SHARD_BYTES,
        classes: Sequence[str] | Mapping[str, int] | None = None,
        metadata: Mapping[str, Any] | None = None,
        overwrite: bool = False,
    ) -> None:
        self.path = fspath(path, "path")
        self.max_shard_bytes = check_int(
            "max_shard_bytes", max_shard_bytes, minimum=1, hint="bytes"
        )
        self.classes = _check_classes(classes)
        self.metadata: dict[str, Any] = dict(metadata or {})
        _check_json("metadata", self.metadata)
        _prepare_directory(self.path, overwrite)
        self._schema: Schema | None = None
        self._index_dtype: np.dtype | None = None
        self._records = 0
        self._shards: list[dict[str, Any]] = []
        self._partials: list[str] = []
        self._state = "open"
        self._file: BinaryIO | None = None
        self._rows: np.ndarray | None = None
        self._shard_records = 0
        self._shard_bytes = 0
        self._crc_scratch = bytearray()
        self._keys = bytearray()

    # -- public API ----------------------------------------------------------------

    @property
    def records(self) -> int:
        """Records added so far."""
        return self._records

    def add(self, record: Any, *, key: str | None = None) -> int:
        """Appends one record; returns its index in the dataset.

        Args:
            record: a value, a tuple or a dict of values (see the class docstring).
            key: an optional name of the record's source (a file path, an id), shown by
                :meth:`PackedDataset.describe_sample` and :meth:`PackedDataset.key`.
        """
        if self._state != "open":
            msg = (
                f"PackedWriter for {self.path!r} is {self._state}; records can only be added "
                "before close()"
            )
            raise ValueError(msg)
        if key is not None and not isinstance(key, str):
            msg = f"key must be a str or None, got {type(key).__name__} {key!r}"
            raise TypeError(msg)
        if self._schema is None:
            self._schema = Schema.infer(record)
            self._index_dtype = self._schema.index_dtype()
        values = self._schema.values(record, self._records)
        parts, layout, length = _layout(self._schema, values)
        start = align_up(self._shard_bytes)
        if self._shard_records and start + length > self.max_shard_bytes:
            self._finish_shard()
            start = 0
        if self._file is None:
            self._begin_shard()
            start = 0
        self._write_record(start, parts, layout, length, values, key)
        self._records += 1
        return self._records - 1

    def close(self) -> None:
        """Finishes the dataset: closes the last shard, renames every file to its final
        name, then writes the manifest. Safe to call twice."""
        if self._state != "open":
            if self._state == "aborted":
                msg = f"PackedWriter for {self.path!r} was aborted; its records were discarded"
                raise ValueError(msg)
            return
        try:
            _check_json("metadata", self.metadata)
            if self._file is not None:
                self._finish_shard()
            for partial in self._partials:
                os.replace(partial, partial[: -len(PARTIAL_SUFFIX)])
            _fsync_directory(self.path)
            manifest = with_checksum(self._manifest())
            target = os.path.join(self.path, MANIFEST_NAME)
            with open(target + PARTIAL_SUFFIX, "w", encoding="utf-8") as f:
                json.dump(manifest, f, indent=1, ensure_ascii=True)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(target + PARTIAL_SUFFIX, target)
        except BaseException:
            self.abort()
            raise
        self._state = "closed"
        _fsync_directory(self.path)

    def abort(self) -> None:
        """Discards the write: closes and removes every partial file; no manifest is
        written. Safe to call twice."""
        if self._state == "closed":
            return
        self._state = "aborted"
        if self._file is not None:
            self._file.close()
            self._file = None
        for partial in [*self._partials, os.path.join(self.path, MANIFEST_NAME + PARTIAL_SUFFIX)]:
            for name in (partial, partial[: -len(PARTIAL_SUFFIX)]):
                if name.endswith(MANIFEST_NAME):
                    continue  # never remove a finished manifest (only ours could exist)
                with contextlib.suppress(FileNotFoundError):
                    os.remove(name)

    def __enter__(self) -> PackedWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def __repr__(self) -> str:
        shards = len(self._shards) + (self._file is not None)
        return (
            f"PackedWriter({self.path!r}, records={self._records}, shards={shards}, "
            f"state={self._state!r})"
        )

    # -- shards ----------------------------------------------------------------------

    def _partial(self, name: str) -> str:
        path = os.path.join(self.path, name + PARTIAL_SUFFIX)
        self._partials.append(path)
        return path

    def _begin_shard(self) -> None:
        data_name = shard_file_names(len(self._shards))[0]
        # open across add() calls until the shard is finished: no with-block can hold it
        self._file = open(self._partial(data_name), "wb", buffering=_WRITE_BUFFER_BYTES)  # noqa: SIM115
        self._file.write(npy_header(0))
        self._rows = np.zeros(_INITIAL_ROWS, dtype=self._index_dtype)
        self._shard_records = self._shard_bytes = 0
        self._keys = bytearray()

    def _write_record(
        self,
        start: int,
        parts: list[memoryview],
        layout: list[tuple[Any, ...]],
        length: int,
        values: list[Any],
        key: str | None,
    ) -> None:
        f = self._file
        if f is None or self._rows is None:
            raise AssertionError("no shard is open")
        if start > self._shard_bytes:
            f.write(_ZEROS[: start - self._shard_bytes])
        crc = 0
        position = 0
        for part, (field_start, _nbytes, _shape) in zip(parts, layout, strict=True):
            if field_start > position:
                gap = _ZEROS[: field_start - position]
                f.write(gap)
                crc = zlib.crc32(gap, crc)
            f.write(part)
            crc = zlib.crc32(part, crc)
            position = field_start + len(part)
        if position != length:
            raise AssertionError(f"record length {length} but wrote {position} bytes")
        encoded_key = b"" if key is None else key.encode("utf-8", "surrogatepass")
        row: list[Any] = [start, length, crc, len(self._keys), len(encoded_key)]
        blob = iter(layout)
        for field, value in zip(self._schema.fields, values, strict=True):  # type: ignore[union-attr]
            if field.kind in BLOB_KINDS:
                field_start, nbytes, shape = next(blob)
                row += [field_start, nbytes]
                if shape is not None:
                    row.append(shape)
            else:
                row.append(int(value) if field.kind == "int" else float(value))
        if self._shard_records == len(self._rows):
            self._rows = np.concatenate([self._rows, np.zeros_like(self._rows)])
        self._rows[self._shard_records] = tuple(row)
        self._keys += encoded_key
        self._shard_records += 1
        self._shard_bytes = start + length

    def _finish_shard(self) -> None:
        f, rows = self._file, self._rows
        if f is None or rows is None:
            raise AssertionError("no shard is open")
        shard = len(self._shards)
        data_name, index_name, keys_name = shard_file_names(shard)
        f.seek(0)
        f.write(npy_header(self._shard_bytes))
        f.flush()
        os.fsync(f.fileno())
        f.close()
        self._file = None
        index_bytes, index_crc = _write_npy(self._partial(index_name), rows[: self._shard_records])
        keys_bytes, keys_crc = _write_npy(
            self._partial(keys_name), np.frombuffer(bytes(self._keys), dtype=np.uint8)
        )
        self._shards.append(
            {
                "data": data_name,
                "index": index_name,
                "keys": keys_name,
                "records": self._shard_records,
                "data_bytes": self._shard_bytes,
                "data_file_bytes": NPY_HEADER_BYTES + self._shard_bytes,
                "index_file_bytes": index_bytes,
                "index_crc32": index_crc,
                "keys_file_bytes": keys_bytes,
                "keys_crc32": keys_crc,
            }
        )
        self._rows = None
        self._shard_records = self._shard_bytes = 0

    def _manifest(self) -> dict[str, Any]:
        schema = (
            self._schema.to_json()
            if self._schema is not None
            else {"layout": "single", "fields": []}
        )
        return {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "created_by": f"stoker {stoker.__version__}",
            "records": self._records,
            "align": ALIGN,
            "schema": schema,
            "classes": self.classes,
            "metadata": self.metadata,
            "shards": self._shards,
        }


def _layout(
    schema: Schema, values: list[Any]
) -> tuple[list[memoryview], list[tuple[Any, ...]], int]:
    """The bytes of a record's blob fields and where each goes (start, nbytes, shape)."""
    parts: list[memoryview] = []
    layout: list[tuple[Any, ...]] = []
    position = 0
    for field, value in zip(schema.fields, values, strict=True):
        if field.kind not in BLOB_KINDS:
            continue
        shape = None
        if field.kind == "bytes":
            view = memoryview(value)
            if not view.c_contiguous:
                view = memoryview(view.tobytes())
            view = view.cast("B") if view.ndim != 1 or view.format != "B" else view
        elif field.kind == "str":
            view = memoryview(value.encode("utf-8", "surrogatepass"))
        else:
            array = np.ascontiguousarray(value)
            position = align_up(position)
            view = memoryview(array.reshape(-1).view(np.uint8))
            shape = tuple(array.shape) if field.ndim else None
        parts.append(view)
        layout.append((position, view.nbytes, shape))
        position += view.nbytes
    return parts, layout, position


def _write_npy(path: str, array: np.ndarray) -> tuple[int, int]:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    raw = buffer.getvalue()
    with open(path, "wb") as f:
        f.write(raw)
        f.flush()
        os.fsync(f.fileno())
    return len(raw), zlib.crc32(raw)


def _fsync_directory(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _prepare_directory(path: str, overwrite: bool) -> None:
    if os.path.exists(path) and not os.path.isdir(path):
        msg = (
            f"PackedWriter needs a directory to write into, but {path!r} is a file; choose "
            "another path"
        )
        raise NotADirectoryError(msg)
    os.makedirs(path, exist_ok=True)
    entries = sorted(os.listdir(path))
    if not entries:
        return
    if not overwrite:
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        what = (
            "a packed dataset" if MANIFEST_NAME in entries else f"{len(entries)} entries ({shown})"
        )
        msg = (
            f"PackedWriter's directory {path!r} is not empty: it holds {what}. Choose an empty "
            "directory, or pass overwrite=True to replace the packed dataset there."
        )
        raise FileExistsError(msg)
    manifest = os.path.join(path, MANIFEST_NAME)
    if os.path.exists(manifest):
        os.remove(manifest)  # first: from here on the old dataset no longer looks complete
        _fsync_directory(path)
    for name in entries:
        if name != MANIFEST_NAME and _OWN_FILE.match(name):
            os.remove(os.path.join(path, name))


def _check_classes(classes: Any) -> list[str] | None:
    if classes is None:
        return None
    if isinstance(classes, Mapping):
        labels = (
            sorted(classes.values()) if all(isinstance(v, int) for v in classes.values()) else None
        )
        if labels != list(range(len(classes))):
            msg = (
                "classes as a mapping must map each class name to a distinct label 0..n-1, "
                f"got {dict(classes)!r}"
            )
            raise ValueError(msg)
        names = [name for name, _ in sorted(classes.items(), key=lambda item: item[1])]
    elif isinstance(classes, (str, bytes)) or not isinstance(classes, Sequence):
        msg = (
            "classes must be a sequence of class names or a {name: label} mapping, got "
            f"{classes!r}"
        )
        raise TypeError(msg)
    else:
        names = list(classes)
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        msg = f"class names must be str, got {bad[0]!r} ({type(bad[0]).__name__})"
        raise TypeError(msg)
    if len(set(names)) != len(names):
        dupes = sorted({n for n in names if names.count(n) > 1})
        msg = f"class names must be distinct, got duplicates {dupes!r}"
        raise ValueError(msg)
    return names


def _check_json(what: str, value: Any) -> None:
    try:
        json.dumps(value, ensure_ascii=True)
    except (TypeError, ValueError) as exc:
        msg = f"{what} must be JSON-serialisable (it is stored in manifest.json): {exc}"
        raise TypeError(msg) from None
