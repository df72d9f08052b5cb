"""A DP-FTS-DE agent over HTTP: the hospital's side of a federation (Algorithm 2 of the paper, issue 16).

A tool over the library: the numerics are ``shared.federated`` (``agent_step``, ``rff``, ``regions``), which
imports no HTTP library; the coordinator's API is the typed ``shared.protocol.client.FederationClient``
(``agent.client``), and this module adds the protocol of an agent over it. A hospital's data scientist
drives it with their own objective function (``from shared.tools.agent import Agent``)::

    agent = Agent("https://modeler.example.org", federation_id, token, objective=my_objective)
    report = agent.run()

What leaves the agent: one omega_{n,t} [M] per round (a posterior sample, eq. 2, over the published random
Fourier features). Its queries X and observations y stay in this process (``agent.X``, ``agent.y``).

The agent walks the rounds t = 1, 2, ... in order and asks the coordinator about each before acting on it
(so that a restart of either side, or an outage, re-synchronises it with the coordinator's current round):

* round t open, and the agent has no receipt in it (``you.accepted`` of ``GET .../rounds/{t}``): x_t from
  ``choose_query`` with the aggregates of round t - 1 (none before round 1's close: local TS),
  y_t = objective(x_t), omega from ``agent_submission``, POSTed with Idempotency-Key
  ``<federation>:<agent>:<t>``; then a long-poll until round t closes (at its deadline);
* round t open with a receipt (an earlier run of this agent submitted to it): no second submission, only
  the long-poll;
* round t already closed (the agent was down, or cut off, for a whole round): nothing to submit; the agent
  takes its aggregates and goes on with round t + 1.

Whether round t counted for this agent is the coordinator's answer, read from the closed round (``you``:
the receipt of a submission accepted before the close), never the agent's guess: a submission whose answer
was lost and whose retry was answered after the close (a replay of the same key, 202) counts, a round that
closed without one is reported refused. Every request names this process (``Pobo-Agent-Instance``, a random
``instance_id`` per ``Agent``): when the coordinator sees two processes alternate on one agent token, its
answers carry a ``warning``, which the agent hands to ``on_warning`` (each distinct warning at most once a
minute). Before round 1 it evaluates ``n_init`` points of its own sub-region
(Algorithm 2, line 2). Transient failures (connection errors, 429, 5xx, e.g. while the modeler restarts) are
retried with exponential backoff and jitter for up to ``retry_seconds`` (the same key and omega on every
retry of a submission); then the agent gives up with the error (``AgentError``). ``on_round(t, info)``, if
given, is called as each round closes: ``info`` is the closed round (``GET .../rounds/{t}``, as JSON) with
``accepted`` (it counted for this agent), ``source`` and ``y`` (the agent's query of the round; None if it
could not submit).
"""

from __future__ import annotations

import math
import ssl
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import numpy as np
import numpy.typing as npt

from shared.errors import PoboError
from shared.federated.agent_step import agent_submission, choose_query, initial_points
from shared.federated.regions import split_box
from shared.federated.rff import RandomFourierFeatures
from shared.privacy.rng import os_entropy_rng
from shared.protocol.client import FederationClient, ModelerApiError
from shared.protocol.schemas import FederationPublic, RoundPublic, SubmissionAccepted

FloatArray = npt.NDArray[np.float64]

__all__ = ["Agent", "AgentError", "AgentReport"]

#: Seconds before the same warning of the coordinator is handed to ``on_warning`` again.
WARNING_SECONDS = 60.0
A = TypeVar("A", FederationPublic, RoundPublic, SubmissionAccepted)

#: Statuses worth retrying: throttled, or the modeler (or its database) is briefly unavailable.
_TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})


class AgentError(PoboError):
    """The modeler refused a request (a status that retrying would not change, or a transient one that
    lasted longer than ``retry_seconds``), or could not be reached for that long (``status_code`` None)."""

    def __init__(self, status_code: int | None, detail: str) -> None:
        if status_code is None:
            super().__init__(f"the modeler could not be reached: {detail}")
        else:
            super().__init__(f"modeler answered {status_code}: {detail}")
        self.status_code = status_code
        self.detail = detail


@contextmanager
def _refusals() -> Iterator[None]:
    """The client's ``ModelerApiError`` (after its retries) as ``AgentError``, which the agent's callers
    catch."""
    try:
        yield
    except ModelerApiError as exc:
        raise AgentError(exc.status_code, exc.detail) from exc


@dataclass
class AgentReport:
    """What one run did (the agent's own view; nothing here was sent)."""

    federation_id: str
    agent_id: str
    #: rounds that counted this agent's submission: accepted before the close (the coordinator's receipt)
    submitted: list[int] = field(default_factory=list)
    #: rounds that closed without one (refused with 409, or closed before the agent could submit)
    refused: list[int] = field(default_factory=list)
    epsilon_pld: float = 0.0
    epsilon_rdp: float = 0.0
    stop_reason: str | None = None
    best_y: float | None = None
    best_x: list[float] | None = None


def _accepted(rnd: RoundPublic, fallback: bool) -> bool:
    """Whether the coordinator holds this agent's submission to the round (its receipt, ``you``); a round
    closed before the coordinator kept receipts has ``you: null``: then the agent's own view."""
    return rnd.you.accepted if rnd.you is not None else fallback


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
        on_warning: Callable[[str], None] | None = None,
        instance_id: str | None = None,
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
        self.on_warning = on_warning
        #: This process's random id, sent on every request (two processes on one token are warned).
        self.instance_id = instance_id or uuid.uuid4().hex
        #: Each distinct warning of the coordinator and when it was last handed to ``on_warning``.
        self.warnings: dict[str, float] = {}
        #: The typed client of the coordinator's API: every call retried on a transient failure (connection
        #: errors, 429, 5xx) for up to ``retry_seconds``, a submission with the same Idempotency-Key.
        self.client = FederationClient(
            modeler_url,
            token,
            timeout=timeout,
            verify=verify,
            transport=transport,
            retry_seconds=retry_seconds,
            retry_statuses=_TRANSIENT_STATUSES,
            backoff=0.2,
            max_backoff=2.0,
            instance_id=self.instance_id,
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
        self.client.close()

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _heard(self, answer: A) -> A:
        """An answer of the coordinator, after its ``warning`` (if any) went to ``on_warning``."""
        message = getattr(answer, "warning", None)
        if message:
            now = time.monotonic()
            if now - self.warnings.get(message, -math.inf) >= WARNING_SECONDS:
                self.warnings[message] = now
                if self.on_warning is not None:
                    self.on_warning(message)
        return answer

    def federation(self) -> FederationPublic:
        """``GET /v1/federations/{id}`` as this agent."""
        with _refusals():
            return self._heard(self.client.get_federation(self.federation_id))

    def round(self, number: int) -> RoundPublic:
        """``GET .../rounds/{number}`` as this agent (no waiting): its status and this agent's ``you``."""
        with _refusals():
            return self._heard(self.client.get_round(self.federation_id, number))

    def wait_closed(self, number: int) -> RoundPublic:
        """Long-poll ``GET .../rounds/{number}?wait=`` until the round is closed; the closed round."""
        with _refusals():
            return self._heard(self.client.wait_for_round(self.federation_id, number, poll=self.wait_seconds))

    def submit(self, number: int, agent_id: str, omega: FloatArray) -> bool:
        """POST omega for round ``number``; True if accepted (also a replay of the same key answered from
        its receipt after the round closed), False if refused with 409 (the round closed without it)."""
        key = f"{self.federation_id}:{agent_id}:{number}"
        try:
            with _refusals():
                self._heard(
                    self.client.submit(
                        self.federation_id, number, [float(v) for v in omega], idempotency_key=key
                    )
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
        while fed.status == "registering":  # wait for the modeler's start
            time.sleep(self.poll_seconds)
            fed = self.federation()
        you = fed.you
        if you is None or you.region is None:
            raise AgentError(403, "this token is not an agent of the federation's frozen list")
        params = fed.params
        rff = RandomFourierFeatures.from_public(fed.rff)
        lower = [float(b[0]) for b in params["bounds"]]
        upper = [float(b[1]) for b in params["bounds"]]
        regions = split_box(lower, upper, int(params["P"]))
        report = AgentReport(federation_id=self.federation_id, agent_id=str(you.id))

        if not self._X:  # Algorithm 2, line 2: initial points in the assigned sub-region
            n_init = self.n_init if self.n_init is not None else int(params.get("n_init", 1))
            for x in initial_points(regions, int(you.region), n_init, rng=self.rng):
                self._observe(x)

        aggregates: FloatArray | None = None
        t = 1  # the round the agent works on: every round is looked at, in order, and none twice
        while True:
            fed = self.federation()
            if fed.status == "done" and t > fed.rounds_closed:
                break  # no round t: the federation stopped (every round run, or the budget)
            rnd = self.round(t)
            info: dict[str, Any] = {"source": None, "y": None}
            submitted: bool | None = None  # this run's own view; the closed round's receipt decides
            if rnd.status == "open" and not _accepted(rnd, False):
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
                submitted = self.submit(t, report.agent_id, omega)
                info = {"source": choice.source, "y": self._y[-1]}
            closed = rnd if rnd.status == "closed" else self.wait_closed(t)
            accepted = _accepted(closed, bool(submitted))
            (report.submitted if accepted else report.refused).append(t)
            aggregates = np.asarray(closed.aggregates, dtype=np.float64)
            if self.on_round is not None:
                self.on_round(t, {**closed.model_dump(mode="json"), **info, "accepted": accepted})
            t += 1

        best = int(np.argmax(self.y)) if self._y else None
        report.epsilon_pld = float(fed.epsilon_pld)
        report.epsilon_rdp = float(fed.epsilon_rdp)
        report.stop_reason = fed.stop_reason
        if best is not None:
            report.best_y = float(self._y[best])
            report.best_x = [float(v) for v in self._X[best]]
        return report
