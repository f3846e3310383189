"""Downloading one object, with retries and exponential backoff on transient errors.

A transient error is one that trying again can cure: a refused, reset or timed-out
connection, an HTTP 5xx answer, throttling (429, ``SlowDown``) or a download that came up
short. Anything else (a missing object, a refused permission) fails at once. After the
last attempt :class:`RemoteReadError` is raised naming the URL; the readers hand it to
their ``on_error`` policy like any other unreadable file.

A :class:`RetryPolicy` counts requests: ``attempts`` is the number of requests the server
sees for one object (the clients' own retries are turned off, see
:mod:`stoker.storage.remote`), and each request waits at most ``connect_timeout_s`` for
its connection and ``read_timeout_s`` for each answer and each piece of its body.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from stoker._errors import DatasetError
from stoker._printable import printable
from stoker._validate import check_int, check_seconds, is_number

__all__ = [
    "RemoteReadError",
    "RetryPolicy",
    "download",
    "failure",
    "is_timeout",
    "is_transient",
    "retried",
]

T = TypeVar("T")

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
_TIMEOUT_NAMES = frozenset(
    {
        "ReadTimeoutError",  # botocore
        "ConnectTimeoutError",
        "ServerTimeoutError",  # aiohttp
        "ConnectionTimeoutError",
        "SocketTimeoutError",
        "FSTimeoutError",  # fsspec
    }
)


class RemoteReadError(DatasetError, OSError):
    """An object could not be downloaded (after its retries); the message names its URL.

    ``network`` is True when every attempt failed with a transient error: the network or
    the server failed, which says nothing about the object's data.
    """

    def __init__(self, message: str, url: str = "", *, network: bool = False) -> None:
        super().__init__(message)
        self.url = url
        self.network = network


class ShortDownload(OSError):
    """A download ended with fewer (or more) bytes than the object's listed size."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently an object is requested.

    Args:
        attempts: requests in all for one object (1: no retry). It is the number of
            requests the server sees: the storage clients do not retry underneath.
        base_delay_s: the wait after the first failure; it doubles after each one ...
        max_delay_s: ... up to this.
        connect_timeout_s: how long a request waits for its connection.
        read_timeout_s: how long a request waits for the answer, and then for each piece of
            its body; a server silent that long fails the attempt (a slow but steady
            download does not). ``float("inf")``: wait for ever.

    A dead server therefore costs at most ``attempts`` requests and the waits between them:
    with the defaults (5 attempts; waits of 0.2, 0.4, 0.8 and 1.6 s) about 3 s for one that
    answers 503 at once, at most 5 x 30 + 3 s for one that never answers, and at most
    5 x 10 + 3 s for one that cannot be reached.

    Example:
        >>> [RetryPolicy(attempts=4, base_delay_s=0.5).delay(n) for n in (1, 2, 3)]
        [0.5, 1.0, 2.0]
    """

    attempts: int = 5
    base_delay_s: float = 0.2
    max_delay_s: float = 10.0
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "attempts", check_int("attempts", self.attempts, minimum=1))
        for name in ("base_delay_s", "max_delay_s"):
            object.__setattr__(self, name, check_seconds(name, getattr(self, name)))
        for name in ("connect_timeout_s", "read_timeout_s"):
            value = getattr(self, name)
            if not is_number(value) or value <= 0:
                msg = f"{name} must be a positive number of seconds, got {value!r}"
                raise ValueError(msg)
            object.__setattr__(self, name, float(value))

    def delay(self, failures: int) -> float:
        """Seconds to wait after the ``failures``-th failure."""
        return float(min(self.max_delay_s, self.base_delay_s * 2 ** (failures - 1)))

    def timeout(self, name: str) -> float | None:
        """``connect_timeout_s`` or ``read_timeout_s`` as a client takes it (None: none).

        Example:
            >>> RetryPolicy(read_timeout_s=float("inf")).timeout("read_timeout_s") is None
            True
        """
        value = float(getattr(self, name))
        return None if math.isinf(value) else value

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


def is_timeout(exc: BaseException) -> bool:
    """Whether ``exc`` is, or was caused by, a request that ran out of time."""
    return any(
        isinstance(cause, TimeoutError)
        or any(kind.__name__ in _TIMEOUT_NAMES for kind in type(cause).__mro__)
        for cause in _causes(exc)
    )


def failure(
    verb: str, url: str, attempt: int, exc: BaseException, policy: RetryPolicy, detail: str = ""
) -> RemoteReadError:
    """The error that ends the requests for ``url`` at ``attempt`` with ``exc``: what could
    not be done (``verb``: "download", "read", "list"), the attempts, the error, the policy's
    timeouts when the last request ran out of time, ``detail`` (a sentence or ""), and, for
    a transient error, that the network failed, not the data."""
    transient = is_transient(exc)
    tries = f"after {attempt} attempts" if attempt > 1 else "at the first attempt"
    why = "" if transient else " (not a transient error, so it was not retried)"
    text = str(exc).strip().rstrip(".")
    error = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    if is_timeout(exc):
        error += (
            f" (no answer within the retry policy's connect_timeout_s={policy.connect_timeout_s:g}"
            f" or read_timeout_s={policy.read_timeout_s:g})"
        )
    msg = f"cannot {verb} {printable(url)} {tries}{why}: {error}."
    if detail:
        msg += f" {detail}"
    if transient:
        msg += (
            " The network or the server failed, not the data: try again later, or give "
            "retries= a RetryPolicy with more attempts or longer timeouts."
        )
    return RemoteReadError(msg, url, network=transient)


def retried(
    call: Callable[[], T],
    *,
    url: str,
    verb: str,
    policy: RetryPolicy,
    sleep: Callable[[float], None] = time.sleep,
    after_failure: Callable[[], None] | None = None,
    passed_on: tuple[type[BaseException], ...] = (),
) -> T:
    """``call()``, made up to ``policy.attempts`` times while it fails with a transient error,
    waiting ``policy.delay`` between; ``after_failure`` runs after each failure.

    Raises:
        RemoteReadError: from :func:`failure`, once an error is not transient or the last
            attempt failed; an error of a ``passed_on`` type that is not transient is raised
            as it is (the caller words it).
    """
    for attempt in range(1, policy.attempts + 1):
        try:
            return call()
        except Exception as exc:
            if after_failure is not None:
                after_failure()
            transient = is_transient(exc)
            if not transient and isinstance(exc, passed_on):
                raise
            if not transient or attempt == policy.attempts:
                raise failure(verb, url, attempt, exc, policy) from exc
            sleep(policy.delay(attempt))
    raise AssertionError(f"a retry policy of {policy.attempts} attempts made none")


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
    Each attempt is one request and writes over ``dest`` (the file stays, so nobody can plant
    a link at its name between attempts); it is removed when every attempt failed.

    Raises:
        RemoteReadError: naming the URL, the attempts and the last error.
    """
    path = fs._strip_protocol(url)

    def get() -> None:
        fs.get_file(path, dest)
        got = os.path.getsize(dest)
        if size is not None and got != size:
            msg = f"{got:,} bytes arrived but the object is listed as {size:,} bytes"
            raise ShortDownload(msg)

    try:
        retried(get, url=url, verb="download", policy=policy, sleep=sleep)
    except BaseException:
        _remove(dest)
        raise


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)
