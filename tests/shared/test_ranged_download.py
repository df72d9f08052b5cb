"""``CuratorClient.download_release_rows`` is resumable: a body cut mid-way is continued with
``Range: bytes=<size>-`` + ``If-Range: "<sha256>"``, a partial left by an earlier call is continued, a corrupt
partial is downloaded again from the start, and nothing but the verified file is left behind
(httpx.MockTransport serving ranges as the curator's route does, which
tests/curator_service/test_release_ranges.py checks).
"""

from __future__ import annotations

import hashlib
import io
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import pytest

from shared.protocol.client import (
    CuratorClient,
    CuratorProtocolError,
    CuratorUnavailable,
    ReleaseIntegrityError,
)

CHUNK = 1000  # the client's chunk_size; the server's pieces are as large, so a cut at k keeps k bytes


def npy_bytes(seed: int = 11, n: int = 3000, r: int = 3) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.random.default_rng(seed).normal(size=(n, r)), allow_pickle=False)
    return buf.getvalue()


GOOD = npy_bytes()
SHA = hashlib.sha256(GOOD).hexdigest()


class _Body(httpx.SyncByteStream):
    """``data`` in CHUNK pieces; with ``cut``, a ReadError (a dropped connection) after that many bytes."""

    def __init__(self, data: bytes, cut: int | None = None) -> None:
        self.data, self.cut = data, cut

    def __iter__(self) -> Iterator[bytes]:
        end = len(self.data) if self.cut is None else self.cut
        for i in range(0, end, CHUNK):
            yield self.data[i : min(i + CHUNK, end)]
        if self.cut is not None:
            raise httpx.ReadError("connection reset by peer")


@dataclass
class Server:
    """The rows route's .npy answers (Range, If-Range, 206, 416 as Starlette's FileResponse gives them).

    ``cuts``: per rows request, where its body breaks off (None: whole); ``ranges``: False ignores Range
    (a proxy that strips it)."""

    data: bytes = GOOD
    etag: str = f'"{SHA}"'
    cuts: list[int | None] = field(default_factory=list)
    ranges: bool = True
    requests: list[dict[str, str]] = field(default_factory=list)
    sent: int = 0  # body bytes served

    def __call__(self, request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/releases/1/rows"
        assert request.headers["accept"] == "application/x-npy"
        self.requests.append({k: request.headers[k] for k in ("range", "if-range") if k in request.headers})
        cut = self.cuts.pop(0) if self.cuts else None
        headers = {"ETag": self.etag, "Accept-Ranges": "bytes", "Content-Type": "application/x-npy"}
        size = len(self.data)
        asked = re.fullmatch(r"bytes=(\d+)-", request.headers.get("range", ""))
        if_range = request.headers.get("if-range")
        if self.ranges and asked and (if_range is None or if_range == self.etag):
            start = int(asked.group(1))
            if start >= size:
                return httpx.Response(416, headers={"Content-Range": f"bytes */{size}"}, text="")
            part = self.data[start:]
            self.sent += len(part) if cut is None else cut
            headers["Content-Range"] = f"bytes {start}-{size - 1}/{size}"
            return httpx.Response(206, headers=headers, stream=_Body(part, cut))
        self.sent += size if cut is None else cut
        return httpx.Response(200, headers=headers, stream=_Body(self.data, cut))


def client(server: Server, retries: int = 4) -> CuratorClient:
    return CuratorClient(
        "http://curator.test", "tok", transport=httpx.MockTransport(server), backoff=0.0, retries=retries
    )


def partial_of(dest: Path) -> Path:
    return dest.with_name(f".{dest.name}.{SHA[:16]}.part")


def download(server: Server, dest: Path, **kw: object) -> str:
    with client(server) as c:
        return c.download_release_rows(1, dest, expected_sha256=SHA, chunk_size=CHUNK, **kw)  # type: ignore[arg-type]


def test_a_dropped_connection_is_resumed_with_a_range(tmp_path: Path) -> None:
    assert len(GOOD) == 72_128
    server = Server(cuts=[30_000, 20_000])  # two drops: the second inside the first 206
    dest = tmp_path / "z.npy"
    assert download(server, dest) == SHA
    assert dest.read_bytes() == GOOD
    assert server.requests == [
        {},
        {"range": "bytes=30000-", "if-range": f'"{SHA}"'},
        {"range": "bytes=50000-", "if-range": f'"{SHA}"'},
    ]
    assert server.sent == len(GOOD)  # no byte sent twice
    assert [p.name for p in tmp_path.iterdir()] == ["z.npy"]


def test_a_partial_left_by_a_failed_call_is_continued_by_the_next(tmp_path: Path) -> None:
    dest = tmp_path / "z.npy"
    first = Server(cuts=[40_000, 10_000])
    with pytest.raises(CuratorUnavailable, match="ReadError"):
        download(first, dest, max_resumes=1)  # two attempts, both cut: the call fails
    assert first.requests == [{}, {"range": "bytes=40000-", "if-range": f'"{SHA}"'}]
    assert not dest.exists()
    assert partial_of(dest).read_bytes() == GOOD[:50_000]  # kept for the next call

    second = Server()
    assert download(second, dest) == SHA
    assert second.requests == [{"range": "bytes=50000-", "if-range": f'"{SHA}"'}]
    assert second.sent == len(GOOD) - 50_000  # only the rest
    assert dest.read_bytes() == GOOD and not partial_of(dest).exists()


def test_a_crashed_calls_partial_is_continued(tmp_path: Path) -> None:
    dest = tmp_path / "z.npy"
    partial_of(dest).write_bytes(GOOD[:12_345])  # what a killed process left
    server = Server()
    assert download(server, dest) == SHA
    assert server.requests == [{"range": "bytes=12345-", "if-range": f'"{SHA}"'}]
    assert server.sent == len(GOOD) - 12_345
    assert dest.read_bytes() == GOOD
    assert [p.name for p in tmp_path.iterdir()] == ["z.npy"]


def test_a_corrupt_partial_is_downloaded_again_from_the_start(tmp_path: Path) -> None:
    dest = tmp_path / "z.npy"
    bad = bytearray(GOOD[:30_000])
    bad[20_000] ^= 0xFF  # one flipped byte: its sha256 tells only once the file is whole
    partial_of(dest).write_bytes(bytes(bad))
    server = Server()
    assert download(server, dest) == SHA
    assert server.requests == [{"range": "bytes=30000-", "if-range": f'"{SHA}"'}, {}]
    assert dest.read_bytes() == GOOD
    assert [p.name for p in tmp_path.iterdir()] == ["z.npy"]


def test_a_server_that_ignores_the_range_starts_over(tmp_path: Path) -> None:
    dest = tmp_path / "z.npy"
    partial_of(dest).write_bytes(GOOD[:30_000])
    server = Server(ranges=False)  # answers 200 with the whole file: the partial is rewritten, not appended
    assert download(server, dest) == SHA
    assert server.requests == [{"range": "bytes=30000-", "if-range": f'"{SHA}"'}]
    assert dest.read_bytes() == GOOD


def test_a_complete_partial_is_checked_not_downloaded(tmp_path: Path) -> None:
    dest = tmp_path / "z.npy"
    partial_of(dest).write_bytes(GOOD)  # killed between the last byte and the rename
    server = Server()
    assert download(server, dest) == SHA
    assert server.requests == [{"range": f"bytes={len(GOOD)}-", "if-range": f'"{SHA}"'}]  # a 416
    assert server.sent == 0 and dest.read_bytes() == GOOD

    longer = tmp_path / "w.npy"
    partial_of(longer).write_bytes(GOOD + b"junk")  # more than the file: 416, then from the start
    server = Server()
    assert download(server, longer) == SHA
    assert server.requests == [{"range": f"bytes={len(GOOD) + 4}-", "if-range": f'"{SHA}"'}, {}]
    assert longer.read_bytes() == GOOD


def test_rows_that_never_match_raise_and_leave_nothing(tmp_path: Path) -> None:
    dest = tmp_path / "z.npy"
    partial_of(dest).write_bytes(GOOD[:30_000])
    wrong = bytearray(GOOD)
    wrong[-1] ^= 0x01
    server = Server(data=bytes(wrong))  # same ETag, other bytes: the resumed file and a fresh one both fail
    with pytest.raises(ReleaseIntegrityError, match="sha256"):
        download(server, dest)
    assert server.requests == [{"range": "bytes=30000-", "if-range": f'"{SHA}"'}, {}]
    assert list(tmp_path.iterdir()) == []  # no dest, no partial


def test_a_range_answer_that_does_not_continue_the_partial_is_refused(tmp_path: Path) -> None:
    dest = tmp_path / "z.npy"
    partial_of(dest).write_bytes(GOOD[:30_000])

    def handler(request: httpx.Request) -> httpx.Response:
        headers = {"Content-Range": f"bytes 0-{len(GOOD) - 1}/{len(GOOD)}"}  # not where it was asked
        return httpx.Response(206, headers=headers, content=GOOD)

    with (
        CuratorClient("http://curator.test", "tok", transport=httpx.MockTransport(handler), backoff=0.0) as c,
        pytest.raises(CuratorProtocolError, match="does not continue the 30000 bytes"),
    ):
        c.download_release_rows(1, dest, expected_sha256=SHA)
    assert list(tmp_path.iterdir()) == []


def test_a_caller_that_will_not_resume_gets_no_partial_left(tmp_path: Path) -> None:
    dest = tmp_path / "z.npy"
    server = Server(cuts=[40_000, 10_000])
    with pytest.raises(CuratorUnavailable):
        download(server, dest, max_resumes=1, keep_partial=False)  # as the modeler's study creation does
    assert server.requests == [{}, {"range": "bytes=40000-", "if-range": f'"{SHA}"'}]  # still resumed
    assert list(tmp_path.iterdir()) == []
