"""An ``http(s)://`` object read front to back, resumed after a network failure.

:func:`open_url` gives a readable binary stream of the object at a URL, fetched with
``urllib`` (redirects followed, proxies taken from the environment). A request that fails
with a transient error (:func:`~stoker.storage.fetch.is_transient`: a refused or reset
connection, an HTTP 5xx or 429 answer, a body cut short, nothing received for the policy's
``read_timeout_s``) is made again after the policy's backoff, up to ``attempts`` requests
for the object in all:

- when the server takes ranges (it answers ``Range: bytes=N-`` with ``206 Partial
  Content``), the next request asks for the bytes from the first one not yet read;
- otherwise the object is requested whole again and the bytes already read are passed
  over, so the reader above gets every byte once and in order, whatever happened below.

An object that changed between two requests (another ``ETag``, ``Last-Modified`` or size)
is not stitched together: :class:`~stoker.storage.fetch.RemoteReadError` says so. After
the last attempt it names the URL, the attempts, the bytes that had arrived and the last
error: the network failed, which says nothing about the object itself.
"""

from __future__ import annotations

import functools
import http.client
import io
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any, BinaryIO

from stoker._printable import printable
from stoker.storage.fetch import RemoteReadError, RetryPolicy, ShortDownload, failure, is_transient

__all__ = ["open_url"]

_BUFFER_BYTES = 1 << 16
_PASS_OVER_BYTES = 1 << 20  # read at a time when passing over bytes read before
_SHORT = "the server closed the connection before the end of its answer"
_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$")


def open_url(
    url: str, policy: RetryPolicy, sleep: Callable[[float], None] = time.sleep
) -> BinaryIO:
    """The object at ``url`` as a buffered binary stream that retries as ``policy`` says.

    Raises (from its reads):
        RemoteReadError: naming the URL, when the requests failed (see the module docs).
    """
    raw = _ResumingStream(url, policy, sleep)
    return io.BufferedReader(raw, buffer_size=_BUFFER_BYTES)  # type: ignore[return-value]


class _ResumingStream(io.RawIOBase):
    """The object's bytes in order, over as many requests as the policy allows."""

    def __init__(self, url: str, policy: RetryPolicy, sleep: Callable[[float], None]) -> None:
        super().__init__()
        self.url = url
        self._policy = policy
        self._sleep = sleep
        self._opener = _opener(policy.timeout("read_timeout_s"))
        self._response: http.client.HTTPResponse | None = None
        self._attempts = 0  # requests made
        self._delivered = 0  # bytes handed to the reader
        self._at = 0  # where the current answer's next byte is in the object
        self._size: int | None = None  # the object's size, when the server told
        self._identity: dict[str, str] = {}  # what the first answer said the object is
        self._ranges = True  # ask for the rest only, until the server ignores a Range

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while True:
            if self._response is None and self._size is not None and self._delivered >= self._size:
                return 0  # every byte arrived; the failure came after the last one
            try:
                response = self._response or self._request()
                while self._at < self._delivered:  # a whole answer: pass over what was read
                    passed = response.read(min(_PASS_OVER_BYTES, self._delivered - self._at))
                    if not passed:
                        raise ShortDownload(_SHORT)
                    self._at += len(passed)
                count = response.readinto(buffer)
                if count == 0 and len(buffer) and self._delivered < (self._size or 0):
                    raise ShortDownload(_SHORT)
                self._delivered += count
                self._at += count
                return count
            except RemoteReadError:
                self._drop()
                raise
            except Exception as exc:
                self._drop()
                if isinstance(exc, urllib.error.HTTPError):
                    exc.close()  # its answer holds the connection
                if not is_transient(exc) or self._attempts >= self._policy.attempts:
                    raise self._failure(exc) from exc
                self._sleep(self._policy.delay(self._attempts))

    def close(self) -> None:
        self._drop()
        super().close()

    # -- requests ----------------------------------------------------------------------
    def _request(self) -> http.client.HTTPResponse:
        self._attempts += 1
        request = urllib.request.Request(self.url)
        resuming = self._delivered > 0
        if resuming and self._ranges:
            request.add_header("Range", f"bytes={self._delivered}-")
        timeout = self._policy.timeout("connect_timeout_s")
        response: http.client.HTTPResponse = self._opener.open(request, timeout=timeout)
        self._response = response
        start, size = 0, _int(response.headers.get("Content-Length"))
        if response.status == 206:
            start, size = self._content_range(response)
        elif resuming:
            self._ranges = False  # the whole object again: pass over what was read
        self._check_same(response, size)
        self._at = start
        return response

    def _content_range(self, response: http.client.HTTPResponse) -> tuple[int, int | None]:
        text = response.headers.get("Content-Range") or ""
        match = _CONTENT_RANGE.match(text)
        if match is None or int(match.group(1)) != self._delivered:
            msg = (
                f"cannot read {printable(self.url)}: asked for its bytes from {self._delivered:,} "
                f"on, the server answered with Content-Range {text!r}"
            )
            raise RemoteReadError(msg, self.url)
        total = match.group(3)
        return int(match.group(1)), None if total == "*" else int(total)

    def _check_same(self, response: http.client.HTTPResponse, size: int | None) -> None:
        """Refuses to go on when the object changed since the first answer."""
        seen = {
            "ETag": response.headers.get("ETag"),
            "Last-Modified": response.headers.get("Last-Modified"),
            "size": None if size is None else f"{size:,} bytes",
        }
        if not self._identity:
            self._identity = {k: v for k, v in seen.items() if v is not None}
            self._size = size
            return
        for name, before in self._identity.items():
            now = seen[name]
            if now is not None and now != before:
                msg = (
                    f"cannot read {printable(self.url)}: it changed while it was read (its {name} "
                    f"was {before}, and is {now} after {self._delivered:,} bytes had arrived); "
                    "read it again once it is no longer being replaced"
                )
                raise RemoteReadError(msg, self.url)

    def _drop(self) -> None:
        response, self._response = self._response, None
        if response is not None:
            response.close()

    def _failure(self, exc: BaseException) -> RemoteReadError:
        size = f" of {self._size:,}" if self._size is not None else ""
        detail = f"{self._delivered:,}{size} bytes had arrived." if is_transient(exc) else ""
        return failure("read", self.url, self._attempts, exc, self._policy, detail)


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.strip().isdigit() else None


# -- connections with a connect and a read timeout -------------------------------------
def _timed(base: type[http.client.HTTPConnection]) -> Any:
    class Timed(base):  # type: ignore[valid-type, misc]
        """Connects within ``timeout`` (the connect timeout), then reads within ``read_s``."""

        def __init__(self, *args: Any, read_s: float | None, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._read_s = read_s

        def connect(self) -> None:
            super().connect()  # TLS too, for HTTPS, under the connect timeout
            self.sock.settimeout(self._read_s)

    return Timed


_TimedHTTP = _timed(http.client.HTTPConnection)
_TimedHTTPS = _timed(http.client.HTTPSConnection)


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, read_s: float | None) -> None:
        super().__init__()
        self._read_s = read_s

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(functools.partial(_TimedHTTP, read_s=self._read_s), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, read_s: float | None) -> None:
        super().__init__()
        self._read_s = read_s

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        connection = functools.partial(_TimedHTTPS, read_s=self._read_s)
        return self.do_open(connection, req, context=self._context)  # type: ignore[attr-defined]


def _opener(read_s: float | None) -> urllib.request.OpenerDirector:
    """urllib's opener (redirects, proxies, ...) whose connections time out as asked."""
    return urllib.request.build_opener(_HTTPHandler(read_s), _HTTPSHandler(read_s))
