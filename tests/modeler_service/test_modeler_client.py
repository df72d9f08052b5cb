"""``shared.protocol.client.ModelerClient`` / ``FederationClient``: the modeler API's typed clients — the same
request path as the curator's (retries that reuse the Idempotency-Key, errors carrying the modeler's
detail, answers that are not a pobo modeler's), text ids kept inside their path segment, and every call
against the modeler app itself (through its TestClient)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from modeler_service.config import Settings
from shared.protocol.client import (
    CuratorError,
    FederationClient,
    ModelerApiError,
    ModelerClient,
    ModelerProtocolError,
    ModelerUnavailable,
)
from shared.protocol.client.modeler_endpoints import MODELER_ENDPOINTS
from shared.protocol.schemas import FederationCreate, FederationPublic, RoundPublic, SubmissionAccepted
from tests.modeler_service.conftest import TOKEN

RECEIPT = {
    "federation_id": "abc123",
    "round": 1,
    "status": "accepted",
    "accepted": True,
    "accepted_at": "2026-01-01T00:00:00Z",
    "round_status": "open",
}


def federation_client(handler: Any, **kw: Any) -> FederationClient:
    return FederationClient(
        "http://modeler.test", "tok", transport=httpx.MockTransport(handler), backoff=0.0, **kw
    )


def test_a_submission_is_retried_with_the_same_key_and_errors_carry_the_modelers_detail() -> None:
    keys: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        keys.append(request.headers["Idempotency-Key"])
        if len(keys) == 1:
            return httpx.Response(503, json={"detail": "restarting"})
        if len(keys) == 2:
            raise httpx.ReadError("connection lost", request=request)
        return httpx.Response(202, json=RECEIPT)

    with federation_client(handler) as client:
        receipt = client.submit("abc123", 1, [0.5, 0.25])
    assert isinstance(receipt, SubmissionAccepted) and receipt.round_status == "open"
    assert len(keys) == 3 and len(set(keys)) == 1  # one key, made once for the call

    def refuse(request: httpx.Request) -> httpx.Response:
        return httpx.Response(409, json={"detail": "round 1 is closed"})

    with federation_client(refuse) as client, pytest.raises(ModelerApiError) as err:
        client.submit("abc123", 1, [0.5], idempotency_key="fed:agent:1")
    assert (err.value.status_code, err.value.detail) == (409, "round 1 is closed")
    assert str(err.value).startswith(
        "modeler answered 409 to POST /v1/federations/abc123/rounds/1/submissions"
    )
    assert not isinstance(err.value, CuratorError)


def test_429_is_retried_only_when_asked_and_a_start_is_not_repeated_once_sent() -> None:
    calls = {"n": 0}

    def throttled(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        return httpx.Response(429 if calls["n"] == 1 else 200, json=RECEIPT | {"detail": "slow down"})

    with federation_client(throttled) as client, pytest.raises(ModelerApiError):
        client.submit("abc123", 1, [0.5])
    assert calls["n"] == 1
    calls["n"] = 0
    with federation_client(throttled, retry_statuses=frozenset({429, 503}), retry_seconds=5) as client:
        assert client.submit("abc123", 1, [0.5]).round == 1
    assert calls["n"] == 2

    starts = {"n": 0}

    def lost(request: httpx.Request) -> httpx.Response:
        starts["n"] += 1
        raise httpx.ReadError("connection lost", request=request)

    with federation_client(lost) as client, pytest.raises(ModelerUnavailable) as unreachable:
        client.start_federation("abc123")
    assert starts["n"] == 1 and unreachable.value.sent  # sent: a repeat could start it twice (a 409)
    assert "the modeler could not be reached" in str(unreachable.value)


def test_answers_that_are_not_a_pobo_modelers_are_protocol_errors_and_ids_stay_in_their_segment() -> None:
    def html(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text="<html>hello</html>", headers={"content-type": "text/html"})

    with federation_client(html) as client, pytest.raises(ModelerProtocolError, match="pobo modeler"):
        client.get_federation("abc123")

    def other_json(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"hello": "world"})

    with federation_client(other_json) as client, pytest.raises(ModelerProtocolError, match="RoundPublic"):
        client.get_round("abc123", 1)
    with federation_client(other_json) as client:
        for bad in ("../studies", "a/b", "", "a b"):
            with pytest.raises(ValueError, match="federation_id"):
                client.get_federation(bad)


def test_the_modeler_table_has_a_method_for_every_operation_and_says_what_may_be_repeated() -> None:
    assert all(callable(getattr(ModelerClient, name, None)) for name in MODELER_ENDPOINTS)
    repeatable = {name for name, ep in MODELER_ENDPOINTS.items() if ep.retry_safe}
    assert {name for name, ep in MODELER_ENDPOINTS.items() if ep.method == "GET"} <= repeatable
    posts = {name for name, ep in MODELER_ENDPOINTS.items() if ep.method == "POST"}
    # submit: a POST with an Idempotency-Key; sync_audit records each supersession once, whatever the repeats
    assert posts & repeatable == {"submit", "sync_audit"}
    call = MODELER_ENDPOINTS["get_round"].bind(federation_id="ab12", number=3, wait=5.0)
    assert call.path == "/v1/federations/ab12/rounds/3" and call.parts.params == {"wait": 5.0}
    assert call.parts.extra_timeout == 5.0


# -------------------------------------------------------------------------------- against the modeler app


class AppTransport(httpx.BaseTransport):
    """The modeler app (its TestClient) as the clients' transport."""

    def __init__(self, client: TestClient) -> None:
        self.client = client

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        keep = {"authorization", "idempotency-key", "content-type", "accept"}
        resp = self.client.request(
            request.method,
            request.url.path,
            params=request.url.params,
            content=request.read(),
            headers={k: v for k, v in request.headers.items() if k.lower() in keep},
        )
        return httpx.Response(resp.status_code, headers=resp.headers, content=resp.content, request=request)


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    return Settings(
        data_dir=tmp_path / "modeler",
        database_url=database_url,
        token=TOKEN,
        federation_tick_seconds=60,
        max_wait_seconds=1,
    )


@pytest.fixture
def bare(app: Any) -> Iterator[TestClient]:
    with TestClient(app) as client:  # no token of its own: the typed clients send theirs
        yield client


def test_the_clients_against_the_modeler(bare: TestClient) -> None:
    transport = AppTransport(bare)
    with ModelerClient("http://modeler.test", TOKEN, transport=transport) as modeler:
        assert modeler.healthz().status == "ok"
        assert "gp-ucb" in {s.name for s in modeler.list_strategies().strategies}
        assert modeler.list_studies().count == 0
        with pytest.raises(ModelerApiError) as err:
            modeler.get_study("0123abcd")
        assert err.value.status_code == 404

        body = FederationCreate.model_validate(
            {
                "dimension": 2,
                "bounds": [[0, 1], [-2, 2]],
                "P": 2,
                "M": 8,
                "q": 1.0,
                "z": 5.0,
                "S": 1.0,
                "rounds": 2,
                "epsilon_budget": 10.0,
                "round_seconds": 30.0,
                "lengthscale": 0.3,
            }
        )
        fed = modeler.create_federation(body)
        assert isinstance(fed, FederationPublic) and fed.status == "registering" and fed.agents == []
        agent = modeler.register_agent(fed.id, "hospital-0")
        first = datetime.now(UTC) + timedelta(minutes=5)
        started = modeler.start_federation(fed.id, first_round_at=first)
        assert (
            started.status == "running" and started.participants == 1 and started.round_deadline is not None
        )
        assert started.round_deadline >= first
        assert [f.id for f in modeler.list_federations().data] == [fed.id]
        with pytest.raises(ModelerApiError) as err:
            modeler.start_federation(fed.id)
        assert err.value.status_code == 409

    with FederationClient("http://modeler.test", agent.token, transport=transport) as client:
        mine = client.get_federation(fed.id)
        assert mine.you is not None and mine.you.id == agent.id and mine.agents is None
        key = f"{fed.id}:{agent.id}:1"
        receipt = client.submit(fed.id, 1, [0.1] * 8, idempotency_key=key)
        assert receipt.round == 1 and receipt.round_status == "open"
        rnd = client.get_round(fed.id, 1, wait=0.2)
        assert isinstance(rnd, RoundPublic) and rnd.status == "open" and rnd.you is not None
        assert rnd.you.accepted and rnd.you.accepted_at == receipt.accepted_at
        assert client.submit(fed.id, 1, [0.1] * 8, idempotency_key=key) == receipt  # a replay
        with pytest.raises(ModelerApiError) as err:
            client.submit(fed.id, 1, [0.2] * 8, idempotency_key=key)
        assert err.value.status_code == 409
        with pytest.raises(ModelerApiError) as err:
            client.register_agent(fed.id, "intruder")
        assert err.value.status_code == 403


def test_the_study_calls_answer_the_contracts_models(bare: TestClient) -> None:
    from shared.protocol.schemas.studies import AuditLog, RunAccepted, StepResult, StudyCreate, StudyPublic
    from tests.modeler_service.conftest import study_body

    with ModelerClient("http://modeler.test", TOKEN, transport=AppTransport(bare)) as modeler:
        study = modeler.create_study(StudyCreate.model_validate(study_body(iterations=4)))
        assert isinstance(study, StudyPublic) and study.status == "ready" and study.iterations_total == 4
        step = modeler.step(study.id)
        assert isinstance(step, StepResult) and step.round == 1 and step.status == "complete"
        accepted = modeler.run(study.id)
        assert isinstance(accepted, RunAccepted) and accepted.run_target == 4
        deadline = time.monotonic() + 30
        while modeler.get_study(study.id).status != "done":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        log = modeler.audit(study.id)
        assert isinstance(log, AuditLog) and log.count == 4 and modeler.verify_audit(study.id).ok
        more = modeler.update_study(study.id, iterations=6)
        assert (more.status, more.iterations_total) == ("ready", 6)
        assert [s.id for s in modeler.list_studies().data] == [study.id]


def test_the_client_passes_names_and_tags_through(bare: TestClient) -> None:
    from shared.protocol.schemas.studies import StudyCreate
    from tests.modeler_service.conftest import study_body

    with ModelerClient("http://modeler.test", TOKEN, transport=AppTransport(bare)) as modeler:
        a = modeler.create_study(StudyCreate.model_validate(study_body(name="Alpha run", tags=["x", "y"])))
        b = modeler.create_study({**study_body(), "name": "beta run", "tags": ["y"]})
        assert (a.name, a.tags, b.name, b.tags) == ("Alpha run", ["x", "y"], "beta run", ["y"])
        assert [s.id for s in modeler.list_studies(name="RUN").data] == [a.id, b.id]
        assert [s.id for s in modeler.list_studies(tags=["Y"]).data] == [a.id, b.id]
        assert [s.id for s in modeler.list_studies(name="beta", tags=("y",)).data] == [b.id]
        assert [s.id for s in modeler.list_studies(tags=["x", "y"]).data] == [a.id]
        with pytest.raises(ModelerApiError) as err:
            modeler.list_studies(tags=["not a tag"])
        assert err.value.status_code == 422 and "is not a valid tag" in err.value.detail
        changed = modeler.update_study(b.id, name="Beta", tags=["z"])
        assert (changed.name, changed.tags) == ("Beta", ["z"])
        cleared = modeler.update_study(b.id, clear_name=True, tags=[])
        assert (cleared.name, cleared.tags) == (None, [])
        with pytest.raises(ValueError, match="not both"):
            modeler.update_study(b.id, name="x", clear_name=True)


def test_the_sdk_and_the_cli_pass_names_and_tags_through(
    bare: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from typer.testing import CliRunner

    import pobo
    from shared.tools import sdkcli
    from shared.tools.cli import app
    from tests.modeler_service.fake_curator import PARTNER_TOKEN

    def modeler() -> pobo.Modeler:
        return pobo.Modeler("http://modeler.test", TOKEN, transport=AppTransport(bare))

    with modeler() as sdk:
        a = sdk.create_study(
            curator_url="http://curator.test", release_id=1, curator_token=PARTNER_TOKEN, iterations=2,
            name="Alpha", tags=("cohort-a", "site:x"),
        )  # fmt: skip
        assert (a.name, a.tags) == ("Alpha", ["cohort-a", "site:x"])
        assert [s.id for s in sdk.studies(tag="COHORT-A").data] == [a.id]
        assert [s.id for s in sdk.studies(name="alp", tag=["site:x", "cohort-a"]).data] == [a.id]
        assert sdk.studies(tag=["cohort-a", "cohort-b"]).count == 0
        relabelled = sdk.relabel(a.id, name="", tags=["kept"])
        assert (relabelled.name, relabelled.tags) == (None, ["kept"])
        assert sdk.relabel(a.id, name="Alpha again").tags == ["kept"]
        with pytest.raises(ValueError, match="a name and/or tags"):
            sdk.relabel(a.id)

    monkeypatch.setattr(sdkcli, "_modeler", modeler)
    env = {"POBO_PARTNER_TOKEN": PARTNER_TOKEN, "POBO_PROFILE": "/nonexistent"}
    runner = CliRunner()
    made = runner.invoke(
        app,
        ["study", "create", "--release", "1", "--iterations", "2", "--curator-url", "http://curator.test"]
        + ["--name", "Beta", "--tag", "cohort-b", "--tag", "site:x", "--json"],
        env=env,
    )
    assert made.exit_code == 0, made.output
    b = json.loads(made.stdout)
    assert (b["name"], b["tags"]) == ("Beta", ["cohort-b", "site:x"])
    bad = runner.invoke(
        app,
        ["study", "create", "--release", "1", "--iterations", "2", "--curator-url", "http://curator.test"]
        + ["--tag", "no good"],
        env=env,
    )
    assert bad.exit_code == 1 and "tag 'no good' is not a valid tag" in bad.output
    for args, expected in (
        (["--tag", "site:x"], [b["id"]]),
        (["--tag", "kept"], [a.id]),
        (["--tag", "SITE:X", "--tag", "cohort-b"], [b["id"]]),
        (["--name", "alpha"], [a.id]),
        (["--name", "a", "--tag", "cohort-b"], [b["id"]]),
        ([], [a.id, b["id"]]),
    ):
        listed = runner.invoke(app, ["study", "list", *args, "--json"], env=env)
        assert listed.exit_code == 0, listed.output
        assert [s["id"] for s in json.loads(listed.stdout)["data"]] == expected, args
    table = runner.invoke(app, ["study", "list", "--tag", "cohort-b"], env={**env, "COLUMNS": "160"})
    assert table.exit_code == 0 and "Beta" in table.output and "cohort-b, site:x" in table.output
