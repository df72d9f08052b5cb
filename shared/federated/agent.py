"""A DP-FTS-DE agent over HTTP: the hospital's side of a federation (Algorithm 2 of the paper, issue 16).

The only module of ``shared.federated`` that talks to a service (httpx and tenacity are imported here and
nowhere else in the package; ``shared.federated.Agent`` is loaded lazily). A hospital's data scientist
drives it with their own objective function::

    agent = Agent("https://modeler.example.org", federation_id, token, objective=my_objective)
    report = agent.run()

What leaves the agent: one omega_{n,t} [M] per round (a posterior sample, eq. 2, over the published random
Fourier features). Its queries X and observations y stay in this process (``agent.X``, ``agent.y``).

Per round t (the federation's current round): x_t from ``choose_query`` with the aggregates of round t - 1
(none before round 1's close: local TS), y_t = objective(x_t), omega from ``agent_submission``, POSTed with
Idempotency-Key ``<federation>:<agent>:<t>``; then a long-poll until round t closes (at its deadline), and
on to the next round until the federation is done. Before round 1 it evaluates ``n_init`` points of its own
sub-region (Algorithm 2, line 2). A submission refused with 409 (the deadline passed) counts as 0 for that
round; the agent goes on. Transient failures (connection errors, 429, 5xx, e.g. while the modeler
restarts) are retried with exponential backoff and jitter for up to ``retry_seconds``.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential_jitter

from shared.errors import PoboError
from shared.federated.agent_step import agent_submission, choose_query, initial_points
from shared.federated.regions import split_box
from shared.federated.rff import RandomFourierFeatures
from shared.privacy.rng import os_entropy_rng

FloatArray = npt.NDArray[np.float64]

__all__ = ["Agent", "AgentError", "AgentReport"]

#: Statuses worth retrying: throttled, or the modeler (or its database) is briefly unavailable.
_TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})


class AgentError(PoboError):
    """The modeler refused a request (a status that retrying would not change)."""

    def __init__(self, status_code: int, detail: str) -> None:
        super().__init__(f"modeler answered {status_code}: {detail}")
        self.status_code = status_code
        self.detail = detail


class _Transient(Exception):
    def __init__(self, status_code: int, detail: str) -> None:
        super().__init__(f"{status_code}: {detail}")
        self.status_code = status_code
        self.detail = detail


@dataclass
class AgentReport:
    """What one run did (the agent's own view; nothing here was sent)."""

    federation_id: str
    agent_id: str
    submitted: list[int] = field(default_factory=list)  # rounds whose submission was accepted
    refused: list[int] = field(default_factory=list)  # rounds that closed without it (409)
    epsilon_pld: float = 0.0
    epsilon_rdp: float = 0.0
    stop_reason: str | None = None
    best_y: float | None = None
    best_x: list[float] | None = None


def _detail(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:200]
    return str(body.get("detail", body)) if isinstance(body, dict) else str(body)[:200]


class Agent:
    """One hospital's agent in one federation (see the module docstring)."""

    def __init__(
        self,
        modeler_url: str,
        federation_id: str,
        token: str,
        objective: Callable[[FloatArray], float],
        *,
        rng: np.random.Generator | None = None,
        n_init: int | None = None,
        timeout: float = 30.0,
        wait_seconds: float = 30.0,
        retry_seconds: float = 120.0,
        poll_seconds: float = 0.5,
        verify: ssl.SSLContext | str | bool = True,
        transport: httpx.BaseTransport | None = None,
        n_candidates: int = 1024,
        n_starts: int = 3,
        on_round: Callable[[int, dict[str, Any]], None] | None = None,
    ) -> None:
        self.federation_id = federation_id
        self.objective = objective
        self.rng = rng if rng is not None else os_entropy_rng()
        self.n_init = n_init
        self.wait_seconds = wait_seconds
        self.retry_seconds = retry_seconds
        self.poll_seconds = poll_seconds
        self.n_candidates = n_candidates
        self.n_starts = n_starts
        self.on_round = on_round
        self._timeout = timeout
        self._http = httpx.Client(
            base_url=modeler_url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
            verify=verify,
            transport=transport,
        )
        self._X: list[FloatArray] = []
        self._y: list[float] = []

    # -------------------------------------------------------------------------------------- local data

    @property
    def X(self) -> FloatArray:
        """The agent's own queries [t, d] (never sent)."""
        return np.asarray(self._X, dtype=np.float64)

    @property
    def y(self) -> FloatArray:
        """The agent's own observations [t] (never sent)."""
        return np.asarray(self._y, dtype=np.float64)

    def _observe(self, x: FloatArray) -> None:
        value = float(self.objective(np.asarray(x, dtype=np.float64)))
        self._X.append(np.asarray(x, dtype=np.float64))
        self._y.append(value)

    # -------------------------------------------------------------------------------------------- HTTP

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _request(
        self, method: str, path: str, *, extra_timeout: float = 0.0, **kwargs: Any
    ) -> httpx.Response:
        """One call, retried on transient failures for up to ``retry_seconds``; an answer >= 400 that is not
        transient raises ``AgentError`` (the caller decides what a 409 means)."""

        def transient(exc: BaseException) -> bool:
            return isinstance(exc, httpx.TransportError | _Transient)

        retrying = Retrying(
            retry=retry_if_exception(transient),
            stop=stop_after_delay(self.retry_seconds),
            wait=wait_exponential_jitter(initial=0.2, max=2.0, jitter=0.2),
            reraise=True,
        )
        for attempt in retrying:
            with attempt:
                resp = self._http.request(method, path, timeout=self._timeout + extra_timeout, **kwargs)
                if resp.status_code in _TRANSIENT_STATUSES:
                    raise _Transient(resp.status_code, _detail(resp))
                if resp.status_code >= 400:
                    raise AgentError(resp.status_code, _detail(resp))
                return resp
        raise AssertionError("unreachable")  # pragma: no cover - reraise=True

    def federation(self) -> dict[str, Any]:
        """``GET /v1/federations/{id}`` as this agent."""
        body: dict[str, Any] = self._request("GET", f"/v1/federations/{self.federation_id}").json()
        return body

    def wait_closed(self, number: int) -> dict[str, Any]:
        """Long-poll ``GET .../rounds/{number}?wait=`` until the round is closed; its body."""
        while True:
            body: dict[str, Any] = self._request(
                "GET",
                f"/v1/federations/{self.federation_id}/rounds/{number}",
                params={"wait": self.wait_seconds},
                extra_timeout=self.wait_seconds,
            ).json()
            if body["status"] == "closed":
                return body

    def submit(self, number: int, agent_id: str, omega: FloatArray) -> bool:
        """POST omega for round ``number``; False if refused with 409 (the round closed without it)."""
        key = f"{self.federation_id}:{agent_id}:{number}"
        try:
            self._request(
                "POST",
                f"/v1/federations/{self.federation_id}/rounds/{number}/submissions",
                json={"omega": [float(v) for v in omega]},
                headers={"Idempotency-Key": key},
            )
        except AgentError as exc:
            if exc.status_code == 409:
                return False
            raise
        return True

    # --------------------------------------------------------------------------------------------- run

    def run(self) -> AgentReport:
        """Take part in every round until the federation is done (Algorithm 2); returns a report."""
        fed = self.federation()
        while fed["status"] == "registering":  # wait for the modeler's start
            time.sleep(self.poll_seconds)
            fed = self.federation()
        you = fed.get("you") or {}
        if you.get("region") is None:
            raise AgentError(403, "this token is not an agent of the federation's frozen list")
        params = fed["params"]
        rff = RandomFourierFeatures.from_public(fed["rff"])
        lower = [float(b[0]) for b in params["bounds"]]
        upper = [float(b[1]) for b in params["bounds"]]
        regions = split_box(lower, upper, int(params["P"]))
        report = AgentReport(federation_id=self.federation_id, agent_id=str(you["id"]))

        if not self._X:  # Algorithm 2, line 2: initial points in the assigned sub-region
            n_init = self.n_init if self.n_init is not None else int(params.get("n_init", 1))
            for x in initial_points(regions, int(you["region"]), n_init, rng=self.rng):
                self._observe(x)

        aggregates: FloatArray | None = None
        have_round = 0  # the round whose aggregates we hold
        while fed["status"] == "running":
            t = int(fed["round"])
            if t > 1 and have_round != t - 1:
                previous = self.wait_closed(t - 1)
                aggregates = np.asarray(previous["aggregates"], dtype=np.float64)
                have_round = t - 1
            choice = choose_query(
                t,
                rff,
                self.X,
                self.y,
                aggregates,
                regions,
                rng=self.rng,
                schedule=params.get("p_schedule", "inv_sqrt"),
                n_candidates=self.n_candidates,
                n_starts=self.n_starts,
            )
            self._observe(choice.x)
            omega = agent_submission(rff, self.X, self.y, rng=self.rng)
            (report.submitted if self.submit(t, report.agent_id, omega) else report.refused).append(t)
            closed = self.wait_closed(t)
            aggregates = np.asarray(closed["aggregates"], dtype=np.float64)
            have_round = t
            if self.on_round is not None:
                self.on_round(t, {**closed, "source": choice.source, "y": self._y[-1]})
            fed = self.federation()

        best = int(np.argmax(self.y)) if self._y else None
        report.epsilon_pld = float(fed["epsilon_pld"])
        report.epsilon_rdp = float(fed["epsilon_rdp"])
        report.stop_reason = fed.get("stop_reason")
        if best is not None:
            report.best_y = float(self._y[best])
            report.best_x = [float(v) for v in self._X[best]]
        return report
