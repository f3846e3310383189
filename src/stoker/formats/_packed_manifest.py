"""The packed manifest: its checksum, and a check of every key before any of it is used.

From version 2 the manifest carries ``manifest_crc32``, the crc32 of its own canonical JSON
(the manifest without that key, keys sorted, no spaces, ASCII), so one flipped bit anywhere
in ``manifest.json`` is found: it either stops the JSON from parsing or changes the parsed
value, and with it the checksum. Version 1 manifests have no checksum; they are read with
every other check and a warning saying what is not protected.

Then the structure is checked, whatever the version: known keys of the right types, a schema
of known kinds with numeric dtypes, sane dimensions, and shard file names exactly those the
writer gives shard ``s`` (so a manifest cannot point the reader at ``../outside.npy``,
``/dev/zero`` or another shard's files). Each problem raises :class:`PackedFormatError`
naming the manifest and the key.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from stoker._printable import printable
from stoker.formats._packed_spec import (
    ALIGN,
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST_NAME,
    PARTIAL_SUFFIX,
    FieldSpec,
    PackedFormatError,
    Schema,
    shard_file_names,
)

__all__ = [
    "CHECKSUM_KEY",
    "MAX_MANIFEST_BYTES",
    "READABLE_VERSIONS",
    "manifest_checksum",
    "read_manifest",
    "read_regular_file",
    "regular_file_size",
    "with_checksum",
]

logger = logging.getLogger("stoker")

CHECKSUM_KEY = "manifest_crc32"
READABLE_VERSIONS = (1, 2)
_FIRST_CHECKSUMMED_VERSION = 2
_KINDS = ("bytes", "str", "array", "int", "float")
_LAYOUTS = ("single", "tuple", "dict")
_MAX_NDIM = 64  # numpy's own limit
# A manifest holds a few hundred bytes per shard: 64 MiB is some 100,000 shards.
MAX_MANIFEST_BYTES = 64 * 2**20
_SHARD_COUNTS = (
    "records",
    "data_bytes",
    "data_file_bytes",
    "index_file_bytes",
    "keys_file_bytes",
)
_SHARD_CRCS = ("index_crc32", "keys_crc32")
_REWRITE = "write the dataset again (stoker pack / PackedWriter)"
_warned_unprotected: set[str] = set()


def manifest_checksum(manifest: Mapping[str, Any]) -> int:
    """The crc32 of the canonical JSON of ``manifest`` without its checksum key."""
    body = {key: value for key, value in manifest.items() if key != CHECKSUM_KEY}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return zlib.crc32(text.encode("ascii"))


def with_checksum(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """``manifest`` as JSON will read it back, with its checksum as the last key."""
    normal: dict[str, Any] = json.loads(json.dumps(manifest, ensure_ascii=True))
    normal[CHECKSUM_KEY] = manifest_checksum(normal)
    return normal


def read_manifest(path: str) -> tuple[dict[str, Any], Schema, int]:
    """The checked manifest of the dataset in directory ``path``, its schema, and the crc32
    of the file's bytes (which tells one writing of the dataset from another)."""
    manifest_path = _manifest_path(path)
    raw = _read_manifest_bytes(manifest_path)
    try:
        manifest = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        # ValueError covers bad JSON, bad UTF-8 and over-long integers; deep nesting raises
        # RecursionError. Whatever the parser raises, the file is what is at fault.
        detail = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
        msg = f"{manifest_path} is not valid JSON ({detail}): the manifest is damaged; {_REWRITE}"
        raise PackedFormatError(msg) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        msg = f"{manifest_path} is not a {FORMAT_NAME} manifest (its 'format' is {found!r})"
        raise PackedFormatError(msg)
    version = manifest.get("version")
    if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION:
        msg = (
            f"{manifest_path} is format version {version!r}, but this stoker reads versions up to "
            f"{FORMAT_VERSION}; upgrade stoker to read it"
        )
        raise PackedFormatError(msg)
    if version not in READABLE_VERSIONS or isinstance(version, bool):
        msg = (
            f"{manifest_path} has 'version': {version!r}, which no stoker wrote (versions are "
            f"{', '.join(map(str, READABLE_VERSIONS))}): the manifest is damaged; {_REWRITE}"
        )
        raise PackedFormatError(msg)
    if version >= _FIRST_CHECKSUMMED_VERSION:
        _check_checksum(manifest, manifest_path)
    elif manifest_path not in _warned_unprotected:
        _warned_unprotected.add(manifest_path)
        logger.warning(
            "%s is packed format version 1, whose manifest has no checksum: damage to it that "
            "still parses (a changed dtype, size or count) is found only where the other checks "
            "catch it. Every index, keys file and record is checked as in version 2. Write the "
            "dataset again with this stoker to protect the manifest too.",
            manifest_path,
        )
    schema = _check_structure(manifest, manifest_path)
    return manifest, schema, zlib.crc32(raw)


def _read_manifest_bytes(manifest_path: str) -> bytes:
    """The manifest's bytes, refused unread when it is not a regular file or is far larger than
    any manifest (a damaged or hostile one must not make the reader read gigabytes)."""
    size = regular_file_size(manifest_path, "the manifest")
    if size <= MAX_MANIFEST_BYTES:
        with open(manifest_path, "rb") as f:
            raw = f.read(MAX_MANIFEST_BYTES + 1)
        size = len(raw)
        if size <= MAX_MANIFEST_BYTES:
            return raw
    msg = (
        f"the manifest {manifest_path!r} is {size} bytes, far above any manifest stoker writes "
        f"(at most {MAX_MANIFEST_BYTES} bytes are read): it is damaged or not a manifest; "
        f"{_REWRITE}"
    )
    raise PackedFormatError(msg)


def read_regular_file(path: str, what: str, size: int | None = None) -> bytes:
    """The bytes of ``path``, which must be a regular file (of ``size`` bytes, when given).

    The size is checked before reading, so a damaged manifest cannot make the reader read a
    device or a file far larger than it says.
    """
    actual = regular_file_size(path, what)
    if size is not None and actual != size:
        msg = (
            f"{what} {path!r} is {actual} bytes but the manifest says {size}: it is damaged; "
            f"{_REWRITE}"
        )
        raise PackedFormatError(msg)
    with open(path, "rb") as f:
        raw = f.read(actual + 1)
    if len(raw) != actual:
        msg = f"{what} {path!r} changed size while it was read; open the dataset again"
        raise PackedFormatError(msg)
    return raw


def regular_file_size(path: str, what: str, missing: str = "") -> int:
    """The size of ``path``, which must exist and be a regular file (after links)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        detail = f" {missing}" if missing else ""
        msg = f"{what} {path!r} is missing{detail}: the dataset is incomplete; {_REWRITE}"
        raise PackedFormatError(msg) from None
    if not stat.S_ISREG(info.st_mode):
        msg = (
            f"{what} {path!r} is not a regular file (it is a device, a FIFO or a folder); "
            f"{_REWRITE}"
        )
        raise PackedFormatError(msg)
    return info.st_size


def _manifest_path(path: str) -> str:
    if not os.path.isdir(path):
        what = "does not exist" if not os.path.exists(path) else "is not a directory"
        msg = (
            f"packed dataset {path!r} {what}; pass the directory that PackedWriter or `stoker "
            "pack` wrote"
        )
        raise FileNotFoundError(msg)
    manifest_path = os.path.join(path, MANIFEST_NAME)
    if not os.path.lexists(manifest_path):
        partials = sorted(name for name in os.listdir(path) if name.endswith(PARTIAL_SUFFIX))
        if partials:
            msg = (
                f"{path!r} has no {MANIFEST_NAME}: the write did not finish (it crashed or was "
                f"aborted; {len(partials)} partial file(s) such as {partials[0]!r} remain). "
                "Write the dataset again (PackedWriter(..., overwrite=True) or `stoker pack` "
                "into an empty directory)."
            )
        else:
            msg = (
                f"{path!r} has no {MANIFEST_NAME}: it is not a finished packed dataset (the "
                "write did not finish, or this is not a directory written by PackedWriter / "
                "`stoker pack`)."
            )
        raise PackedFormatError(msg)
    return manifest_path


def _check_checksum(manifest: dict[str, Any], manifest_path: str) -> None:
    stored = manifest.get(CHECKSUM_KEY)
    if not _is_int(stored):
        msg = (
            f"{manifest_path} has no valid {CHECKSUM_KEY!r} (got {stored!r}), which every version "
            f"{manifest['version']} manifest has: the manifest is damaged; {_REWRITE}"
        )
        raise PackedFormatError(msg)
    try:
        computed = manifest_checksum(manifest)
    except RecursionError:
        # JSON nested just short of the parser's limit parses, then is too deep to encode.
        msg = (
            f"{manifest_path} nests too deeply to be checked (RecursionError while computing its "
            f"{CHECKSUM_KEY}): the manifest is damaged; {_REWRITE}"
        )
        raise PackedFormatError(msg) from None
    if computed != stored:
        msg = (
            f"{manifest_path} fails its checksum ({CHECKSUM_KEY} 0x{stored:08x}, computed "
            f"0x{computed:08x}): the manifest is damaged; {_REWRITE}"
        )
        raise PackedFormatError(msg)


def _is_int(value: Any, low: int = 0, high: int | None = None) -> bool:
    return (
        isinstance(value, int)
        and not isinstance(value, bool)
        and value >= low
        and (high is None or value < high)
    )


class _Checker:
    """Raises PackedFormatError naming the manifest and the key that is wrong."""

    def __init__(self, manifest_path: str) -> None:
        self.manifest_path = manifest_path

    def fail(self, where: str, problem: str) -> None:
        msg = (
            f"{printable(self.manifest_path)}: {where} {problem}: the manifest is damaged or was "
            f"not written by stoker; {_REWRITE}"
        )
        raise PackedFormatError(msg)

    def count(self, entry: Mapping[str, Any], key: str, where: str) -> int:
        value = entry.get(key)
        if not _is_int(value):
            self.fail(f"{where}[{key!r}]", f"must be a non-negative integer, got {value!r}")
        return value  # type: ignore[no-any-return]

    def mapping(self, value: Any, where: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(where, f"must be a JSON object, got {type(value).__name__} {_short(value)}")
        return value  # type: ignore[no-any-return]


def _check_structure(manifest: dict[str, Any], manifest_path: str) -> Schema:
    check = _Checker(manifest_path)
    records = check.count(manifest, "records", "the manifest")
    if manifest.get("align") != ALIGN:
        check.fail("the manifest['align']", f"must be {ALIGN}, got {manifest.get('align')!r}")
    schema = _check_schema(check, manifest.get("schema"), records)
    classes = manifest.get("classes")
    if classes is not None and not (
        isinstance(classes, list) and all(isinstance(c, str) for c in classes)
    ):
        check.fail(
            "the manifest['classes']", f"must be null or a list of names, got {_short(classes)}"
        )
    metadata = manifest.get("metadata")
    if metadata is not None:
        check.mapping(metadata, "the manifest['metadata']")
    shards = manifest.get("shards")
    if not isinstance(shards, list):
        check.fail("the manifest['shards']", f"must be a list, got {_short(shards)}")
    for number, entry in enumerate(shards):  # type: ignore[arg-type]
        where = f"shards[{number}]"
        entry = check.mapping(entry, where)
        for key, expected in zip(("data", "index", "keys"), shard_file_names(number), strict=True):
            if entry.get(key) != expected:
                check.fail(
                    f"{where}[{key!r}]",
                    f"must be {expected!r} (the name the writer gives shard {number}), got "
                    f"{entry.get(key)!r}",
                )
        for key in _SHARD_COUNTS:
            check.count(entry, key, where)
        for key in _SHARD_CRCS:
            if not _is_int(entry.get(key), 0, 2**32):
                check.fail(
                    f"{where}[{key!r}]", f"must be a crc32 (0 to 2**32 - 1), got {entry.get(key)!r}"
                )
        if entry["data_file_bytes"] <= entry["data_bytes"]:
            check.fail(
                f"{where}['data_file_bytes']",
                f"({entry['data_file_bytes']}) must exceed its data_bytes "
                f"({entry['data_bytes']}) by the .npy header",
            )
    total = sum(entry["records"] for entry in shards)  # type: ignore[union-attr]
    if total != records:
        check.fail("the manifest['records']", f"is {records} but its shards hold {total} records")
    return schema


def _check_schema(check: _Checker, entry: Any, records: int) -> Schema:
    entry = check.mapping(entry, "the manifest['schema']")
    layout, fields = entry.get("layout"), entry.get("fields")
    if layout not in _LAYOUTS:
        check.fail("schema['layout']", f"must be one of {_LAYOUTS}, got {layout!r}")
    if not isinstance(fields, list):
        check.fail("schema['fields']", f"must be a list, got {_short(fields)}")
    if (layout == "single" and len(fields) != 1 and (records or fields)) or (
        not fields and records
    ):
        check.fail(
            "schema['fields']",
            f"cannot describe {records} {layout!r} records with {len(fields)} field(s)",
        )
    specs = []
    for k, field in enumerate(fields):
        where = f"schema['fields'][{k}]"
        field = check.mapping(field, where)
        name, kind = field.get("name"), field.get("kind")
        expected_name = {"single": name is None, "tuple": name == k and _is_int(name)}.get(
            layout, isinstance(name, str)
        )
        if not expected_name:
            wanted = {"single": "null", "tuple": str(k)}.get(layout, "a string")
            check.fail(f"{where}['name']", f"must be {wanted} for {layout!r} records, got {name!r}")
        if kind not in _KINDS:
            check.fail(f"{where}['kind']", f"must be one of {_KINDS}, got {kind!r}")
        dtype, ndim = field.get("dtype"), field.get("ndim")
        if kind == "array":
            _check_dtype(check, f"{where}['dtype']", dtype)
            if not _is_int(ndim, 0, _MAX_NDIM + 1):
                check.fail(
                    f"{where}['ndim']", f"must be an integer from 0 to {_MAX_NDIM}, got {ndim!r}"
                )
        elif dtype is not None or ndim is not None:
            check.fail(where, f"is a {kind!r} field but has a dtype ({dtype!r}) or ndim ({ndim!r})")
        specs.append(FieldSpec(name, kind, dtype, ndim))
    names = [spec.name for spec in specs]
    if len(set(map(repr, names))) != len(names):
        check.fail("schema['fields']", f"names a field twice: {names!r}")
    return Schema(layout, tuple(specs))


def _check_dtype(check: _Checker, where: str, text: Any) -> None:
    try:
        dtype = np.dtype(text) if isinstance(text, str) else None
    except (TypeError, ValueError):
        dtype = None
    if dtype is None or dtype.str != text:
        check.fail(where, f"must be a numpy dtype string such as '<f4' or '|u1', got {text!r}")
    if dtype.hasobject or dtype.fields is not None or dtype.kind in "OV" or not dtype.itemsize:  # type: ignore[union-attr]
        check.fail(where, f"must be a number, bool, time or fixed-size string dtype, got {text!r}")


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
