"""``GET /v1/releases/{id}/rows`` as .npy in byte ranges (``Range`` / ``If-Range``, 206 / 416), and the
client's resumable download against the real route: a connection cut mid-body is continued with a range."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import anyio
import anyio.from_thread
import httpx
import pytest

from shared.protocol.client import CuratorClient
from tests.curator_service.conftest import World

pytestmark = pytest.mark.anyio

NPY = {"Accept": "application/x-npy"}


async def _whole(world: World) -> bytes:
    full = await world.client.get(
        f"/v1/releases/{world.release['id']}/rows", headers={**world.partner_headers, **NPY}
    )
    assert full.status_code == 200, full.text
    assert full.headers["accept-ranges"] == "bytes"
    assert full.headers["etag"] == f'"{world.release["sha256"]}"'
    assert hashlib.sha256(full.content).hexdigest() == world.release["sha256"]
    return full.content


async def test_rows_are_served_in_byte_ranges(world: World) -> None:
    rid, sha = world.release["id"], world.release["sha256"]
    whole = await _whole(world)
    size = len(whole)
    assert size > 1000
    url, headers = f"/v1/releases/{rid}/rows", {**world.partner_headers, **NPY}

    part = await world.client.get(url, headers={**headers, "Range": "bytes=100-299"})
    assert part.status_code == 206
    assert part.headers["content-range"] == f"bytes 100-299/{size}"
    assert part.headers["content-length"] == "200"
    assert part.headers["etag"] == f'"{sha}"' and part.headers["x-pobo-sha256"] == sha
    assert part.content == whole[100:300]

    rest = await world.client.get(url, headers={**headers, "Range": "bytes=777-", "If-Range": f'"{sha}"'})
    assert rest.status_code == 206
    assert rest.headers["content-range"] == f"bytes 777-{size - 1}/{size}"
    assert rest.content == whole[777:]

    stale = await world.client.get(
        url, headers={**headers, "Range": "bytes=777-", "If-Range": f'"{"0" * 64}"'}
    )
    assert stale.status_code == 200 and stale.content == whole  # another file: all of it
    weak = await world.client.get(url, headers={**headers, "Range": "bytes=777-", "If-Range": f'W/"{sha}"'})
    assert weak.status_code == 200 and weak.content == whole

    past = await world.client.get(url, headers={**headers, "Range": f"bytes={size}-", "If-Range": f'"{sha}"'})
    assert past.status_code == 416
    assert past.headers["content-range"] == f"bytes */{size}"
    assert past.content == b""

    as_json = await world.client.get(url, headers={**world.partner_headers, "Range": "bytes=0-9"})
    assert as_json.status_code == 200 and as_json.json()["sha256"] == sha  # JSON pages by offset/limit


async def test_the_openapi_document_describes_ranges(world: World) -> None:
    doc = (await world.client.get("/openapi.json")).json()
    op = doc["paths"]["/v1/releases/{release_id}/rows"]["get"]
    assert "Content-Range" in op["responses"]["206"]["headers"]
    assert "Accept-Ranges" in op["responses"]["200"]["headers"]
    assert "416" in op["responses"]
    assert {"range", "if-range"} <= {p["name"] for p in op["parameters"] if p["in"] == "header"}


class _Cut(httpx.SyncByteStream):
    """A body that breaks off (``httpx.ReadError``) after ``keep`` bytes, as a dropped connection does."""

    def __init__(self, body: bytes, keep: int) -> None:
        self.body, self.keep = body, keep

    def __iter__(self) -> Iterator[bytes]:
        yield self.body[: self.keep]
        raise httpx.ReadError("connection reset by peer")


async def test_the_client_resumes_a_cut_download_from_the_real_route(world: World, tmp_path: Path) -> None:
    """The sync client in a worker thread; each of its requests is forwarded to the app (in-process, on this
    event loop); the first .npy answer is cut after ``keep`` bytes."""
    rid, sha = world.release["id"], world.release["sha256"]
    whole = await _whole(world)
    keep = 1000
    out_dir = tmp_path / "download"
    out_dir.mkdir()
    seen: list[tuple[int, dict[str, str]]] = []

    def forward(request: httpx.Request) -> httpx.Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        resp = anyio.from_thread.run(
            lambda: world.client.request(request.method, request.url.path, headers=headers)
        )
        seen.append((resp.status_code, {k: request.headers.get(k, "") for k in ("range", "if-range")}))
        out = {k: v for k, v in resp.headers.items() if k.lower() != "content-length"}
        if request.url.path.endswith("/rows") and len(seen) == 1:
            return httpx.Response(resp.status_code, headers=out, stream=_Cut(resp.content, keep))
        return httpx.Response(resp.status_code, headers=out, content=resp.content)

    def download() -> str:
        transport = httpx.MockTransport(forward)
        with CuratorClient(
            "http://curator.test", world.partner["token"], transport=transport, backoff=0.0
        ) as client:
            return client.download_release_rows(rid, out_dir / "z.npy", expected_sha256=sha, chunk_size=keep)

    assert await anyio.to_thread.run_sync(download) == sha
    assert (out_dir / "z.npy").read_bytes() == whole
    assert [p.name for p in out_dir.iterdir()] == ["z.npy"]  # the partial was renamed into place
    assert seen == [
        (200, {"range": "", "if-range": ""}),
        (206, {"range": f"bytes={keep}-", "if-range": f'"{sha}"'}),
    ]
