"""Reading one tar shard front to back into samples, checking what ``tarfile`` lets pass.

``tarfile`` in stream mode stops without complaint at a missing or garbled header, never
checks a gzip stream's CRC-32 and length (it stops at the archive's end marker, before the
compressed stream ends), reads a member's data whole whatever size its header claims, and
hands out links and device files as members without data. So here:

- a shard must end with the end-of-archive marker, and a compressed one must then pass its
  checks (the rest of the stream is read to its end; a gzipped one is read by ``gzip``,
  which checks the CRC-32 and length there);
- a member whose header claims more than ``max_member_bytes`` is not read, and its sample
  is reported (the cap bounds what a small compressed shard can inflate to in memory);
- a link, device or FIFO member is not silently dropped: its sample is reported;
- with ``verify="open"`` a gzipped shard is checked in full before its first sample.

A bad sample is yielded as a :class:`BadSample`, so the reader can raise or skip exactly
that sample; a bad shard raises :class:`~stoker.DatasetError` naming it. An ``http(s)://``
shard is streamed by :func:`stoker.storage.http_stream.open_url`, which retries a failed
request (resuming where it stopped) as the retry policy says; when the network stays down
its :class:`~stoker.storage.RemoteReadError` is raised as it is, naming the URL: the
shard is not blamed for the network.
"""

from __future__ import annotations

import gzip
import tarfile
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from stoker._errors import DatasetError
from stoker.formats._compressed import EMPTY_GZIP, GZIP_DAMAGE, GZIP_ERRORS, GZIP_MAGIC, drain
from stoker.storage.fetch import RemoteReadError, RetryPolicy
from stoker.storage.http_stream import open_url

__all__ = ["BadSample", "check_shard", "is_url", "read_samples"]

_URL_SCHEMES = ("http://", "https://", "file://")
_MEMBER_KINDS = {
    tarfile.SYMTYPE: "a symbolic link",
    tarfile.LNKTYPE: "a hard link",
    tarfile.CHRTYPE: "a character device",
    tarfile.BLKTYPE: "a block device",
    tarfile.FIFOTYPE: "a FIFO",
}


@dataclass(frozen=True, slots=True)
class BadSample:
    """A sample of a shard that cannot be delivered as it is stored, and why."""

    url: str
    key: str
    problem: str

    def error(self) -> DatasetError:
        msg = (
            f"tar shard {self.url!r}, sample {self.key!r}: {self.problem}. Fix the shard, or "
            "pass on_error='skip' to skip such samples."
        )
        return DatasetError(msg)


class _CheckedTarInfo(tarfile.TarInfo):
    """Remembers why ``tarfile`` stopped, so a shard that simply stops is caught.

    ``tarfile`` ends an archive without complaint at a missing, truncated or garbled
    header after the first; only a zero block is a proper end.
    """

    @classmethod
    def fromtarfile(cls, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        try:
            return super().fromtarfile(tarfile_)
        except tarfile.HeaderError as exc:
            tarfile_._stoker_stop = exc  # type: ignore[attr-defined]
            raise


def split_name(name: str) -> tuple[str, str] | None:
    """``(key, extension)`` of a member name (extension lower-cased, as webdataset does),
    or None for a name to ignore."""
    folder, _, base = name.rpartition("/")
    key, dot, ext = base.partition(".")
    if not dot or not key or not ext:  # no extension, or a hidden file such as ._000.jpg
        return None
    return (f"{folder}/{key}" if folder else key), ext.lower()


def is_url(spec: str) -> bool:
    return spec.startswith(_URL_SCHEMES)


def _open_stream(url: str, retry: RetryPolicy | None) -> BinaryIO:
    if url.startswith("file://"):
        return open(urllib.request.url2pathname(urllib.parse.urlparse(url).path), "rb")
    if is_url(url):
        return open_url(url, retry or RetryPolicy())
    return open(url, "rb")


def _payload(stream: BinaryIO) -> tuple[BinaryIO, bool]:
    """The tar data of a shard's stream (gunzipped by ``gzip``, which checks the trailer)."""
    head = stream.peek(2)[:2] if hasattr(stream, "peek") else b""
    if head == GZIP_MAGIC:
        return gzip.GzipFile(fileobj=stream, mode="rb"), True  # type: ignore[return-value]
    return stream, False


def _corrupt(url: str, exc: BaseException, when: str) -> DatasetError:
    detail = str(exc) or (EMPTY_GZIP if isinstance(exc, EOFError) else "")
    if isinstance(exc, (*GZIP_DAMAGE, tarfile.TarError)):
        what = "is truncated or corrupt"
    else:
        what, when = "cannot be read", ""  # a missing file, a failed download, ...
    msg = (
        f"tar shard {url!r} {what}: {type(exc).__name__}: {detail}. {when}"
        "Rewrite or remove the shard, or pass on_error='skip' to skip what is left of it."
    )
    return DatasetError(msg)


def check_shard(url: str, source: str | None = None, retry: RetryPolicy | None = None) -> None:
    """Reads a gzipped shard in full to check its CRC-32 and length (plain tar: nothing to do).

    ``source`` is where its bytes are (a downloaded copy), when not at ``url`` itself;
    ``retry``: how a streamed ``http(s)://`` shard is requested."""
    try:
        with _open_stream(source or url, retry) as stream:
            payload, compressed = _payload(stream)
            if compressed:
                drain(payload)
    except RemoteReadError:
        raise  # the network, not the shard
    except (*GZIP_ERRORS, tarfile.TarError) as exc:
        when = "It was checked before any of its samples was delivered (verify='open'). "
        raise _corrupt(url, exc, when) from exc


def read_samples(
    url: str,
    *,
    max_member_bytes: int | None,
    source: str | None = None,
    retry: RetryPolicy | None = None,
) -> Iterator[dict[str, Any] | BadSample]:
    """The samples of one shard, as bytes, in tar order, or BadSample; raises DatasetError if
    the shard itself is bad, RemoteReadError if the network failed. ``source``: where its
    bytes are, when not at ``url`` itself; ``retry``: how a streamed ``http(s)://`` shard is
    requested."""
    stream = None
    compressed = False
    try:
        stream = _open_stream(source or url, retry)
        payload, compressed = _payload(stream)
        with tarfile.open(
            fileobj=payload, mode="r|" if compressed else "r|*", tarinfo=_CheckedTarInfo
        ) as archive:
            key: str | None = None
            sample: dict[str, Any] = {}
            problems: list[str] = []
            for member in archive:
                split = split_name(member.name)
                if split is None or member.isdir():
                    continue
                if split[0] != key:
                    if key is not None:
                        yield BadSample(url, key, "; ".join(problems)) if problems else sample
                    key = split[0]
                    sample, problems = {"__key__": key, "__url__": url}, []
                problem = _member_problem(member, split[1], sample, max_member_bytes)
                if problem is not None:
                    problems.append(problem)
                    continue
                extracted = archive.extractfile(member)
                if extracted is None:
                    raise AssertionError(
                        f"tarfile returned no data for the file member {member.name!r}"
                    )
                sample[split[1]] = extracted.read()
            _check_end(archive)
            # A compressed stream's checksums (gzip's trailer, bzip2's and xz's last checks)
            # follow the tar's end marker and padding: read to the end to check them.
            drain(archive.fileobj)  # type: ignore[arg-type]
            if key is not None:
                yield BadSample(url, key, "; ".join(problems)) if problems else sample
    except RemoteReadError:
        raise  # the network, not the shard
    except (*GZIP_ERRORS, tarfile.TarError) as exc:
        when = (
            "The samples read from it before the damage was found may be damaged too (pass "
            "verify='open' to check each gzipped shard in full before reading it). "
            if compressed
            else ""
        )
        raise _corrupt(url, exc, when) from exc
    finally:
        if stream is not None:
            stream.close()


def _member_problem(
    member: tarfile.TarInfo, ext: str, sample: dict[str, Any], max_member_bytes: int | None
) -> str | None:
    """Why a member's data cannot go into its sample, or None."""
    if not member.isfile():
        kind = _MEMBER_KINDS.get(member.type, f"a member of tar type {member.type!r}")
        target = f" to {member.linkname!r}" if member.issym() or member.islnk() else ""
        return f"{member.name!r} is {kind}{target}, not a file: only regular files hold sample data"
    if max_member_bytes is not None and member.size > max_member_bytes:
        return (
            f"{member.name!r} holds {member.size:,} bytes (once decompressed), more than "
            f"max_member_bytes={max_member_bytes:,}, so it was not read; pass a larger "
            "max_member_bytes (or None) if it is genuine"
        )
    if ext in sample:
        return f"{member.name!r} appears twice; every file of a sample needs its own extension"
    return None


def _check_end(archive: tarfile.TarFile) -> None:
    stop = getattr(archive, "_stoker_stop", None)
    if not isinstance(stop, tarfile.EOFHeaderError):
        detail = (
            f"{type(stop).__name__}: {stop}" if stop is not None else "no end-of-archive marker"
        )
        raise tarfile.ReadError(f"the archive stops without its end marker ({detail})")
