"""A real S3-compatible server (moto) on 127.0.0.1, behind a proxy that injects faults.

The server and the proxy live for the session (they are started before any test's leak
baseline); each test gets a fresh bucket and a clean proxy, and its connections are
closed when it ends. :func:`http_origin` serves a test's folder over plain HTTP, behind a
proxy of its own, for as long as the test runs. Credentials are dummies set here only,
the instance metadata service is switched off, and every endpoint is asserted to be a
loopback address, so nothing reaches a real cloud.
"""

from __future__ import annotations

import gc
import itertools
import os
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("s3fs", reason="needs the storage extra (pip install 'stoker[storage]')")
moto_server = pytest.importorskip("moto.server", reason="needs moto[server] (the test extra)")

from storage.fault_proxy import FaultProxy, free_port
from storage.origin import Origin

_DUMMY_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}
_buckets = itertools.count()


def assert_loopback(endpoint: str) -> None:
    host = urllib.parse.urlparse(endpoint).hostname
    assert host in ("127.0.0.1", "localhost", "::1"), f"{endpoint} is not a loopback address"


@pytest.fixture(scope="session")
def s3_server() -> Iterator[dict[str, Any]]:
    """moto's S3 server and the fault proxy in front of it, for the whole session."""
    saved = {key: os.environ.get(key) for key in _DUMMY_ENV}
    os.environ.update(_DUMMY_ENV)
    import fsspec.asyn

    fsspec.asyn.get_loop()  # fsspec's event loop thread lives for the session
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    proxy = FaultProxy(port)
    try:
        assert_loopback(f"http://{host}:{port}")
        assert_loopback(proxy.endpoint)
        yield {"direct": f"http://{host}:{port}", "proxy": proxy}
    finally:
        proxy.close()
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def options_for(endpoint: str, **extra: Any) -> dict[str, Any]:
    """storage_options that reach ``endpoint`` only, with dummy credentials, as a user writes
    them: stoker itself turns off the retries below its own (so the tests see every failure
    the proxy injects)."""
    assert_loopback(endpoint)
    return {
        "endpoint_url": endpoint,
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"region_name": "us-east-1"},
        **extra,
    }


class S3:
    """One test's bucket: ``put`` files into it, ``url`` names them, ``options`` reach it."""

    def __init__(self, server: dict[str, Any]) -> None:
        import s3fs

        self.proxy: FaultProxy = server["proxy"]
        self.bucket = f"bucket-{os.getpid()}-{next(_buckets)}"
        self.options = options_for(self.proxy.endpoint)
        self.direct = options_for(server["direct"])
        self.fs = s3fs.S3FileSystem(skip_instance_cache=True, **_plain(self.direct))
        self.fs.call_s3("create_bucket", Bucket=self.bucket)

    def url(self, name: str = "") -> str:
        return f"s3://{self.bucket}/{name}"

    def put(self, name: str, data: bytes) -> str:
        self.fs.pipe_file(f"{self.bucket}/{name}", data)
        return self.url(name)

    def put_folder(self, folder: str, prefix: str) -> str:
        for root, _, names in os.walk(folder):
            for name in names:
                path = os.path.join(root, name)
                rel = os.path.relpath(path, folder).replace(os.sep, "/")
                with open(path, "rb") as f:
                    self.put(f"{prefix}/{rel}", f.read())
        return self.url(prefix)


def _plain(options: dict[str, Any]) -> dict[str, Any]:
    options = dict(options)
    client = dict(options.pop("client_kwargs"))
    client["endpoint_url"] = options.pop("endpoint_url")
    options["client_kwargs"] = client
    return options


@pytest.fixture
def s3(s3_server: dict[str, Any]) -> Iterator[S3]:
    """A fresh bucket; the proxy is reset before and after, and connections are closed."""
    s3_server["proxy"].reset()
    store = S3(s3_server)
    try:
        yield store
    finally:
        s3_server["proxy"].reset()
        del store
        gc.collect()  # the file systems' finalizers close their connections


@pytest.fixture
def http_origin() -> Iterator[Any]:
    """``serve(folder, ranges=True, changing=False)``: the folder at a plain HTTP server
    behind a fault proxy; returns ``(base URL through the proxy, proxy, origin)``. The
    servers are stopped, and the proxy's stalls released, when the test ends."""
    started: list[tuple[Origin, FaultProxy]] = []

    def serve(
        folder: str, *, ranges: bool = True, changing: bool = False
    ) -> tuple[str, FaultProxy, Origin]:
        origin = Origin(folder, ranges=ranges, changing=changing)
        proxy = FaultProxy(origin.port)
        started.append((origin, proxy))
        assert_loopback(proxy.endpoint)
        return proxy.endpoint, proxy, origin

    try:
        yield serve
    finally:
        for origin, proxy in started:
            proxy.reset()
            proxy.close()
            origin.close()
        gc.collect()
