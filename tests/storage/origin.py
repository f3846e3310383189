"""A plain HTTP server on 127.0.0.1 serving the files of a folder, with or without ranges.

With ``ranges=True`` it answers ``Range: bytes=START-`` (and ``START-END``) with ``206
Partial Content`` and a ``Content-Range``, and says ``Accept-Ranges: bytes``, as object
stores and most web servers do; with ``ranges=False`` it ignores the header and sends the
whole file, as a server without range support does. Every answer carries an ``ETag`` and
a ``Content-Length``; with ``changing=True`` the ``ETag`` changes at every answer, as if
the file were replaced between two requests. Put a
:class:`~storage.fault_proxy.FaultProxy` in front of it to inject failures.
"""

from __future__ import annotations

import hashlib
import http.server
import itertools
import os
import re
import threading
from typing import Any

__all__ = ["Origin"]

_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


class Origin:
    """Serves ``folder`` at ``http://127.0.0.1:<port>/NAME``."""

    def __init__(self, folder: str, *, ranges: bool = True, changing: bool = False) -> None:
        self.folder = folder
        self.ranges = ranges
        self.changing = changing
        self._answers = itertools.count()
        origin = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                origin._answer(self, body=True)

            def do_HEAD(self) -> None:
                origin._answer(self, body=False)

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="http-origin", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def _answer(self, handler: http.server.BaseHTTPRequestHandler, *, body: bool) -> None:
        path = os.path.join(self.folder, handler.path.split("?")[0].lstrip("/"))
        if not os.path.isfile(path):
            handler.send_error(404, "no such file")
            return
        with open(path, "rb") as f:
            data = f.read()
        version = f"-{next(self._answers)}" if self.changing else ""
        tag = '"' + hashlib.sha1(data).hexdigest() + version + '"'
        wanted = _RANGE.match(handler.headers.get("Range") or "")
        status, first, last = 200, 0, len(data) - 1
        if self.ranges and wanted is not None:
            first = int(wanted.group(1))
            last = min(last, int(wanted.group(2))) if wanted.group(2) else last
            if first >= len(data):
                handler.send_response(416, "Range Not Satisfiable")
                handler.send_header("Content-Range", f"bytes */{len(data)}")
                handler.send_header("Content-Length", "0")
                handler.end_headers()
                return
            status = 206
        part = data[first : last + 1]
        handler.send_response(status)
        handler.send_header("Content-Type", "application/x-tar")
        handler.send_header("Content-Length", str(len(part)))
        handler.send_header("ETag", tag)
        if self.ranges:
            handler.send_header("Accept-Ranges", "bytes")
        if status == 206:
            handler.send_header("Content-Range", f"bytes {first}-{last}/{len(data)}")
        handler.end_headers()
        if body:
            handler.wfile.write(part)
