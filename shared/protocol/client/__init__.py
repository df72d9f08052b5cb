"""Typed HTTP clients of the pobo APIs: :class:`CuratorClient` (the curator API, ``API.md`` curator part),
:class:`ModelerClient` and :class:`FederationClient` (the modeler API: studies, federations).

This is the only way the modeler service talks to a curator, and what a data scientist imports in a
notebook::

    >>> from shared.protocol.client import CuratorClient
    >>> admin = CuratorClient("http://127.0.0.1:8001", token="<admin token>")
    >>> ds = admin.upload_dataset("hospital.csv", name="hospital", objective="outcome")  # doctest: +SKIP
    >>> report = admin.privacy_report(ds.id, epsilon=2.0, delta=1e-4)                     # doctest: +SKIP
    >>> rel = admin.create_release(ds.id, epsilon=2.0, delta=1e-4, r=8)                 # doctest: +SKIP
    >>> partner = admin.create_partner("modeler-lab", release_ids=[rel.id], max_queries=100)  # doctest: +SKIP
    >>> modeler = CuratorClient("http://127.0.0.1:8001", token=partner.token)
    >>> Z = modeler.release_rows(rel.id)             # n x r float64, sha256 verified  # doctest: +SKIP
    >>> q = modeler.create_query(rel.id, index=42)   # doctest: +SKIP
    >>> q.status, q.y                                 # doctest: +SKIP
    ('complete', 0.73)

How it is built — every endpoint is described once, and every request goes one way:

* ``endpoints.py`` is the table: one ``Endpoint`` per operation (``API.create_query``, ...) giving its HTTP
  method, path template, request builder (query parameters, body, headers), whether it is safe to repeat,
  any extra timeout, and the model its answer parses into.
* ``curator.py`` holds :class:`CuratorClient`, whose methods are thin typed wrappers: they pick their
  endpoint and pass their arguments to one ``_call`` -> ``_send`` path (retries, streaming, decoding), which
  is :class:`ApiClient`'s (``apiclient.py``), the base of every client here.
* ``modeler_endpoints.py`` and ``modeler.py`` are the same for the modeler API: :class:`FederationClient`
  (what a hospital's agent uses, ``shared.tools.agent``) and :class:`ModelerClient` (all of it). They raise
  the :class:`ModelerApiError` family (same shape as the curator's, ``ApiError`` the base of both).
* ``base.py`` has the pieces that path uses (error mapping, retry predicate, JSON decoding, TLS
  ``verify``, the checks of downloaded rows); ``errors.py`` what a call can raise.

There is no async twin: code with an event loop runs the blocking client in a thread (as the modeler
service does), e.g. ``await asyncio.to_thread(curator.get_query, qid, wait=30)``.

Behaviour shared by every call:

* **Timeouts**: ``timeout`` seconds per request (connect at most 10 s); long-polls (``get_query(wait=...)``)
  get ``wait`` seconds on top.
* **Retries** (tenacity, exponential backoff with jitter): connection errors, timeouts and 5xx answers are
  retried for requests that are safe to repeat — every ``GET`` and ``DELETE``, ``grant``, and every ``POST``
  that carries an ``Idempotency-Key`` (``create_query``: the *same* key is re-sent on every attempt, so the
  curator returns the query it already made and never charges it twice). Other ``POST`` calls (upload,
  release, partner, result) are only retried when the connection could not be opened (the request never
  left).
* **Errors**: any 4xx/5xx answer raises :class:`CuratorError` with ``.status_code`` and the curator's own
  ``.detail`` message; an unreachable curator raises :class:`CuratorUnavailable` (``status_code`` None). A
  server that does not answer like a pobo curator (a redirect, which is never followed; a body that is not
  its JSON) raises :class:`CuratorProtocolError`.
* **Release rows** are checked against the release's sha256 (and must be an n x r float64 array), else
  :class:`ReleaseIntegrityError`; ``download_release_rows`` streams into a partial file, fsyncs it and
  renames it, continuing with a range request (``Range``/``If-Range``) after a dropped connection or a call
  that failed half way.
* **TLS**: ``https://`` certificates are always verified, against ``verify`` — a CA bundle path (PEM) or an
  ``ssl.SSLContext`` (``shared.servicekit.tls.client_ssl_context``) — or the system trust store by default. A
  certificate that does not verify raises :class:`CuratorUnavailable` naming ``CERTIFICATE_VERIFY_FAILED``.
"""

from __future__ import annotations

from shared.protocol.client.apiclient import ApiClient
from shared.protocol.client.base import npy_sha256
from shared.protocol.client.curator import CuratorClient
from shared.protocol.client.errors import (
    RETRY_STATUSES,
    ApiError,
    ApiProtocolError,
    ApiUnavailable,
    CuratorError,
    CuratorProtocolError,
    CuratorUnavailable,
    Ledger,
    LedgerEntry,
    ModelerApiError,
    ModelerProtocolError,
    ModelerUnavailable,
    QueryWaitTimeout,
    ReleaseIntegrityError,
)
from shared.protocol.client.modeler import FederationClient, ModelerClient

__all__ = [
    "RETRY_STATUSES",
    "ApiClient",
    "ApiError",
    "ApiProtocolError",
    "ApiUnavailable",
    "CuratorClient",
    "CuratorError",
    "CuratorProtocolError",
    "CuratorUnavailable",
    "FederationClient",
    "Ledger",
    "LedgerEntry",
    "ModelerApiError",
    "ModelerClient",
    "ModelerProtocolError",
    "ModelerUnavailable",
    "QueryWaitTimeout",
    "ReleaseIntegrityError",
    "npy_sha256",
]
