"""Releases: create (admin; spends budget), read (admin or granted partner), download rows."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query
from fastapi.responses import FileResponse, Response

from curator_service.api.deps import AdminDep, ComponentsDep, PrincipalDep, RowId, SessionDep
from curator_service.schemas import release_detail, release_public
from curator_service.services import releases as release_service
from shared.protocol.schemas import (
    ReleaseCreate,
    ReleaseDetail,
    ReleasePublic,
    ReleaseRows,
    ReleasesPublic,
    RowExclusions,
)

router = APIRouter(tags=["releases"])

NPY_MEDIA_TYPE = "application/x-npy"
_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"description": "Missing or invalid token."},
    403: {"description": "A partner token without a grant for this release (or an admin-only endpoint)."},
    404: {"description": "No such release or dataset."},
    410: {
        "description": "Its dataset was erased (`DELETE /v1/datasets/{id}`); the detail says what: "
        "`release N was erased: its dataset was erased by the curator`, `dataset N was erased`, ..."
    },
}


@router.post(
    "/v1/datasets/{dataset_id}/releases",
    status_code=201,
    response_model=ReleaseDetail,
    summary="Release Z (admin): the Gaussian mechanism (default, DP) or the paper's Algorithm 1",
    description="Spends (epsilon, delta) of the population's budget under basic composition, in the "
    "population's relation: a dataset whose declared scales are coarser than the population's (or with "
    "several rows per person) is charged the epsilon of the larger change one person can make "
    "(`charged_epsilon` in the privacy report). Refused with 409, with nothing written, when the budget "
    "would be exceeded or the population's total delta would reach 1/n (its smallest dataset) without "
    "`allow_large_delta`; 422 for delta >= 1/n without `allow_large_delta`, for `r` >= d with the Gaussian "
    "mechanism, and for `po-gp-ucb` without `acknowledge_no_guarantee` (Algorithm 1 is not differentially "
    "private when n > d + 1; such a release turns the population's `formal_guarantee` false). The noise is "
    "added exactly (a public lattice, integer noise); it and any projection matrix come from a fresh AES-CTR "
    "generator keyed from the OS, are used once and never stored; no seed is accepted. The release is "
    "immutable.",
    responses={
        **_ERRORS,
        409: {
            "description": "The population's privacy budget would be exceeded, or its total delta would "
            "reach 1/n."
        },
        413: {"description": "The release (n x r float64) would exceed POBO_CURATOR_MAX_RELEASE_BYTES."},
        422: {"description": "Invalid or refused parameters (the detail says which and why)."},
    },
)
def create_release(
    dataset_id: RowId, body: ReleaseCreate, _admin: AdminDep, components: ComponentsDep
) -> ReleaseDetail:
    # A sync route: FastAPI runs it in a worker thread, so the projection never blocks the event loop.
    release = release_service.create_release(
        components.db,
        components.store,
        dataset_id,
        body,
        max_bytes=components.settings.max_release_bytes,
        backend=components.compute_backend,
    )
    return release_detail(release)


@router.get(
    "/v1/datasets/{dataset_id}/releases",
    response_model=ReleasesPublic,
    summary="Releases of one dataset (admin)",
    responses=_ERRORS,
)
def list_dataset_releases(dataset_id: RowId, principal: AdminDep, session: SessionDep) -> ReleasesPublic:
    releases = release_service.list_releases(session, principal, dataset_id)
    return ReleasesPublic(data=[release_detail(r) for r in releases], count=len(releases))


@router.get(
    "/v1/releases",
    response_model=ReleasesPublic,
    summary="Releases you may read (admin: all, with diagnostics; partner: granted, public fields only)",
    responses={401: _ERRORS[401]},
)
def list_releases(principal: PrincipalDep, session: SessionDep) -> ReleasesPublic:
    releases = release_service.list_releases(session, principal)
    convert = release_detail if principal.is_admin else release_public
    return ReleasesPublic(data=[convert(r) for r in releases], count=len(releases))


@router.get(
    "/v1/releases/{release_id}",
    response_model=ReleaseDetail | ReleasePublic,
    summary="One release (partners never see sigma_min, lifted, the scaling or what was acknowledged)",
    responses=_ERRORS,
)
def get_release(
    release_id: RowId, principal: PrincipalDep, session: SessionDep
) -> ReleaseDetail | ReleasePublic:
    release = release_service.get_release(session, principal, release_id)
    return release_detail(release) if principal.is_admin else release_public(release)


def _wants_npy(accept: str | None, fmt: str | None) -> bool:
    if fmt is not None:
        return fmt == "npy"
    if not accept:
        return False
    types = [part.split(";")[0].strip().lower() for part in accept.split(",")]
    return NPY_MEDIA_TYPE in types or "application/octet-stream" in types


@router.get(
    "/v1/releases/{release_id}/rows",
    response_model=ReleaseRows,
    summary="The released rows Z: JSON, or the .npy file with Accept: application/x-npy",
    description="`Accept: application/x-npy` (or `?format=npy`) returns the stored n x r float64 .npy file, "
    "byte for byte; its sha256 equals the release's `sha256` and the `ETag`. JSON returns "
    "`{rows, sha256, offset, n}`; `offset`/`limit` page through big releases (JSON only). "
    "The .npy download serves byte ranges (`Accept-Ranges: bytes`): `Range: bytes=<first>-[<last>]` "
    "answers 206 with that part of the file and its `Content-Range`, and a range that starts at or past "
    'the end 416 with `Content-Range: bytes */<size>`. Send `If-Range: "<sha256>"` (the `ETag`) with it '
    "to continue a download that broke off: the range is served only while the file is still that one, "
    "otherwise the whole file comes back (200). The release is immutable, so a resumed download, checked "
    "against the sha256 at the end, is the same file; `CuratorClient.download_release_rows` does this.",
    responses={
        **_ERRORS,
        200: {
            "content": {NPY_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}},
            "description": "The rows (JSON) or the .npy file.",
            "headers": {
                "ETag": {
                    "description": 'The release\'s sha256, quoted: `"<sha256>"`.',
                    "schema": {"type": "string"},
                },
                "Accept-Ranges": {
                    "description": "`bytes` for the .npy file: it can be fetched in ranges.",
                    "schema": {"type": "string"},
                },
            },
        },
        206: {
            "content": {NPY_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}},
            "description": "The byte range of the .npy file a `Range` header asked for (with an `If-Range` "
            "that matches the `ETag`, or none).",
            "headers": {
                "Content-Range": {
                    "description": "`bytes <first>-<last>/<size>`.",
                    "schema": {"type": "string"},
                },
            },
        },
        304: {"description": "If-None-Match matched the ETag."},
        413: {"description": "Too many values for one JSON page: use the .npy download or offset/limit."},
        416: {
            "description": "A `Range` that starts at or past the end of the .npy file; "
            "`Content-Range: bytes */<size>` gives its size."
        },
    },
)
def release_rows(
    release_id: RowId,
    principal: PrincipalDep,
    session: SessionDep,
    components: ComponentsDep,
    accept: Annotated[str | None, Header()] = None,
    if_none_match: Annotated[str | None, Header()] = None,
    range_: Annotated[
        str | None,
        Header(alias="range", description="`bytes=<first>-[<last>]`: that part of the .npy file (206)."),
    ] = None,
    if_range: Annotated[
        str | None,
        Header(description='`"<sha256>"`: serve the `Range` only while the file is still this one.'),
    ] = None,
    format: Annotated[str | None, Query(pattern="^(json|npy)$", description="Overrides Accept.")] = None,  # noqa: A002
    offset: Annotated[int, Query(ge=0, description="First row (JSON only).")] = 0,
    limit: Annotated[int | None, Query(ge=1, description="At most this many rows (JSON only).")] = None,
) -> Response:
    release = release_service.get_release(session, principal, release_id)
    session.commit()  # end the read-only transaction before streaming (no expiry: `release` stays usable)
    etag = f'"{release.sha256}"'
    headers = {"ETag": etag, "X-Pobo-SHA256": release.sha256, "Cache-Control": "private, no-transform"}
    if if_none_match is not None and etag in [t.strip() for t in if_none_match.split(",")]:
        return Response(status_code=304, headers=headers)
    if _wants_npy(accept, format):  # Range / If-Range (range_, if_range) are served by FileResponse
        path, _ = release_service.release_file(components.store, release)
        return FileResponse(
            path, media_type=NPY_MEDIA_TYPE, headers=headers, filename=f"release-{release.id}.npy"
        )
    rows, first = release_service.release_rows(components.store, release, offset, limit)
    body = json.dumps({"rows": rows, "sha256": release.sha256, "offset": first, "n": release.n})
    return Response(body, media_type="application/json", headers=headers)


@router.get(
    "/v1/releases/{release_id}/exclusions",
    response_model=RowExclusions,
    summary="Rows this grant can no longer be answered about (partner)",
    description="The rows of the release whose person's output allotment under the caller's grant "
    "(`max_epsilon_per_row`) leaves no room for one more charged answer: a query of one of them is refused "
    "with 409 and `Pobo-Error-Code: row-unaffordable`, nothing charged. The modeler reads it so that its "
    "strategies never choose such a row. It depends only on the curator's settings and this grant's own "
    "answers, never on another partner's queries. Empty for a grant with raw answers or without a cap.",
    responses={**_ERRORS, 403: {"description": "An admin token: the list is a partner grant's own."}},
)
def release_exclusions(release_id: RowId, principal: PrincipalDep, session: SessionDep) -> RowExclusions:
    return release_service.row_exclusions(session, principal, release_id)
