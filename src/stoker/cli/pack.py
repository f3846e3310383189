"""``stoker pack``: pack an image folder or a list of files into packed shards.

``stoker pack SRC DST`` reads every image of ``SRC`` (one subfolder per class) in the
order of :class:`stoker.formats.image_folder.ImageFolder`'s sorted index (so index ``i``
is the same image in both, and ``--index`` reuses an index saved with
``ImageFolder.save_index``) and writes ``DST`` in the packed format
(docs/packed-format.md): records ``(encoded image bytes, label)``, the class names in the
manifest, each record keyed by its path relative to ``SRC``. With ``--files LIST.txt``
the files are the lines of the list instead (``PATH`` or ``PATH<TAB>CLASS``; relative
paths start at ``SRC``); without classes the records are the bytes alone.
``--classes-from`` takes the class mapping of another split, so train and val agree.

Files are read by a pool of threads and each image is checked with Pillow (a full
decode at reduced scale by default, which catches truncated JPEGs); unreadable or
corrupt files are skipped, listed on stdout and in ``DST/skipped.txt``
(``PATH<TAB>REASON`` per line), and counted in the manifest's metadata.

``--max-side N`` shrinks the JPEGs and PNGs whose longer side exceeds ``N`` to ``N`` and
stores them as JPEG at ``--quality`` (90 by default); ``--quality`` alone encodes every
JPEG again (:mod:`stoker._image_reencode`). The work runs in the reading threads; the
options are recorded in the manifest's metadata (``"resize"``), and a file that cannot
be decoded for it is skipped and listed like the files the check refuses.

A pack that does not finish (Ctrl-C, an error) removes its partial files, and ``DST``
itself when the command created it; a pack that finishes is kept even when the reader of
its output went away (``stoker pack ... | head -1``, exit status 141).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import re
import sys
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from stoker._errors import DatasetError
from stoker._extras import require
from stoker._image_files import IMAGE_CHECKS, pillow_reason, read_image_file
from stoker._image_reencode import DEFAULT_QUALITY, Reencode
from stoker._printable import printable
from stoker.cli._args import int_between, positive_int
from stoker.cli._output import EXIT_BROKEN_PIPE, progress_bar, say, silence_stdout, usage_error

__all__ = ["add_parser", "run"]

_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([kmgt]?)(i?)(b?)\s*$", re.IGNORECASE)
_SKIPPED_SHOWN = 20
_PLAIN_PROGRESS_EVERY_S = 2.0


class PackError(Exception):
    """A problem with the command's input; its message is printed and the exit status is 1."""


class _NoSource(PackError):
    """SRC names no directory: a usage error (exit status 2)."""


@dataclass(frozen=True, slots=True)
class _Item:
    path: str  # where to read it
    key: str  # how the record names it (relative to SRC, '/'-separated)
    label: int | None


def parse_size(text: str) -> int:
    """``"256MB"`` -> 256_000_000, ``"1GiB"`` -> 2**30, ``"4096"`` -> 4096."""
    match = _SIZE.match(text)
    if not match or float(match.group(1)) <= 0:
        msg = (
            "a size needs a positive number and an optional unit like 64MB, 256MiB or 1GB, "
            f"got {text!r}"
        )
        raise argparse.ArgumentTypeError(msg)
    number, prefix, binary = float(match.group(1)), match.group(2).lower(), match.group(3)
    power = "_kmgt".index(prefix) if prefix else 0
    return max(1, int(number * (1024 if binary else 1000) ** power))


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "pack",
        help="pack an image folder or a file list into packed shards",
        description="Pack an image folder (one subfolder per class) or a list of files into "
        "packed shards (docs/packed-format.md), checking every image and reporting "
        "the files it skips.",
    )
    parser.add_argument(
        "src", metavar="SRC", help="image folder (SRC/CLASS/IMAGE), or the root of --files paths"
    )
    parser.add_argument(
        "dst", metavar="DST", help="output directory (created; must be empty unless --overwrite)"
    )
    parser.add_argument(
        "--shard-size",
        type=parse_size,
        default="256MiB",
        metavar="SIZE",
        help="largest shard data file: KB/MB/GB are powers of 1000, KiB/MiB/GiB of 1024 (default "
        "256MiB)",
    )
    parser.add_argument(
        "--workers",
        type=positive_int,
        default=min(32, (os.cpu_count() or 1) + 4),
        metavar="N",
        help="threads reading and checking files (default: CPUs + 4, at most 32)",
    )
    parser.add_argument(
        "--files",
        metavar="LIST.txt",
        help="pack the files listed, one per line: PATH or PATH<TAB>CLASS (relative paths start "
        "at SRC)",
    )
    parser.add_argument(
        "--index",
        metavar="INDEX.json",
        help="use an index saved by ImageFolder.save_index instead of walking SRC",
    )
    parser.add_argument(
        "--classes-from",
        metavar="PATH",
        help="take the class mapping from a packed dataset or a JSON file (a list of names, or "
        "{name: label}), so that train and val share one mapping",
    )
    parser.add_argument(
        "--check",
        choices=IMAGE_CHECKS,
        default="decode",
        help="per-image check: decode (default; full decode at reduced scale, catches truncated "
        "files), verify (Pillow's verify(), headers only) or none",
    )
    parser.add_argument(
        "--max-side",
        type=positive_int,
        metavar="N",
        help="shrink every JPEG or PNG whose longer side exceeds N pixels so that it is N (aspect "
        "kept) and store it as JPEG (--quality); smaller images are stored as they are. The "
        "resizing filter is Pillow's LANCZOS, the sharpest of its filters when shrinking: its "
        "cost is paid once, here, not in every epoch. Each resized image is first turned "
        "upright (its EXIF orientation applied) and converted to RGB unless it is RGB or "
        "grayscale (RGBA and palette PNGs lose their transparency, CMYK JPEGs are converted); "
        "EXIF data is not kept",
    )
    parser.add_argument(
        "--quality",
        type=int_between(1, 95),
        metavar="Q",
        help=f"JPEG quality (1-95) of the images --max-side resizes (default {DEFAULT_QUALITY}); "
        "without --max-side, every JPEG is encoded again at Q (turned upright and converted to "
        "RGB as above; PNGs are kept)",
    )
    parser.add_argument(
        "--verify", action="store_true", help="re-read DST and check every record's checksum"
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace a packed dataset already in DST"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        return _pack(args)
    except _NoSource as exc:
        return usage_error("pack", f"error: {exc}")
    except BrokenPipeError:  # an OSError, but no error of the pack's: the status is 141
        raise
    except (PackError, OSError, DatasetError) as exc:  # bad input, I/O errors, a damaged result
        say(f"stoker pack: error: {exc}", sys.stderr)
        return 1


# -- listing the input ------------------------------------------------------------------


def _read_list(list_path: str, root: str) -> tuple[list[str] | None, list[tuple[str, str]]]:
    try:
        with open(list_path, encoding="utf-8") as f:
            lines = [line.rstrip("\r\n") for line in f]
    except OSError as exc:
        raise PackError(f"cannot read the file list {list_path!r}: {exc.strerror or exc}") from None
    entries = []
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        path, _, label = line.partition("\t")
        entries.append((number, path.strip(), label.strip()))
    labelled = {bool(label) for _, _, label in entries}
    if len(labelled) > 1:
        number = next(n for n, _, label in entries if not label)
        msg = (
            f"{printable(list_path)}: line {number} has no class but other lines do; "
            "give every line a class (PATH<TAB>CLASS) or none"
        )
        raise PackError(msg)
    files = [
        (path if os.path.isabs(path) else os.path.join(root, path), label)
        for _, path, label in entries
    ]
    classes = sorted({label for _, _, label in entries}) if labelled == {True} else None
    return classes, files


def _load_classes(spec: str) -> list[str]:
    from stoker.formats.packed import PackedDataset

    if os.path.isdir(spec):
        classes = PackedDataset(spec).classes
        if classes is None:
            raise PackError(f"--classes-from {spec!r}: that packed dataset stores no classes")
        return classes
    try:
        with open(spec, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, ValueError) as exc:
        raise PackError(f"--classes-from {spec!r}: cannot read it as JSON ({exc})") from None
    if isinstance(value, dict) and sorted(value.values()) == list(range(len(value))):
        return [name for name, _ in sorted(value.items(), key=lambda item: item[1])]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    msg = (
        f"--classes-from {spec!r}: expected a JSON list of class names "
        "or a {name: label} mapping with labels 0..n-1"
    )
    raise PackError(msg)


def _list_items(args: argparse.Namespace) -> tuple[list[str] | None, list[_Item], list[str]]:
    """The classes, the files to pack in order, and notes to print."""
    root = args.src
    if not os.path.isdir(root):
        what = "does not exist" if not os.path.exists(root) else "is not a directory"
        msg = (
            f"SRC {root!r} {what}; pass an image folder (SRC/CLASS/IMAGE), or a root folder "
            "with --files LIST.txt"
        )
        raise _NoSource(msg)
    if (
        not args.files
        and not args.index
        and not any(not name.startswith(".") for name in os.listdir(root))
    ):
        raise PackError(
            f"SRC {root!r} is empty: expected one subfolder per class with images inside "
            "(SRC/cat/1.jpg)"
        )
    shared = _load_classes(args.classes_from) if args.classes_from else None
    notes = []
    if args.files:
        classes, found = _read_list(args.files, root)
        if not found:
            raise PackError(f"the file list {args.files!r} names no files")
        if shared is not None:
            if classes is None:
                raise PackError(
                    "--classes-from needs labelled input: PATH<TAB>CLASS lines in the file list"
                )
            unknown = sorted(set(classes) - set(shared))
            if unknown:
                msg = (
                    f"classes {unknown[:5]!r} of {args.files!r} are not in the mapping from "
                    f"{args.classes_from!r}"
                )
                raise PackError(msg)
            classes = shared
        lookup = {name: label for label, name in enumerate(classes or ())}
        pairs = [(path, lookup[name] if classes is not None else None) for path, name in found]
    else:
        from stoker.formats.image_folder import ImageFolder

        try:
            folder = ImageFolder(root, classes=shared, index=args.index)
        except (OSError, ValueError, TypeError, DatasetError) as exc:
            text = str(exc).rstrip()
            text += "" if text.endswith(".") else "."
            raise PackError(
                f"{text} To pack files that are not in class folders, pass --files LIST.txt."
            ) from None
        classes = folder.classes
        counts = np.bincount(folder.targets, minlength=len(classes))
        for name, count in zip(classes, counts.tolist(), strict=True):
            if count == 0:
                notes.append(
                    f"class {name!r} has no images (it keeps its label, so train and val "
                    "mappings agree)"
                )
        pairs = [(folder.path(i), label) for i, label in enumerate(folder.targets.tolist())]
    items = []
    for path, label in pairs:
        key = os.path.relpath(path, root)
        key = path if key.startswith(os.pardir) else key
        items.append(_Item(path, key.replace(os.sep, "/"), label))
    return classes, items, notes


# -- reading and checking ----------------------------------------------------------------


def _read_item(
    path: str, mode: str, reencode: Reencode | None
) -> tuple[bytes | None, str | None, bool]:
    """The bytes to store (or None and why not), and whether ``reencode`` changed them."""
    data, error = read_image_file(path, mode)
    if data is None or reencode is None:
        return data, error, False
    try:
        smaller = reencode(data, path)
    except Exception as exc:  # Pillow raises many types for bad images
        return None, f"corrupt image: {pillow_reason(exc, repr(path))}", False
    return (data, None, False) if smaller is None else (smaller, None, True)


def _read_in_order(
    items: list[_Item], workers: int, mode: str, reencode: Reencode | None = None
) -> Iterator[tuple[_Item, bytes | None, str | None, bool]]:
    """Reads (and re-encodes) with a thread pool, yielding in the input order, a bounded
    window ahead."""
    window = max(4, 4 * workers)
    with concurrent.futures.ThreadPoolExecutor(
        max_workers=workers, thread_name_prefix="stoker-pack"
    ) as pool:
        pending: deque[tuple[_Item, concurrent.futures.Future[Any]]] = deque()
        source = iter(items)
        for item in source:
            pending.append((item, pool.submit(_read_item, item.path, mode, reencode)))
            if len(pending) >= window:
                break
        while pending:
            item, future = pending.popleft()
            data, error, changed = future.result()
            nxt = next(source, None)
            if nxt is not None:
                pending.append((nxt, pool.submit(_read_item, nxt.path, mode, reencode)))
            yield item, data, error, changed


class _Progress:
    """tqdm when installed, else a plain line every few seconds on stderr."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.skipped = total, 0, 0
        self._last = time.monotonic()
        self._bar = progress_bar(total, "file", "stoker pack")

    def update(self, skipped: bool) -> None:
        self.done += 1
        self.skipped += skipped
        if self._bar is not None:
            self._bar.update(1)
            if skipped:
                self._bar.set_postfix(skipped=self.skipped, refresh=False)
        elif time.monotonic() - self._last >= _PLAIN_PROGRESS_EVERY_S or self.done == self.total:
            self._last = time.monotonic()
            print(
                f"stoker pack: {self.done}/{self.total} files "
                f"({100 * self.done // max(1, self.total)}%), {self.skipped} skipped",
                file=sys.stderr,
                flush=True,
            )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


# -- the command ---------------------------------------------------------------------------


class _Lines:
    """The command's lines on stdout. When the reader goes away (``stoker pack ... | head -1``)
    the rest are dropped and the pack goes on to the end: a finished pack is kept."""

    def __init__(self) -> None:
        self.reader_gone = False

    def __call__(self, text: str) -> None:
        if self.reader_gone:
            return
        try:
            say(text)
        except BrokenPipeError:
            self.reader_gone = True
            silence_stdout()


def _pack(args: argparse.Namespace) -> int:
    from stoker.formats.packed import PackedDataset, PackedWriter

    reencode = Reencode.from_options(args.max_side, args.quality)
    if reencode is not None:
        require("PIL", "stoker pack", "to resize or re-encode images (--max-side, --quality)")
    elif args.check != "none":
        require("PIL", "stoker pack", "to check images (or pass --check none)")
    if os.path.isdir(args.dst) and os.listdir(args.dst) and not args.overwrite:
        what = (
            "a packed dataset"
            if os.path.exists(os.path.join(args.dst, "manifest.json"))
            else "other files"
        )
        msg = (
            f"DST {args.dst!r} is not empty (it holds {what}); choose an empty directory, or "
            "pass --overwrite"
        )
        raise PackError(msg)
    started = time.perf_counter()
    classes, items, notes = _list_items(args)
    lines = _Lines()
    for note in notes:
        lines(f"stoker pack: {note}")
    lines(
        f"stoker pack: {len(items)} file(s)"
        + (f" in {len(classes)} class(es)" if classes is not None else "")
        + f" -> {printable(args.dst)} (shards of at most {args.shard_size:,} bytes, "
        f"{args.workers} threads, check={args.check}{_describe(reencode)})"
    )
    metadata: dict[str, Any] = {
        "source": os.path.abspath(args.src),
        "packed_by": "stoker pack",
        "check": args.check,
    }
    if reencode is not None:
        metadata["resize"] = reencode.describe()
    created = not os.path.exists(args.dst)  # an unfinished pack leaves no empty DST behind
    writer = PackedWriter(
        args.dst,
        max_shard_bytes=args.shard_size,
        classes=classes,
        metadata=metadata,
        overwrite=args.overwrite,
    )
    skipped: list[tuple[str, str]] = []
    payload = reencoded = 0
    progress = _Progress(len(items))
    try:
        for item, data, error, changed in _read_in_order(items, args.workers, args.check, reencode):
            if data is None:
                skipped.append((item.key, error or "unknown error"))
            else:
                writer.add(data if item.label is None else (data, item.label), key=item.key)
                payload += len(data)
                reencoded += changed
            progress.update(data is None)
        progress.close()
        _write_skipped(args.dst, skipped)
        _report_skipped(args.dst, skipped, lines)
        if writer.records == 0:
            msg = (
                f"none of the {len(items)} file(s) could be read; nothing was packed (see "
                f"{printable(args.dst)}/skipped.txt)"
            )
            raise PackError(msg)
        writer.metadata["skipped"] = len(skipped)
        if reencode is not None:
            writer.metadata["resize"]["reencoded"] = reencoded
        writer.close()
    except BaseException:  # Ctrl-C included
        progress.close()
        writer.abort()
        if created:
            with contextlib.suppress(OSError):  # kept when it holds skipped.txt
                os.rmdir(args.dst)
        raise
    dataset = PackedDataset(args.dst, verify="open" if args.verify else False)
    elapsed = time.perf_counter() - started
    lines(
        f"stoker pack: packed {len(dataset)} record(s), {payload / 1e6:,.1f} MB, into "
        f"{len(dataset.shard_paths)} shard(s) in {elapsed:.1f} s; skipped {len(skipped)}"
        + (f"; re-encoded {reencoded} image(s)" if reencode is not None else "")
        + ("; verified every record's checksum" if args.verify else "")
    )
    return EXIT_BROKEN_PIPE if lines.reader_gone else 0


def _describe(reencode: Reencode | None) -> str:
    if reencode is None:
        return ""
    if reencode.max_side is None:
        return f", every JPEG re-encoded at quality {reencode.quality}"
    return (
        f", longer sides above {reencode.max_side} px shrunk to {reencode.max_side}, "
        f"JPEG quality {reencode.quality}"
    )


def _write_skipped(dst: str, skipped: list[tuple[str, str]]) -> None:
    with open(
        os.path.join(dst, "skipped.txt"), "w", encoding="utf-8", errors="surrogateescape"
    ) as f:
        for key, reason in skipped:
            f.write(f"{key}\t{reason}\n")


def _report_skipped(dst: str, skipped: list[tuple[str, str]], lines: _Lines) -> None:
    if not skipped:
        return
    listing = os.path.join(dst, "skipped.txt")
    count = len(skipped)
    where = printable(listing)
    lines(f"stoker pack: skipped {count} unreadable or corrupt file(s) (listed in {where}):")
    for key, reason in skipped[:_SKIPPED_SHOWN]:
        lines(f"  {printable(key)}: {reason}")
    if len(skipped) > _SKIPPED_SHOWN:
        lines(f"  ... and {len(skipped) - _SKIPPED_SHOWN} more")
