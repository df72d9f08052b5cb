"""A small in-memory curator implementing the endpoints the modeler uses (API.md), as an httpx transport.

Enough behaviour to test the modeler alone: one release, bearer tokens, npy rows with sha256, queries with
Idempotency-Key (a repeat returns the same query and is not charged), a quota (429), ``manual`` outcomes
(pending until ``post_result``; ``?wait=`` long-polls), supersessions of a measured value (``supersede``;
listed by ``GET /v1/releases/{id}/corrections?after_id=&limit=``), and injectable failures.

One gradient oracle (DP-GIBO) too: ``GET /v1/gradient-oracles/{id}`` and ``POST .../steps`` answer the
exact gradient of the quadratic loss f(theta) = |theta - theta_star|^2 / 2, i.e. theta - theta_star
(deterministic, no noise), with the curator's rules: theta and every point inside the bounds (422), 409 once
``oracle_steps`` are used, a repeated Idempotency-Key with the same body returns the stored step (a
different body: 409). ``gradient_steps`` holds every step made.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
import numpy as np

from shared.errors import ERROR_CODE_HEADER, ROW_UNAFFORDABLE

PARTNER_TOKEN = "partner-token-abc"  # noqa: S105 - test fixture
ADMIN_TOKEN = "admin-token-xyz"  # noqa: S105 - test fixture


def _now() -> str:
    return datetime.now(UTC).isoformat()


@dataclass
class FakeCurator:
    n: int = 200
    r: int = 3
    seed: int = 0
    manual: bool = False
    max_queries: int = 10_000
    release_id: int = 1
    fail_next: list[int] = field(default_factory=list)  # status codes to answer next (any endpoint)
    corrupt_rows: bool = False
    down: bool = False  # every request: connection refused (the curator is not running)
    lose_answers: int = 0  # the next N new queries are charged, but their answers never arrive
    retry_after: str | None = None  # sent with the injected failures of fail_next
    oracle_id: int = 1
    oracle_bounds: list[list[float]] = field(default_factory=lambda: [[-5.0, 5.0], [-5.0, 5.0]])
    oracle_steps: int = 30
    oracle_granted: bool = True
    theta_star: tuple[float, ...] = (1.5, -2.0)
    partner_tokens: list[str] = field(default_factory=lambda: [PARTNER_TOKEN])  # valid ones (a rotation adds)
    #: rows the grant can no longer be answered about: refused with 409 ``row-unaffordable``, nothing charged
    unaffordable: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        rng = np.random.default_rng(self.seed)
        self.Z = rng.standard_normal((self.n, self.r))
        # a smooth objective with a single optimum: easy for GP-UCB, hard for random choice
        centre = self.Z[int(np.argmax(self.Z[:, 0] + 0.5 * self.Z[:, 1]))]
        self.f = np.exp(-0.5 * ((self.Z - centre) ** 2).sum(1))
        buf = io.BytesIO()
        np.save(buf, self.Z, allow_pickle=False)
        self.npy = buf.getvalue()
        self.sha256 = hashlib.sha256(self.npy).hexdigest()
        self.queries: list[dict[str, Any]] = []
        self.keys: dict[str, int] = {}
        self.requests: list[httpx.Request] = []
        self.cond = threading.Condition()
        self.gradient_steps: list[dict[str, Any]] = []  # every step made (a repeated key adds none)
        self.step_keys: dict[str, int] = {}  # Idempotency-Key -> step number
        self.corrections: list[dict[str, Any]] = []  # supersessions, in the order made (id = position)

    # ------------------------------------------------------------------------------------------ helpers
    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def charged(self) -> int:
        return len(self.queries)

    def post_result(self, query_id: int, y: float) -> None:
        with self.cond:
            q = self.queries[query_id - 1]
            q.update(status="complete", y=float(y), completed_at=_now())
            self.cond.notify_all()

    def supersede(self, query_id: int, y: float) -> dict[str, Any]:
        """The lab changes a measured value the partner was sent: the query takes the new value and lists
        the change (the curator's ``supersession``)."""
        with self.cond:
            q = self.queries[query_id - 1]
            assert q["status"] == "complete", "only a measured value can be superseded"
            change = {
                "id": len(self.corrections) + 1,
                "query_id": query_id,
                "release_id": self.release_id,
                "kind": "supersession",
                "previous_y": q["y"],
                "y": float(y),
                "charged_epsilon": None,
                "created_at": _now(),
                "chain_seq": len(self.queries) + len(self.corrections) + 1,
                "reason": None,
            }
            self.corrections.append(change)
            q["y"] = float(y)
            q.setdefault("corrections", []).append(change)
            return dict(change)

    def pending(self) -> list[dict[str, Any]]:
        return [q for q in self.queries if q["status"] == "pending"]

    def partner(self) -> dict[str, Any]:
        """``GET /v1/partners/me``: the partner token's grants and quota (no output privacy)."""
        return {
            "id": 1,
            "name": "modeler",
            "release_ids": [self.release_id],
            "max_queries": self.max_queries,
            "queries_used": len(self.queries),
            "revoked": False,
            "created_at": _now(),
            "output_privacy": None,
            "gradient_oracle_ids": [self.oracle_id] if self.oracle_granted else [],
        }

    def release(self) -> dict[str, Any]:
        return {
            "id": self.release_id,
            "dataset_id": 1,
            "n": self.n,
            "r": self.r,
            "epsilon": 1.0,
            "delta": 1e-4,
            "mechanism": "gaussian",
            "formal_guarantee": True,
            "noise_std": 3.9,
            "lift": None,
            "omega": None,
            "sha256": self.sha256,
            "created_at": _now(),
        }

    def oracle(self) -> dict[str, Any]:
        used = len(self.gradient_steps)
        return {
            "id": self.oracle_id,
            "dataset_id": 1,
            "loss": "gaussian-location",
            "dimension": len(self.oracle_bounds),
            "bounds": self.oracle_bounds,
            "clip": 1.0,
            "mu": 1.0,
            "steps": self.oracle_steps,
            "steps_used": used,
            "steps_left": self.oracle_steps - used,
            "epsilon": 4.4,
            "delta": 1e-5,
            "mu_spent": (used / self.oracle_steps) ** 0.5,
            "n": self.n,
            "noise_std": 0.05,
            "intercept": False,
            "delta_huber": None,
            "weight_clip": None,
            "created_at": _now(),
        }

    def step_posts(self) -> list[httpx.Request]:
        """Every POST of a gradient step received (repeats included)."""
        return [r for r in self.requests if r.method == "POST" and r.url.path.endswith("/steps")]

    # ------------------------------------------------------------------------------------------ handler
    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.down:
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        if self.fail_next:
            code = self.fail_next.pop(0)
            headers = {"retry-after": self.retry_after} if self.retry_after is not None else {}
            return httpx.Response(code, json={"detail": f"injected failure {code}"}, headers=headers)
        if request.url.path == "/healthz":
            return httpx.Response(200, json={"status": "ok", "database": "ok", "service": "curator"})
        auth = request.headers.get("authorization", "")
        token = auth.removeprefix("Bearer ")
        if token not in (*self.partner_tokens, ADMIN_TOKEN):
            return httpx.Response(401, json={"detail": "invalid or revoked token"})
        path, method = request.url.path, request.method
        if path == "/v1/partners/me" and method == "GET":
            return httpx.Response(200, json=self.partner())
        if m := re.fullmatch(r"/v1/releases/(\d+)", path):
            if int(m[1]) != self.release_id:
                return httpx.Response(404, json={"detail": f"release {m[1]} not found"})
            return httpx.Response(200, json=self.release())
        if m := re.fullmatch(r"/v1/releases/(\d+)/exclusions", path):
            listed = sorted(self.unaffordable)
            return httpx.Response(
                200,
                json={
                    "release_id": self.release_id,
                    "n": self.n,
                    "excluded": listed,
                    "only_allowed": None,
                    "max_epsilon_per_row": 1.0,
                    "charged_epsilon": 1.0,
                    "statement": f"{len(listed)} row(s) are excluded.",
                },
            )
        if m := re.fullmatch(r"/v1/releases/(\d+)/corrections", path):
            after = int(request.url.params.get("after_id") or 0)
            limit = int(request.url.params.get("limit") or 1000)
            page = [dict(c) for c in self.corrections if c["id"] > after][:limit]
            return httpx.Response(200, json={"data": page, "count": len(page)})
        if m := re.fullmatch(r"/v1/releases/(\d+)/rows", path):
            if int(m[1]) != self.release_id:
                return httpx.Response(404, json={"detail": f"release {m[1]} not found"})
            body = self.npy if not self.corrupt_rows else self.npy[:-8] + b"\x00" * 8
            return httpx.Response(200, content=body, headers={"content-type": "application/x-npy"})
        if (m := re.fullmatch(r"/v1/releases/(\d+)/queries", path)) and method == "POST":
            return self._create_query(request, int(m[1]), token)
        if (m := re.fullmatch(r"/v1/releases/(\d+)/queries", path)) and method == "GET":
            return httpx.Response(200, json={"queries": list(self.queries), "count": len(self.queries)})
        if (m := re.fullmatch(r"/v1/queries/(\d+)", path)) and method == "GET":
            qid = int(m[1])
            if not 1 <= qid <= len(self.queries):
                return httpx.Response(404, json={"detail": f"query {qid} not found"})
            wait = float(request.url.params.get("wait", 0) or 0)
            with self.cond:
                self.cond.wait_for(
                    lambda: self.queries[qid - 1]["status"] == "complete", timeout=min(wait, 5.0)
                )
                return httpx.Response(200, json=dict(self.queries[qid - 1]))
        if m := re.fullmatch(r"/v1/gradient-oracles/(\d+)(/steps)?", path):
            if int(m[1]) != self.oracle_id or not self.oracle_granted:
                return httpx.Response(404, json={"detail": f"gradient oracle {m[1]} not found"})
            if m[2] is None:
                return httpx.Response(200, json=self.oracle())
            if method == "POST":
                return self._gradient_step(request)
            return httpx.Response(200, json={"data": [], "count": 0})
        if (m := re.fullmatch(r"/v1/queries/(\d+)/result", path)) and method == "POST":
            qid = int(m[1])
            if self.queries[qid - 1]["status"] == "complete":
                return httpx.Response(409, json={"detail": f"query {qid} is already complete"})
            self.post_result(qid, json.loads(request.content)["y"])
            return httpx.Response(200, json=dict(self.queries[qid - 1]))
        return httpx.Response(404, json={"detail": "Not Found"})

    def _create_query(self, request: httpx.Request, release_id: int, token: str) -> httpx.Response:
        if release_id != self.release_id:
            return httpx.Response(404, json={"detail": f"release {release_id} not found"})
        key = request.headers.get("idempotency-key")
        with self.cond:
            if key is not None and key in self.keys:
                return httpx.Response(201, json=dict(self.queries[self.keys[key] - 1]))
            index = json.loads(request.content)["index"]
            if not 0 <= index < self.n:
                return httpx.Response(
                    422, json={"detail": f"index must be in [0, {self.n - 1}], got {index}"}
                )
            if index in self.unaffordable:
                return httpx.Response(
                    409,
                    json={
                        "detail": f"this grant's output allotment for the person in row {index} is used up"
                    },
                    headers={ERROR_CODE_HEADER: ROW_UNAFFORDABLE},
                )
            if len(self.queries) >= self.max_queries:
                return httpx.Response(429, json={"detail": f"query quota of {self.max_queries} is used up"})
            q = {
                "id": len(self.queries) + 1,
                "release_id": release_id,
                "partner_id": 1,
                "index": index,
                "status": "pending" if self.manual else "complete",
                "y": None if self.manual else float(self.f[index]),
                "idempotency_key": key,
                "created_at": _now(),
                "completed_at": None if self.manual else _now(),
            }
            self.queries.append(q)
            if key is not None:
                self.keys[key] = q["id"]
            if self.lose_answers > 0:
                self.lose_answers -= 1
                raise httpx.ReadError("the connection broke before the answer arrived", request=request)
            return httpx.Response(201, json=dict(q))

    def _gradient_step(self, request: httpx.Request) -> httpx.Response:
        key = request.headers.get("idempotency-key")
        body = json.loads(request.content)
        with self.cond:
            if key is not None and key in self.step_keys:
                stored = self.gradient_steps[self.step_keys[key] - 1]
                if stored["body"] != body:
                    return httpx.Response(
                        409, json={"detail": f"Idempotency-Key {key!r} was used with a different body"}
                    )
                return httpx.Response(201, json=stored["result"])
            if len(self.gradient_steps) >= self.oracle_steps:
                return httpx.Response(
                    409, json={"detail": f"all {self.oracle_steps} steps of the oracle are used"}
                )
            bounds = np.asarray(self.oracle_bounds)
            theta = np.asarray(body["theta"], dtype=np.float64)
            points = np.asarray(body["points"], dtype=np.float64).reshape(-1, bounds.shape[0])
            for what, X in (("theta", theta[None, :]), ("points", points)):
                if X.shape[1] != bounds.shape[0] or ((X < bounds[:, 0]) | (X > bounds[:, 1])).any():
                    return httpx.Response(422, json={"detail": f"{what} must lie inside the oracle's bounds"})
            gradient = (theta - np.asarray(self.theta_star)).tolist()
            step = len(self.gradient_steps) + 1
            result = {"step": step, "gradient": gradient, "steps_left": self.oracle_steps - step}
            self.gradient_steps.append({"key": key, "body": body, "result": result})
            if key is not None:
                self.step_keys[key] = step
            if self.lose_answers > 0:
                self.lose_answers -= 1
                raise httpx.ReadError("the connection broke before the answer arrived", request=request)
            return httpx.Response(201, json=result)
