"""Typed clients of the modeler API: :class:`FederationClient` (the federations, DP-FTS-DE: what a hospital's
agent and the modeler's operator call) and :class:`ModelerClient` (everything: the federations, the studies,
the strategies, the health check).

Same request path as :class:`~shared.protocol.client.CuratorClient` (``ApiClient``: timeouts, retries with
tenacity, TLS ``verify``, error mapping); they raise :class:`ModelerApiError` (``status_code``, the
modeler's ``detail``), :class:`ModelerUnavailable` (not reachable after the retries) and
:class:`ModelerProtocolError` (not a pobo modeler's answer). A submission carries an ``Idempotency-Key``
(the caller's, or one made per call), so it is retried like a ``GET``: the modeler answers a repeat from
its receipt and never counts it twice. Example (a hospital's agent)::

    with FederationClient("https://modeler.example.org", token=agent_token) as modeler:
        fed = modeler.get_federation(federation_id)
        rnd = modeler.get_round(federation_id, fed.round)
        receipt = modeler.submit(federation_id, fed.round, omega, idempotency_key=f"{fed.id}:me:{fed.round}")
        closed = modeler.wait_for_round(federation_id, fed.round)
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from shared.protocol.client.apiclient import ApiClient
from shared.protocol.client.errors import MODELER_ERRORS
from shared.protocol.client.modeler_endpoints import ModelerAPI
from shared.protocol.schemas import (
    AgentCreated,
    FederationCreate,
    FederationPublic,
    FederationsPublic,
    Health,
    RoundPublic,
    SubmissionAccepted,
)
from shared.protocol.schemas.federations import AGENT_INSTANCE_HEADER
from shared.protocol.schemas.studies import (
    AuditLog,
    AuditSync,
    AuditVerification,
    RunAccepted,
    StepResult,
    StrategiesPublic,
    StudiesPublic,
    StudyCreate,
    StudyPublic,
)

__all__ = ["FederationClient", "ModelerClient"]


class FederationClient(ApiClient):
    """Blocking client of the modeler's federation API (``/v1/federations``).

    ``token`` is the modeler token (create, register, start, list) or an agent token (read its own
    federation and rounds, submit). Thread-safe; use as a context manager or call :meth:`close`.
    """

    errors = MODELER_ERRORS

    def __init__(
        self, base_url: str, token: str | None = None, *, instance_id: str | None = None, **kw: Any
    ) -> None:
        """``instance_id``: an agent process's random id, sent as ``Pobo-Agent-Instance`` on every request
        (the coordinator warns, in an answer's ``warning``, when two processes use one agent token); the
        other arguments are ``ApiClient``'s."""
        super().__init__(base_url, token, **kw)
        self.instance_id = instance_id
        if instance_id is not None:
            self._http.headers[AGENT_INSTANCE_HEADER] = instance_id

    # -- the modeler's operator ------------------------------------------------------------------------
    def create_federation(self, body: FederationCreate | dict[str, Any]) -> FederationPublic:
        """A new federation with these public parameters (modeler token); the answer has the features."""
        data = (
            body.model_dump(mode="json", exclude_unset=True) if isinstance(body, FederationCreate) else body
        )
        return self._call(ModelerAPI.create_federation, body=data)

    def list_federations(self) -> FederationsPublic:
        """Every federation (modeler token)."""
        return self._call(ModelerAPI.list_federations)

    def register_agent(self, federation_id: str, name: str) -> AgentCreated:
        """Register an agent before the start (modeler token); its token is in the answer, shown once."""
        return self._call(ModelerAPI.register_agent, federation_id=federation_id, name=name)

    def start_federation(
        self, federation_id: str, *, first_round_at: datetime | None = None
    ) -> FederationPublic:
        """Freeze the agent list and open round 1 (modeler token); ``first_round_at`` (timezone-aware):
        round 1's deadline is then ``first_round_at`` + round_seconds."""
        return self._call(
            ModelerAPI.start_federation, federation_id=federation_id, first_round_at=first_round_at
        )

    # -- the modeler or an agent -----------------------------------------------------------------------
    def get_federation(self, federation_id: str) -> FederationPublic:
        """A federation: status, current round, epsilon so far (an agent also gets ``you``)."""
        return self._call(ModelerAPI.get_federation, federation_id=federation_id)

    def get_round(self, federation_id: str, number: int, *, wait: float | None = None) -> RoundPublic:
        """Round ``number``; with ``wait`` the modeler holds the answer up to that many seconds until the
        round closes. An agent also gets ``you``, its own standing in the round (from its receipt)."""
        return self._call(ModelerAPI.get_round, federation_id=federation_id, number=number, wait=wait)

    def wait_for_round(self, federation_id: str, number: int, *, poll: float = 30.0) -> RoundPublic:
        """Long-poll (``poll`` s at a time) until round ``number`` is closed; the closed round."""
        while True:
            rnd = self.get_round(federation_id, number, wait=poll)
            if rnd.status == "closed":
                return rnd

    def submit(
        self,
        federation_id: str,
        number: int,
        omega: Sequence[float],
        *,
        idempotency_key: str | None = None,
    ) -> SubmissionAccepted:
        """Submit omega for the open round ``number`` (agent token); the answer is the receipt.

        Pass a deterministic ``idempotency_key`` (e.g. ``f"{federation}:{agent}:{round}"``) so that a repeat
        after a lost answer or a restart is answered from the receipt (also once the round has closed)
        instead of refused; without one a random key is used (still shared by this call's retries). A 409
        (``ModelerApiError``) is a refusal: not the open round, its deadline passed, already submitted.
        """
        return self._call(
            ModelerAPI.submit,
            federation_id=federation_id,
            number=number,
            omega=[float(v) for v in omega],
            idempotency_key=idempotency_key,
        )


class ModelerClient(FederationClient):
    """Blocking client of the whole modeler API (modeler token): the federations (:class:`FederationClient`),
    the studies, the strategies and the health check.

    The answers are the contract's models (``shared.protocol.schemas.studies``: ``StudyPublic``,
    ``StepResult``, ``RunAccepted``, ``AuditLog``...). Example::

        with ModelerClient("http://127.0.0.1:8002", token=modeler_token) as modeler:
            study = modeler.create_study({"curator_url": "http://127.0.0.1:8001", "release_id": 1,
                                          "curator_token": partner_token, "iterations": 20})
            modeler.run(study.id)
    """

    def healthz(self) -> Health:
        """``GET /healthz`` (no token needed). A 503 answer raises ``ModelerApiError``."""
        return self._call(ModelerAPI.healthz)

    def list_strategies(self) -> StrategiesPublic:
        """The strategies a study can run, with the JSON schema of their parameters."""
        return self._call(ModelerAPI.list_strategies)

    # -- studies ---------------------------------------------------------------------------------------
    def create_study(self, body: StudyCreate | dict[str, Any]) -> StudyPublic:
        """A study over a curator release or gradient oracle (``StudyCreate``, or its JSON as a dict)."""
        return self._call(ModelerAPI.create_study, body=_wire(body))

    def list_studies(self, *, name: str | None = None, tags: Sequence[str] = ()) -> StudiesPublic:
        """Every study, or those whose name contains ``name`` (ignoring case) and that have every tag of
        ``tags`` (ignoring case)."""
        return self._call(ModelerAPI.list_studies, name=name, tags=list(tags))

    def get_study(self, study_id: str) -> StudyPublic:
        """A study: status, progress, best row."""
        return self._call(ModelerAPI.get_study, study_id=study_id)

    def update_study(
        self,
        study_id: str,
        *,
        curator_token: str | None = None,
        iterations: int | None = None,
        name: str | None = None,
        tags: Sequence[str] | None = None,
        clear_name: bool = False,
    ) -> StudyPublic:
        """A rotated partner token, a new budget, a new name and/or new tags (``PATCH /v1/studies/{id}``;
        ``tags`` replace all of the study's, ``[]`` removes them; ``clear_name`` removes the name)."""
        body: dict[str, Any] = {}
        if curator_token is not None:
            body["curator_token"] = curator_token
        if iterations is not None:
            body["iterations"] = int(iterations)
        if name is not None or clear_name:
            if name is not None and clear_name:
                raise ValueError("give a name or clear_name=True, not both")
            body["name"] = name
        if tags is not None:
            body["tags"] = list(tags)
        return self._call(ModelerAPI.update_study, study_id=study_id, body=body)

    def step(self, study_id: str) -> StepResult:
        """One round now; never retried once sent (a repeat would run another round)."""
        return self._call(ModelerAPI.step, study_id=study_id)

    def run(self, study_id: str, iterations: int | None = None) -> RunAccepted:
        """Run ``iterations`` more (default: the rest of the budget) in the background."""
        return self._call(ModelerAPI.run, study_id=study_id, iterations=iterations)

    def stop(self, study_id: str) -> StudyPublic:
        """Stop a running study after the round in flight (409 if it is not running)."""
        return self._call(ModelerAPI.stop, study_id=study_id)

    def audit(self, study_id: str) -> AuditLog:
        """The study's hash-chained audit log."""
        return self._call(ModelerAPI.audit, study_id=study_id)

    def audit_csv(self, study_id: str) -> bytes:
        """The audit log as CSV."""
        return self._call(ModelerAPI.audit_csv, study_id=study_id)

    def verify_audit(self, study_id: str) -> AuditVerification:
        """Recompute the audit log's hash chains (entries, supersessions) on the modeler."""
        return self._call(ModelerAPI.verify_audit, study_id=study_id)

    def sync_audit(self, study_id: str) -> AuditSync:
        """Have the modeler record the curator's supersessions of the study's values now (safe to repeat:
        each is recorded once)."""
        return self._call(ModelerAPI.sync_audit, study_id=study_id)

    def plot_png(self, study_id: str) -> bytes:
        """Best value so far vs iteration, as a PNG."""
        return self._call(ModelerAPI.plot_png, study_id=study_id)


def _wire(body: StudyCreate | dict[str, Any]) -> dict[str, Any]:
    """A study's JSON as sent: a ``StudyCreate`` with its token revealed (the model masks it)."""
    if isinstance(body, dict):
        return dict(body)
    data = body.model_dump(mode="json", exclude_unset=True)
    data["curator_token"] = body.curator_token.get_secret_value()
    return data
