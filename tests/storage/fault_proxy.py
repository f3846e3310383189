"""An HTTP proxy on 127.0.0.1 in front of a local server that adds latency and failures.

Every request is forwarded to the upstream server (the S3 server, or a plain HTTP one)
after ``delay_s``; :meth:`FaultProxy.fail` queues failures for requests whose path contains
a given text, a number of times or for ever:

- ``"503"``: an HTTP 503 ``ServiceUnavailable`` answer;
- ``"reset"``: the connection reset, with no answer;
- ``"truncate"``: the real answer's headers and the first half of its body, then the
  connection closed (shorter than its ``Content-Length``);
- ``"reset-mid-body"``: the headers and half the body, then the connection reset;
- ``"stall"``: no answer at all, the connection held open;
- ``"stall-mid-body"``: the headers and half the body, then nothing more.

A stall lasts ``stall_s`` or until :meth:`FaultProxy.reset` (each test's end), so no
handler outlives its test. Requests are counted by method and path, and their arrival
times and ``Range`` headers kept, so a test can tell what was fetched, which bytes, and when.
"""

from __future__ import annotations

import collections
import contextlib
import http.client
import http.server
import socket
import struct
import threading
import time
from typing import Any

__all__ = ["FaultProxy", "free_port"]

_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade"}
_ACTIONS = frozenset({"503", "reset", "truncate", "reset-mid-body", "stall", "stall-mid-body"})
_UNAVAILABLE = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>ServiceUnavailable</Code>'
    b"<Message>The service is unavailable; try again.</Message></Error>"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class FaultProxy:
    """Forwards HTTP requests from ``127.0.0.1:<port>`` to ``upstream_port``, with faults."""

    def __init__(self, upstream_port: int, delay_s: float = 0.0, stall_s: float = 60.0) -> None:
        self.upstream_port = upstream_port
        self.delay_s = delay_s
        self.stall_s = stall_s
        self.requests: collections.Counter[tuple[str, str]] = collections.Counter()
        self.arrivals: list[tuple[float, str, str]] = []  # (time.monotonic(), method, path)
        self._ranges: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        self._released = threading.Event()  # ends the stalls of the test that queued them
        self._faults: list[list[Any]] = []  # [path text, action, remaining (None: for ever)]
        self._lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _any(self) -> None:
                proxy._handle(self)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _any

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="fault-proxy", daemon=True
        )
        self._thread.start()

    def fail(self, path_text: str, action: str = "503", times: int | None = 1) -> None:
        """The next ``times`` requests whose path holds ``path_text`` fail by ``action``
        (see the module docs for the actions); ``times=None``: every one of them."""
        if action not in _ACTIONS:
            raise ValueError(f"unknown fault {action!r}; one of {sorted(_ACTIONS)}")
        with self._lock:
            self._faults.append([path_text, action, times])

    def reset(self) -> None:
        with self._lock:
            self._faults.clear()
            self.requests.clear()
            self.arrivals.clear()
            self._ranges.clear()
            released, self._released = self._released, threading.Event()
        released.set()
        self.delay_s = 0.0

    def count(self, path_text: str, method: str = "GET") -> int:
        with self._lock:
            return sum(n for (m, p), n in self.requests.items() if m == method and path_text in p)

    def times(self, path_text: str, method: str = "GET") -> list[float]:
        """When the requests whose path holds ``path_text`` arrived (``time.monotonic()``)."""
        with self._lock:
            return [t for t, m, p in self.arrivals if m == method and path_text in p]

    def ranges(self, path_text: str, method: str = "GET") -> list[str | None]:
        """The ``Range`` header of each request whose path holds ``path_text`` (None: none)."""
        with self._lock:
            return [r for m, p, r in self._ranges if m == method and path_text in p]

    def close(self) -> None:
        self._released.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def _fault_for(self, path: str) -> str | None:
        with self._lock:
            for fault in self._faults:
                if fault[0] in path and (fault[2] is None or fault[2] > 0):
                    if fault[2] is not None:
                        fault[2] -= 1
                    return str(fault[1])
        return None

    def _handle(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        method, path = handler.command, handler.path
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else None
        with self._lock:
            self.requests[(method, path.split("?")[0])] += 1
            self.arrivals.append((time.monotonic(), method, path.split("?")[0]))
            self._ranges.append((method, path.split("?")[0], handler.headers.get("Range")))
            released = self._released
        if self.delay_s:
            time.sleep(self.delay_s)
        action = self._fault_for(path)
        if action == "reset":
            _reset(handler)
            return
        if action == "stall":
            released.wait(self.stall_s)
            handler.close_connection = True
            return
        if action == "503":
            handler.send_response(503, "Service Unavailable")
            handler.send_header("Content-Type", "application/xml")
            handler.send_header("Content-Length", str(len(_UNAVAILABLE)))
            handler.end_headers()
            if method != "HEAD":
                handler.wfile.write(_UNAVAILABLE)
            return
        upstream = http.client.HTTPConnection("127.0.0.1", self.upstream_port, timeout=60)
        try:
            headers = {k: v for k, v in handler.headers.items() if k.lower() not in _HOP_HEADERS}
            upstream.request(method, path, body=body, headers=headers)
            response = upstream.getresponse()
            data = response.read()
            handler.send_response(response.status, response.reason)
            for key, value in response.getheaders():
                if key.lower() not in _HOP_HEADERS and key.lower() != "content-length":
                    handler.send_header(key, value)
            length = response.getheader("Content-Length") if method == "HEAD" else None
            handler.send_header("Content-Length", length or str(len(data)))
            handler.end_headers()
            if method != "HEAD":
                if action in ("truncate", "reset-mid-body", "stall-mid-body"):
                    handler.close_connection = True
                    with contextlib.suppress(OSError):  # the client may be gone (killed)
                        handler.wfile.write(data[: len(data) // 2])  # the length announced
                        handler.wfile.flush()
                        if action == "stall-mid-body":
                            released.wait(self.stall_s)
                        if action == "reset-mid-body":
                            _reset(handler)
                        else:
                            handler.connection.shutdown(socket.SHUT_RDWR)
                    return
                handler.wfile.write(data)
        finally:
            upstream.close()


def _reset(handler: http.server.BaseHTTPRequestHandler) -> None:
    """Closes the handler's connection with a TCP reset (RST), not a clean close."""
    handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    handler.close_connection = True
    handler.connection.close()
