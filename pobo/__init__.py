"""pobo's Python SDK: the curator and the modeler from a notebook or a script.

``import pobo`` gives two classes, thin wrappers over the typed clients of ``shared.protocol.client`` (same
retries, idempotency keys, TLS checks and errors), with the calls a person makes by hand::

    >>> import pobo
    >>> curator = pobo.Curator("http://127.0.0.1:8001", token=admin_token)           # doctest: +SKIP
    >>> ds = curator.upload("hospital.csv", name="ward 3", objective="outcome")      # doctest: +SKIP
    >>> rel = curator.release(ds.id, epsilon=1.0, delta=1e-5)                        # doctest: +SKIP
    >>> partner = curator.create_partner(name="lab", release_ids=[rel.id], max_queries=60)  # doctest: +SKIP
    >>> modeler = pobo.Modeler("http://127.0.0.1:8002", token=modeler_token)         # doctest: +SKIP
    >>> study = modeler.create_study(curator_url=curator.url, release_id=rel.id,
    ...                              curator_token=partner.token, iterations=50)     # doctest: +SKIP
    >>> modeler.run(study.id); modeler.wait(study.id).best                           # doctest: +SKIP

Every answer is the API's pydantic model (its JSON fields as attributes). Every error is an
:class:`ApiError` carrying the service's ``status_code`` and its own ``detail`` message:
:class:`CuratorError` / :class:`ModelerApiError` for an answer, ``...Unavailable`` when the service cannot be
reached, ``...ProtocolError`` when something that is not a pobo service answers. See ``docs/sdk.md``.
"""

from __future__ import annotations

from pobo.curator import Curator
from pobo.modeler import Modeler
from shared.protocol.client import (
    ApiError,
    ApiProtocolError,
    ApiUnavailable,
    CuratorError,
    CuratorProtocolError,
    CuratorUnavailable,
    ModelerApiError,
    ModelerProtocolError,
    ModelerUnavailable,
    QueryWaitTimeout,
    ReleaseIntegrityError,
)

__all__ = [
    "ApiError",
    "ApiProtocolError",
    "ApiUnavailable",
    "Curator",
    "CuratorError",
    "CuratorProtocolError",
    "CuratorUnavailable",
    "Modeler",
    "ModelerApiError",
    "ModelerProtocolError",
    "ModelerUnavailable",
    "QueryWaitTimeout",
    "ReleaseIntegrityError",
]
