"""The modeler API as a table (``API.md``, modeler part): one :class:`Endpoint` per operation, named like the
client method that calls it — the federations (DP-FTS-DE: the modeler as coordinator, hospitals' agents),
the studies, the strategies and the health check.

Like the curator's table (``endpoints.py``), an endpoint says how the call is made, whether a repeat is
safe, and what the answer parses into. One difference: the ids in the paths are text (a federation's and a
study's ids are hex strings).
"""

from __future__ import annotations

import re
import string
import uuid
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, TypeVar

from shared.protocol import schemas
from shared.protocol.client.base import Parts, _Call
from shared.protocol.client.endpoints import Endpoint, model
from shared.protocol.client.errors import MODELER_ERRORS
from shared.protocol.schemas import studies

R = TypeVar("R")

#: What a text id in a path may be made of (no "/", no "..": an id never leaves its path segment).
_PATH_ID = re.compile(r"^[A-Za-z0-9_-]{1,200}$")


def _path_id(name: str, value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(int(value))
    text = str(value)
    if not _PATH_ID.fullmatch(text):
        raise ValueError(f"{name} must be letters, digits, '_' or '-', got {text!r}")
    return text


@dataclass(frozen=True)
class ModelerEndpoint(Endpoint[R]):
    """An operation of the modeler API: like :class:`Endpoint`, with text ids in the path."""

    def bind(self, **args: Any) -> _Call:
        ids = {name for _, name, _, _ in string.Formatter().parse(self.path) if name}
        path = self.path.format(**{name: _path_id(name, args.pop(name)) for name in ids})
        parts = self.build(**args)
        headers = (
            parts.headers if self.accept == "application/json" else parts.headers | {"Accept": self.accept}
        )
        extra = parts.extra_timeout + self.extra_timeout
        return _Call(self.method, path, replace(parts, headers=headers, extra_timeout=extra), self.retry_safe)


def _raw(data: Any) -> bytes:
    if not isinstance(data, bytes):
        raise TypeError(f"expected the raw body, got {type(data).__name__}")
    return data


# -- request builders --------------------------------------------------------------------------------------
def _body(*, body: dict[str, Any] | None) -> Parts:
    return Parts(json=None if body is None else dict(body))


def _agent(*, name: str) -> Parts:
    return Parts(json={"name": name})


def _start(*, first_round_at: datetime | None) -> Parts:
    if first_round_at is None:
        return Parts()
    return Parts(json={"first_round_at": first_round_at.isoformat()})


def _submission(*, omega: list[float], idempotency_key: str | None) -> Parts:
    key = idempotency_key or uuid.uuid4().hex  # made once per call: every retry re-sends the same key
    return Parts(json={"omega": [float(v) for v in omega]}, headers={"Idempotency-Key": key})


def _wait(*, wait: float | None) -> Parts:
    """A long-poll: the modeler holds the answer up to ``wait`` s, so the read timeout grows by as much."""
    return Parts(params={"wait": wait} if wait else None, extra_timeout=float(wait or 0.0))


def _study_filter(*, name: str | None, tags: list[str]) -> Parts:
    """``?name=`` and one ``?tag=`` per tag (every one must match)."""
    params: dict[str, Any] = {}
    if name is not None:
        params["name"] = name
    if tags:
        params["tag"] = [str(t) for t in tags]
    return Parts(params=params or None)


def _run(*, iterations: int | None) -> Parts:
    return Parts(json=None if iterations is None else {"iterations": int(iterations)})


def _audit_csv() -> Parts:
    return Parts(params={"format": "csv"})


_M = MODELER_ERRORS


class ModelerAPI:
    """The table: every modeler operation the clients know, by the name of its client method."""

    healthz = ModelerEndpoint("GET", "/healthz", model(schemas.Health, _M))
    list_strategies = ModelerEndpoint("GET", "/v1/strategies", model(studies.StrategiesPublic, _M))
    # federations (DP-FTS-DE)
    create_federation = ModelerEndpoint(
        "POST", "/v1/federations", model(schemas.FederationPublic, _M), _body, idempotent=False
    )
    list_federations = ModelerEndpoint("GET", "/v1/federations", model(schemas.FederationsPublic, _M))
    register_agent = ModelerEndpoint(
        "POST",
        "/v1/federations/{federation_id}/agents",
        model(schemas.AgentCreated, _M),
        _agent,
        idempotent=False,
    )
    start_federation = ModelerEndpoint(  # a repeat is a 409 (already started): not retried once sent
        "POST",
        "/v1/federations/{federation_id}/start",
        model(schemas.FederationPublic, _M),
        _start,
        idempotent=False,
    )
    get_federation = ModelerEndpoint(
        "GET", "/v1/federations/{federation_id}", model(schemas.FederationPublic, _M)
    )
    get_round = ModelerEndpoint(
        "GET", "/v1/federations/{federation_id}/rounds/{number}", model(schemas.RoundPublic, _M), _wait
    )
    submit = ModelerEndpoint(  # safe to repeat thanks to the Idempotency-Key (answered from the receipt)
        "POST",
        "/v1/federations/{federation_id}/rounds/{number}/submissions",
        model(schemas.SubmissionAccepted, _M),
        _submission,
        idempotent=True,
    )
    # studies
    create_study = ModelerEndpoint(
        "POST", "/v1/studies", model(studies.StudyPublic, _M), _body, idempotent=False
    )
    list_studies = ModelerEndpoint("GET", "/v1/studies", model(studies.StudiesPublic, _M), _study_filter)
    get_study = ModelerEndpoint("GET", "/v1/studies/{study_id}", model(studies.StudyPublic, _M))
    update_study = ModelerEndpoint(  # the same change again is the same result: safe to repeat
        "PATCH", "/v1/studies/{study_id}", model(studies.StudyPublic, _M), _body, idempotent=True
    )
    step = ModelerEndpoint(
        "POST", "/v1/studies/{study_id}/step", model(studies.StepResult, _M), idempotent=False
    )
    run = ModelerEndpoint(
        "POST", "/v1/studies/{study_id}/run", model(studies.RunAccepted, _M), _run, idempotent=False
    )
    stop = ModelerEndpoint(
        "POST", "/v1/studies/{study_id}/stop", model(studies.StudyPublic, _M), idempotent=False
    )
    audit = ModelerEndpoint("GET", "/v1/studies/{study_id}/audit", model(studies.AuditLog, _M))
    audit_csv = ModelerEndpoint("GET", "/v1/studies/{study_id}/audit", _raw, _audit_csv, accept="text/csv")
    verify_audit = ModelerEndpoint(
        "GET", "/v1/studies/{study_id}/audit/verify", model(studies.AuditVerification, _M)
    )
    sync_audit = ModelerEndpoint(  # each supersession is recorded once: safe to repeat
        "POST", "/v1/studies/{study_id}/audit/sync", model(studies.AuditSync, _M), idempotent=True
    )
    plot_png = ModelerEndpoint("GET", "/v1/studies/{study_id}/plot.png", _raw, accept="image/png")


#: The table as a mapping, operation name -> endpoint (for listing and tests).
MODELER_ENDPOINTS: dict[str, Endpoint[Any]] = {
    k: v for k, v in vars(ModelerAPI).items() if isinstance(v, Endpoint)
}
