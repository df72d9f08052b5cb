"""The curator API as a table: one :class:`Endpoint` per operation, each named like the client method that
calls it (``API.md``, curator part).

An endpoint says everything the client needs to make the call — HTTP method, path template, how the
arguments become query parameters / body / headers, whether a repeat is safe (and so may be retried), how
much longer than the client's timeout it may take, and what the answer parses into. The client's methods
only pick an endpoint and pass their arguments on.
"""

from __future__ import annotations

import json
import string
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from shared.protocol import schemas
from shared.protocol.client.base import Parts, _Call
from shared.protocol.client.errors import CURATOR_ERRORS, NPY_MEDIA_TYPE, ErrorFamily, Ledger

M = TypeVar("M", bound=BaseModel)
R = TypeVar("R")

#: HTTP methods that are safe to repeat by definition; a POST is only when its endpoint says so.
SAFE_METHODS = frozenset({"GET", "HEAD", "PUT", "DELETE"})


def _nothing() -> Parts:
    return Parts()


@dataclass(frozen=True)
class Endpoint(Generic[R]):
    """One operation of the curator API.

    ``path`` is a template whose ``{fields}`` are filled with the integer ids of the call; every other
    argument goes to ``build``. ``parse`` turns the answer's body (decoded JSON, or the raw bytes when
    ``accept`` is not JSON) into the method's return value. ``idempotent`` None means "as the HTTP method
    says" (:data:`SAFE_METHODS`).
    """

    method: str
    path: str
    parse: Callable[[Any], R]
    build: Callable[..., Parts] = _nothing
    idempotent: bool | None = None
    extra_timeout: float = 0.0
    accept: str = "application/json"

    @property
    def retry_safe(self) -> bool:
        return self.method in SAFE_METHODS if self.idempotent is None else self.idempotent

    def bind(self, **args: Any) -> _Call:
        """The concrete call for these arguments (path ids are formatted as integers)."""
        ids = {name for _, name, _, _ in string.Formatter().parse(self.path) if name}
        path = self.path.format(**{name: int(args.pop(name)) for name in ids})
        parts = self.build(**args)
        headers = (
            parts.headers if self.accept == "application/json" else parts.headers | {"Accept": self.accept}
        )
        extra = parts.extra_timeout + self.extra_timeout
        return _Call(self.method, path, replace(parts, headers=headers, extra_timeout=extra), self.retry_safe)


# -- answers ---------------------------------------------------------------------------------------------
def parse_model(model: type[M], data: Any, errors: ErrorFamily = CURATOR_ERRORS) -> M:
    """``data`` as ``model``; a body of another shape is the server's fault, not ours (no 500 for it)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "the body"
        raise errors.protocol(
            None,
            f"expected a pobo {errors.service}'s {model.__name__}, got JSON of another shape ({where}: "
            f"{first['msg']}): is the {errors.url} the {errors.service} service's address?",
        ) from None


def model(cls: type[M], errors: ErrorFamily = CURATOR_ERRORS) -> Callable[[Any], M]:
    """The ``parse`` of an endpoint that answers one pydantic model."""

    def parse(data: Any) -> M:
        return parse_model(cls, data, errors)

    return parse


def release_model(data: Any) -> schemas.ReleaseDetail | schemas.ReleasePublic:
    """The admin sees ``ReleaseDetail`` (curator-private diagnostics), a partner ``ReleasePublic``."""
    try:
        return schemas.ReleaseDetail.model_validate(data)
    except ValidationError:
        return parse_model(schemas.ReleasePublic, data)


def raw_bytes(data: Any) -> bytes:
    """The ``parse`` of an endpoint that answers a file (the body as is)."""
    if not isinstance(data, bytes):
        raise TypeError(f"expected the raw body, got {type(data).__name__}")
    return data


# -- request builders (only for endpoints with more than path ids) ---------------------------------------
def _present(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def _upload(
    path: str | Path,
    *,
    name: str,
    features: list[str] | str | None,
    scaling: str | dict[str, float] | None,
    form: dict[str, Any],
) -> Parts:
    """``upload_dataset``: a multipart form (``form``: the optional fields, None left out), the CSV streamed
    from disk (re-opened on every attempt)."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"no such CSV file: {file}")
    data: dict[str, str] = {"name": name}
    if features is not None:
        data["features"] = features if isinstance(features, str) else ",".join(features)
    data.update({k: str(v) for k, v in _present(form).items()})
    if scaling is not None:
        data["scaling"] = scaling if isinstance(scaling, str) else json.dumps(scaling)
    return Parts(data=data, upload=file)


def _privacy(*, epsilon: float, delta: float, r_max: int | None) -> Parts:
    return Parts(params=_present({"epsilon": epsilon, "delta": delta, "r_max": r_max}))


def _release(
    *,
    epsilon: float,
    delta: float,
    r: int | None,
    mechanism: str,
    lift: str | None,
    acknowledge_no_guarantee: bool,
    allow_large_delta: bool,
) -> Parts:
    body = {"epsilon": epsilon, "delta": delta, "mechanism": mechanism}
    optional = {
        "r": None if r is None else int(r),
        "lift": lift,
        "acknowledge_no_guarantee": acknowledge_no_guarantee or None,
        "allow_large_delta": allow_large_delta or None,
    }
    return Parts(json=body | _present(optional))


def _grant(*, release_ids: list[int]) -> Parts:
    return Parts(json={"release_ids": [int(i) for i in release_ids]})


def _partner(
    *,
    name: str,
    release_ids: list[int],
    max_queries: int,
    output_privacy: dict[str, Any] | None = None,
    gradient_oracle_ids: list[int] | None = None,
) -> Parts:
    body: dict[str, Any] = {
        "name": name,
        "release_ids": [int(i) for i in release_ids],
        "max_queries": int(max_queries),
    }
    if output_privacy is not None:
        body["output_privacy"] = dict(output_privacy)
    if gradient_oracle_ids:
        body["gradient_oracle_ids"] = [int(i) for i in gradient_oracle_ids]
    return Parts(json=body)


def _body(*, body: dict[str, Any]) -> Parts:
    return Parts(json=dict(body))


def _gradient_step(*, body: dict[str, Any], idempotency_key: str | None) -> Parts:
    key = idempotency_key or uuid.uuid4().hex  # made once per call: every retry re-sends the same key
    return Parts(json=dict(body), headers={"Idempotency-Key": key})


def _access_log(*, limit: int, partner_id: int | None, after_id: int | None) -> Parts:
    return Parts(params=_present({"limit": limit, "partner_id": partner_id, "after_id": after_id}))


def _query(*, index: int, idempotency_key: str | None) -> Parts:
    key = idempotency_key or uuid.uuid4().hex  # made once per call: every retry re-sends the same key
    return Parts(json={"index": int(index)}, headers={"Idempotency-Key": key})


def _wait(*, wait: float | None) -> Parts:
    """A long-poll: the curator holds the answer up to ``wait`` s, so the read timeout grows by as much."""
    return Parts(params={"wait": wait} if wait else None, extra_timeout=float(wait or 0.0))


def _result(*, y: float) -> Parts:
    return Parts(json={"y": float(y)})


def _correction(*, y: float, reason: str) -> Parts:
    return Parts(json={"y": float(y), "reason": reason})


def _lab_queries(
    *, status: str, release_id: int | None, dataset_id: int | None, after_id: int | None, limit: int | None
) -> Parts:
    params = {
        "status": status,
        "release_id": release_id,
        "dataset_id": dataset_id,
        "after_id": after_id,
        "limit": limit,
    }
    return Parts(params=_present(params))


def _results(*, path: str | Path, release_id: int | None) -> Parts:
    """``post_results``: the measurements' CSV streamed from disk, and the default release if given."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"no such CSV file: {file}")
    return Parts(data=None if release_id is None else {"release_id": str(int(release_id))}, upload=file)


def _corrections(*, after_id: int | None, limit: int | None) -> Parts:
    return Parts(params=_present({"after_id": after_id, "limit": limit}))


class API:
    """The table: every curator operation the client knows, by the name of its client method."""

    healthz = Endpoint("GET", "/healthz", model(schemas.Health))
    # datasets (admin)
    upload_dataset = Endpoint(
        "POST", "/v1/datasets", model(schemas.DatasetPublic), _upload, idempotent=False, extra_timeout=600.0
    )
    list_datasets = Endpoint("GET", "/v1/datasets", model(schemas.DatasetsPublic))
    get_dataset = Endpoint("GET", "/v1/datasets/{dataset_id}", model(schemas.DatasetPublic))
    privacy_report = Endpoint(
        "GET", "/v1/datasets/{dataset_id}/privacy", model(schemas.PrivacyReport), _privacy
    )
    ledger = Endpoint("GET", "/v1/datasets/{dataset_id}/ledger", model(Ledger))
    list_populations = Endpoint("GET", "/v1/populations", model(schemas.PopulationsPublic))
    # releases
    create_release = Endpoint(
        "POST", "/v1/datasets/{dataset_id}/releases", release_model, _release, idempotent=False
    )
    get_release = Endpoint("GET", "/v1/releases/{release_id}", release_model)
    release_rows = Endpoint("GET", "/v1/releases/{release_id}/rows", raw_bytes, accept=NPY_MEDIA_TYPE)
    list_releases = Endpoint("GET", "/v1/releases", model(schemas.ReleasesPublic))
    row_exclusions = Endpoint("GET", "/v1/releases/{release_id}/exclusions", model(schemas.RowExclusions))
    list_dataset_releases = Endpoint(
        "GET", "/v1/datasets/{dataset_id}/releases", model(schemas.ReleasesPublic)
    )
    # partners
    create_partner = Endpoint(
        "POST", "/v1/partners", model(schemas.PartnerCreated), _partner, idempotent=False
    )
    list_partners = Endpoint("GET", "/v1/partners", model(schemas.PartnersPublic))
    get_partner = Endpoint("GET", "/v1/partners/{partner_id}", model(schemas.PartnerPublic))
    get_own_partner = Endpoint("GET", "/v1/partners/me", model(schemas.PartnerPublic))
    grant = Endpoint(  # granting a release twice grants it once: safe to repeat
        "POST", "/v1/partners/{partner_id}/grants", model(schemas.PartnerPublic), _grant, idempotent=True
    )
    revoke_partner = Endpoint("DELETE", "/v1/partners/{partner_id}", model(schemas.PartnerPublic))
    access_log = Endpoint("GET", "/v1/access-log", model(schemas.AccessLogPublic), _access_log)
    # queries
    create_query = Endpoint(  # safe to repeat thanks to the Idempotency-Key header (never charged twice)
        "POST", "/v1/releases/{release_id}/queries", model(schemas.QueryPublic), _query, idempotent=True
    )
    get_query = Endpoint("GET", "/v1/queries/{query_id}", model(schemas.QueryPublic), _wait)
    post_result = Endpoint(
        "POST", "/v1/queries/{query_id}/result", model(schemas.QueryPublic), _result, idempotent=False
    )
    list_queries = Endpoint("GET", "/v1/releases/{release_id}/queries", model(schemas.QueriesPublic))
    # the lab (admin): the pending list, bulk results, corrections
    lab_queries = Endpoint("GET", "/v1/queries", model(schemas.LabQueriesPublic), _lab_queries)
    post_results = Endpoint(  # all or nothing, but a retry after a lost answer would be refused: no retry
        "POST", "/v1/queries/results", model(schemas.ResultsPosted), _results, idempotent=False
    )
    correct_result = Endpoint(
        "POST",
        "/v1/queries/{query_id}/corrections",
        model(schemas.QueryPublic),
        _correction,
        idempotent=False,
    )
    list_corrections = Endpoint(
        "GET", "/v1/releases/{release_id}/corrections", model(schemas.CorrectionsPublic), _corrections
    )
    verify_queries = Endpoint(
        "GET", "/v1/releases/{release_id}/queries/verify", model(schemas.QueryLogVerification)
    )
    # gradient oracles (DP-GIBO)
    create_gradient_oracle = Endpoint(
        "POST",
        "/v1/datasets/{dataset_id}/gradient-oracles",
        model(schemas.GradientOraclePublic),
        _body,
        idempotent=False,
    )
    list_gradient_oracles = Endpoint("GET", "/v1/gradient-oracles", model(schemas.GradientOraclesPublic))
    get_gradient_oracle = Endpoint(
        "GET", "/v1/gradient-oracles/{oracle_id}", model(schemas.GradientOraclePublic)
    )
    gradient_step = Endpoint(  # safe to repeat thanks to the Idempotency-Key (never a second step)
        "POST",
        "/v1/gradient-oracles/{oracle_id}/steps",
        model(schemas.GradientStepResult),
        _gradient_step,
        idempotent=True,
    )
    list_gradient_steps = Endpoint(
        "GET", "/v1/gradient-oracles/{oracle_id}/steps", model(schemas.GradientStepsPublic)
    )


#: The table as a mapping, operation name -> endpoint (for listing and tests).
ENDPOINTS: dict[str, Endpoint[Any]] = {k: v for k, v in vars(API).items() if isinstance(v, Endpoint)}
