"""``ApiClient``: the one request path of every typed pobo client (:class:`CuratorClient`, ``ModelerClient``,
``FederationClient``): the connection pool, timeouts, retries (tenacity), TLS ``verify``, error mapping and
the decoding of answers. A client subclass only adds typed methods over its endpoint table."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any, ClassVar, Self, TypeVar

import httpx
from tenacity import (
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential_jitter,
)
from tenacity.stop import stop_base

from shared.protocol.client.base import (
    Parts,
    _Call,
    _check_status,
    _decode,
    _files,
    _RangedBody,
    _should_retry,
    _transport_errors,
    _verify,
)
from shared.protocol.client.endpoints import Endpoint
from shared.protocol.client.errors import CURATOR_ERRORS, RETRY_STATUSES, ErrorFamily, _error_from

R = TypeVar("R")


class ApiClient:
    """Blocking client of one pobo API. Thread-safe; use as a context manager or call :meth:`close`.

    ``token`` is sent as ``Authorization: Bearer``; ``transport`` lets tests plug in an
    ``httpx.MockTransport``. A call that is safe to repeat (its endpoint says so) is retried on a transport
    failure or an answer in ``retry_statuses`` — ``retries`` more times, or for up to ``retry_seconds`` if
    that is given — with exponential backoff (``backoff`` .. ``max_backoff`` s) and jitter; any other call
    only when its connection could not be opened. ``errors`` (a class attribute) is what the client raises.
    """

    errors: ClassVar[ErrorFamily] = CURATOR_ERRORS

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        retries: int = 4,
        backoff: float = 0.2,
        max_backoff: float = 5.0,
        transport: httpx.BaseTransport | None = None,
        verify: ssl.SSLContext | str | Path | bool = True,
        retry_seconds: float | None = None,
        retry_statuses: frozenset[int] = RETRY_STATUSES,
    ) -> None:
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        self.base_url = base_url.rstrip("/")
        self._token = token
        self.timeout = float(timeout)
        self.retries = int(retries)
        self.backoff = float(backoff)
        self.max_backoff = float(max_backoff)
        self.retry_seconds = None if retry_seconds is None else float(retry_seconds)
        self.retry_statuses = frozenset(retry_statuses)
        headers = {"User-Agent": "pobo-client/0.1", "Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=self._timeout(),
            transport=transport,
            verify=_verify(verify),
        )

    def __repr__(self) -> str:  # never shows the token
        return f"{type(self).__name__}({self.base_url!r})"

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the one request path --------------------------------------------------------------------------
    def _timeout(self, extra: float = 0.0) -> httpx.Timeout:
        return httpx.Timeout(self.timeout + extra, connect=min(self.timeout, 10.0))

    def _stop(self) -> stop_base:
        if self.retry_seconds is not None:
            return stop_after_delay(self.retry_seconds)
        return stop_after_attempt(self.retries + 1)

    def _send(
        self, call: _Call, into: _RangedBody | None = None, *, attempts: int | None = None
    ) -> tuple[httpx.Response, str]:
        """Make ``call``, retried (tenacity: exponential backoff with jitter) while :func:`_should_retry`
        allows (``attempts``: at most this many in all, instead of the client's ``retries``); the last error
        is re-raised as is. Returns the answer with its body read — or, with ``into`` and a 2xx answer,
        streamed into that file and its sha256 (every attempt asks ``into`` for its headers, so one after a
        dropped connection continues the file with a range request)."""
        retrying = Retrying(
            retry=retry_if_exception(_should_retry(call, self.retry_statuses)),
            stop=self._stop() if attempts is None else stop_after_attempt(max(1, attempts)),
            wait=wait_exponential_jitter(multiplier=self.backoff, max=self.max_backoff, jitter=self.backoff),
            reraise=True,
        )
        for attempt in retrying:
            with attempt:
                digest = ""
                headers = call.parts.headers if into is None else call.parts.headers | into.headers()
                with (
                    _transport_errors(call, self.errors),
                    _files(call) as files,
                    self._http.stream(
                        call.method,
                        call.path,
                        params=call.parts.params,
                        json=call.parts.json,
                        data=call.parts.data,
                        files=files,
                        headers=headers,
                        timeout=self._timeout(call.parts.extra_timeout),
                    ) as resp,
                ):
                    if into is not None and 200 <= resp.status_code < 300:
                        into.write(resp, self.errors)
                        digest = into.hexdigest()
                    else:
                        resp.read()
                if resp.status_code in self.retry_statuses:
                    raise _error_from(resp, self.errors)
        return resp, digest

    def _call(self, endpoint: Endpoint[R], **args: Any) -> R:
        """Look the operation up in the table, send it, and parse the answer as the endpoint says."""
        resp, _ = self._send(endpoint.bind(**args))
        if endpoint.accept == "application/json":
            return endpoint.parse(_decode(resp, self.errors))
        _check_status(resp, self.errors)
        return endpoint.parse(resp.content)

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """Escape hatch for endpoints without a method here: decoded JSON, same retries and errors."""
        idempotent = method.upper() == "GET" or "Idempotency-Key" in kwargs.get("headers", {})
        resp, _ = self._send(_Call(method.upper(), path, Parts(**kwargs), idempotent))
        return _decode(resp, self.errors)
