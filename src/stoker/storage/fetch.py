"""Downloading one object, with retries and exponential backoff on transient errors.

A transient error is one that trying again can cure: a refused, reset or timed-out
connection, an HTTP 5xx answer, throttling (429, ``SlowDown``) or a download that came up
short. Anything else (a missing object, a refused permission) fails at once. After the
last attempt :class:`RemoteReadError` is raised naming the URL; the readers hand it to
their ``on_error`` policy like any other unreadable file.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stoker._errors import DatasetError
from stoker._validate import check_int, check_seconds

__all__ = ["RemoteReadError", "RetryPolicy", "download", "is_transient"]

_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "TooManyRequests",
        "RequestTimeout",
        "RequestTimeoutException",
        "ServiceUnavailable",
        "InternalError",
        "503",
        "500",
        "502",
        "504",
        "429",
    }
)
_TRANSIENT_NAMES = frozenset(
    {
        # botocore / aiobotocore
        "EndpointConnectionError",
        "ConnectionClosedError",
        "ReadTimeoutError",
        "ConnectTimeoutError",
        "ResponseStreamingError",
        "IncompleteReadError",
        # aiohttp
        "ClientConnectionError",
        "ClientOSError",
        "ServerDisconnectedError",
        "ClientPayloadError",
        "ServerTimeoutError",
        # http.client / urllib3
        "IncompleteRead",
        "RemoteDisconnected",
        "ProtocolError",
    }
)
_TRANSIENT_WORDS = (
    "503",
    "500 ",
    "502",
    "504",
    "429",
    "slowdown",
    "slow down",
    "throttl",
    "reset by peer",
    "connection reset",
    "service unavailable",
    "timed out",
)


class RemoteReadError(DatasetError, OSError):
    """An object could not be downloaded (after its retries); the message names its URL."""

    def __init__(self, message: str, url: str = "") -> None:
        super().__init__(message)
        self.url = url


class ShortDownload(OSError):
    """A download ended with fewer (or more) bytes than the object's listed size."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently a download is tried.

    Args:
        attempts: tries in all (1: no retry).
        base_delay_s: the wait after the first failure; it doubles after each one ...
        max_delay_s: ... up to this.

    Example:
        >>> [RetryPolicy(attempts=4, base_delay_s=0.5).delay(n) for n in (1, 2, 3)]
        [0.5, 1.0, 2.0]
    """

    attempts: int = 5
    base_delay_s: float = 0.2
    max_delay_s: float = 10.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "attempts", check_int("attempts", self.attempts, minimum=1))
        for name in ("base_delay_s", "max_delay_s"):
            object.__setattr__(self, name, check_seconds(name, getattr(self, name)))

    def delay(self, failures: int) -> float:
        """Seconds to wait after the ``failures``-th failure."""
        return float(min(self.max_delay_s, self.base_delay_s * 2 ** (failures - 1)))

    @classmethod
    def of(cls, retries: RetryPolicy | int) -> RetryPolicy:
        """``retries`` as a policy: an int is the number of attempts."""
        if isinstance(retries, RetryPolicy):
            return retries
        return cls(attempts=retries)


def _causes(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen and len(seen) < 8:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def _status(exc: BaseException) -> tuple[int | None, str]:
    """The HTTP status and error code an exception carries, where it carries them."""
    response: Any = getattr(exc, "response", None)
    if isinstance(response, dict):  # botocore ClientError
        meta = response.get("ResponseMetadata", {})
        return meta.get("HTTPStatusCode"), str(response.get("Error", {}).get("Code", ""))
    status = getattr(exc, "status", None) or getattr(exc, "code", None)
    return (status if isinstance(status, int) else None), ""


def is_transient(exc: BaseException) -> bool:
    """Whether trying again may cure ``exc`` (see the module docs)."""
    for cause in _causes(exc):
        if isinstance(cause, (FileNotFoundError, PermissionError, IsADirectoryError)):
            return False
        if isinstance(cause, (ConnectionError, TimeoutError, ShortDownload)):
            return True
        if any(kind.__name__ in _TRANSIENT_NAMES for kind in type(cause).__mro__):
            return True
        status, code = _status(cause)
        if status is not None and (status >= 500 or status == 429):
            return True
        if code in _TRANSIENT_CODES:
            return True
        text = str(cause).lower()
        if any(word in text for word in _TRANSIENT_WORDS):
            return True
    return False


def download(
    fs: Any,
    url: str,
    dest: str,
    *,
    size: int | None,
    policy: RetryPolicy,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Downloads ``url`` (``fs``'s path) to the new file ``dest``, trying as ``policy`` says.

    ``size`` (the listed size) is checked against what arrived; a short file is retried.
    Each attempt writes over ``dest`` (the file stays, so nobody can plant a link at its
    name between attempts); it is removed when every attempt failed.

    Raises:
        RemoteReadError: naming the URL, the attempts and the last error.
    """
    path = fs._strip_protocol(url)
    for attempt in range(1, policy.attempts + 1):
        try:
            fs.get_file(path, dest)
            got = os.path.getsize(dest)
            if size is not None and got != size:
                msg = f"{got:,} bytes arrived but the object is listed as {size:,} bytes"
                raise ShortDownload(msg)
            return
        except Exception as exc:
            transient = is_transient(exc)
            if not transient or attempt == policy.attempts:
                _remove(dest)
                tries = f"after {attempt} attempts" if attempt > 1 else "at the first attempt"
                why = "" if transient else " (not a transient error, so it was not retried)"
                msg = f"cannot download {url} {tries}{why}: {type(exc).__name__}: {exc}"
                raise RemoteReadError(msg, url) from exc
            sleep(policy.delay(attempt))


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)
