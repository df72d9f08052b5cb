"""What ``pobo agent run`` checks before it joins a federation, and how it words a failure: one line that
says what went wrong and what to do (no traceback; ``--debug`` shows it).

Before the agent's first call, :func:`check_modeler` makes sure the URL names a pobo modeler: a scheme
(``http://`` or ``https://``), an address that answers, TLS on both sides or on neither, and a ``GET
/healthz`` that answers as a pobo modeler does (``"service": "modeler"``; the curator answers with
``"service": "curator"``). Each failure is an :class:`AgentSetupError` whose message is the line printed.
:func:`explain` words any error of a run the same way (a connection that fails later, after the agent's
retries, reads like one that fails at the start).
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx

from shared.errors import PoboError
from shared.protocol.client import ApiError

__all__ = ["AgentSetupError", "check_modeler", "check_url", "explain"]

#: Seconds the check waits for the modeler's answer (its connection: at most 10 s).
CHECK_TIMEOUT = 15.0


class AgentSetupError(PoboError):
    """The agent cannot start against this URL; the message says why and what to do, in one line."""


def check_url(url: str) -> str:
    """``url`` without a trailing slash, if it has an http(s) scheme and a host; else AgentSetupError."""
    parts = urlsplit(url.strip())
    if parts.scheme in ("http", "https") and parts.netloc:
        return url.strip().rstrip("/")
    if "://" in url:
        raise AgentSetupError(
            f"{url} is not an http:// or https:// URL: give the modeler's URL, e.g. http://modeler.example.org:8002"
        )
    bare = url.strip().lstrip("/")
    raise AgentSetupError(
        f"the modeler URL {url!r} has no scheme: write http://{bare} (or https://{bare} if the modeler "
        "serves TLS)"
    )


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every exception it was raised from or during (``__cause__`` / ``__context__``)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _transport_message(url: str, exc: httpx.TransportError, timeout: float) -> str:
    """One line for a request that got no HTTP answer from ``url``."""
    chain = list(_causes(exc))
    tls = next((e for e in chain if isinstance(e, ssl.SSLError)), None)
    if isinstance(tls, ssl.SSLCertVerificationError) or (
        tls is not None and "CERTIFICATE_VERIFY" in str(tls)
    ):
        reason = getattr(tls, "verify_message", None) or "certificate verify failed"
        return (
            f"cannot verify the TLS certificate of {url} ({reason}): give the CA that signed the modeler's "
            "certificate with --ca-bundle"
        )
    if tls is not None:
        plain = "http://" + url.split("://", 1)[1]
        return (
            f"TLS failed with {url} ({tls.reason or tls}): the server does not speak TLS there; if the "
            f"modeler serves plain HTTP, use {plain}"
        )
    if any(isinstance(e, ConnectionRefusedError) for e in chain):
        return f"cannot connect to {url}: connection refused — is the modeler running, and is the port right?"
    if any(isinstance(e, socket.gaierror) for e in chain):
        host = urlsplit(url).hostname or url
        return f"cannot find the host {host!r} of {url}: check the modeler URL's host name"
    if isinstance(exc, httpx.ConnectTimeout):
        return (
            f"cannot connect to {url}: no answer within {min(timeout, 10.0):g} s — is the host right, and "
            "does a firewall let this machine through to the modeler's port?"
        )
    if isinstance(exc, httpx.TimeoutException):
        return (
            f"{url} accepted the connection but did not answer within {timeout:g} s: is it a pobo modeler's "
            "address?"
        )
    if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError)) and url.startswith("http://"):
        secure = "https://" + url.split("://", 1)[1]
        return (
            f"{url} closed the connection without an HTTP answer: if the modeler serves TLS, use {secure} "
            "(with --ca-bundle for a private CA)"
        )
    return f"cannot talk to {url} ({type(exc).__name__}: {exc or 'no detail'}): is the modeler running there?"


def _health(resp: httpx.Response) -> dict[str, Any] | None:
    kind = resp.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        return None
    try:
        body = resp.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) and "status" in body else None


def check_modeler(
    url: str,
    *,
    verify: ssl.SSLContext | str | bool = True,
    timeout: float = CHECK_TIMEOUT,
    transport: httpx.BaseTransport | None = None,
) -> str:
    """Check that ``url`` is a pobo modeler's address (``GET /healthz``); returns it without a trailing
    slash, or raises :class:`AgentSetupError` with the line to print. One attempt, no retries: a wrong URL
    is said at once (a modeler that restarts later is retried by the agent itself)."""
    base = check_url(url)
    if isinstance(verify, str):
        from shared.servicekit.tls import client_ssl_context

        verify = client_ssl_context(verify)
    try:
        with httpx.Client(
            timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)), verify=verify, transport=transport
        ) as client:
            resp = client.get(f"{base}/healthz")
    except httpx.TransportError as exc:
        raise AgentSetupError(_transport_message(base, exc, timeout)) from exc
    health = _health(resp)
    if health is None:
        kind = resp.headers.get("content-type", "").split(";")[0].strip() or "no content type"
        raise AgentSetupError(
            f"{base} is not a pobo modeler (GET /healthz answered {resp.status_code} with {kind}): give the "
            "modeler's URL (the address `pobo modeler serve` listens on)"
        )
    service = health.get("service")
    if service not in (None, "modeler"):
        raise AgentSetupError(
            f"{base} is a pobo {service}, not a modeler: give the modeler's URL (the address `pobo modeler "
            "serve` listens on)"
        )
    return base


def explain(exc: BaseException, url: str, federation: str) -> str:
    """One line for an error of a run (after the agent's retries): the modeler unreachable, a refusal of
    the token or the federation, or anything else (its message)."""
    if isinstance(exc, AgentSetupError):
        return str(exc)
    transport = next((e for e in _causes(exc) if isinstance(e, httpx.TransportError)), None)
    if transport is not None:
        return _transport_message(url.rstrip("/"), transport, CHECK_TIMEOUT)
    status = getattr(exc, "status_code", None)
    api = next((e for e in _causes(exc) if isinstance(e, ApiError)), None)
    detail = api.detail if api is not None else getattr(exc, "detail", None) or str(exc)
    if status == 401:
        return (
            f"the modeler refused the agent token (401: {detail}): give the token printed when this agent "
            "was registered (--token or POBO_AGENT_TOKEN)"
        )
    if status == 404:
        return (
            f"the modeler has no federation {federation} for this token (404: {detail}): check --federation "
            "(an agent token belongs to one federation)"
        )
    if status == 403:
        return f"the modeler refused this token here (403: {detail}): use this agent's own token"
    if isinstance(exc, PoboError):
        return " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {' '.join(str(exc).split())} (run with --debug for the traceback)"
