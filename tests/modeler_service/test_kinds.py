"""Request kinds are plug-ins: a toy kind and a toy strategy, both defined here, run through the modeler's
API (create, step, show, audit, rebuild after a restart) without a line of ``modeler_service`` knowing
them; and the modeler's modules outside the kind registry name no request kind and no strategy."""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from modeler_service.config import Settings
from modeler_service.kinds import KINDS, PlannedRequest, Recorded, RequestKind, Services, StudyFacts
from modeler_service.models import Study
from modeler_service.schemas import RoundQuery, StudyCreate
from shared.bo.strategies import REGISTRY, Strategy, StrategyParams
from shared.protocol.client import CuratorClient
from tests.modeler_service.conftest import AUTH, make_app, study_body
from tests.modeler_service.fake_curator import FakeCurator

ROOT = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------------- the toy kind


@dataclass(frozen=True)
class PairRequest:
    """Ask for the mean outcome of two rows (sent as two row queries)."""

    first: int
    second: int
    details: Mapping[str, Any] = field(default_factory=dict)
    kind: ClassVar[str] = "pair"


@dataclass(frozen=True)
class PairAnswer:
    request: PairRequest
    y: float


class PairKind(RequestKind):
    name = "pair"
    runs_on = "release"

    def create(
        self, session: Session, services: Services, body: StudyCreate, strategy: Any, params: StrategyParams
    ) -> Study:
        return KINDS["row"].create(session, services, body, strategy, params)  # a study on a release

    def load_inputs(self, data_dir: Path, study: Study) -> Any:
        return KINDS["row"].load_inputs(data_dir, study)

    def target_id(self, study: Study) -> int | None:
        return study.release_id

    def public_fields(self, study: Study) -> dict[str, Any]:
        return KINDS["row"].public_fields(study)

    def budget_left(self, client: CuratorClient, study: Study) -> tuple[int, str]:
        return KINDS["row"].budget_left(client, study)

    def plan(
        self, study: StudyFacts, request: Any, position: int, details: dict[str, Any], key: str
    ) -> PlannedRequest:
        assert isinstance(request, PairRequest)
        body = {"rows": [request.first, request.second]}
        return PlannedRequest(position, self.name, request.first, details, key, body=body)

    def send(self, client: CuratorClient, study: Study, request: PlannedRequest, what: str) -> Any:
        assert study.release_id is not None and request.body is not None
        first, second = request.body["rows"]
        return (
            client.create_query(study.release_id, first, idempotency_key=request.key + "a"),
            client.create_query(study.release_id, second, idempotency_key=request.key + "b"),
        )

    def answer(self, request: PlannedRequest, answer: Any) -> PairAnswer:
        a, b = answer
        assert request.body is not None
        first, second = request.body["rows"]
        return PairAnswer(PairRequest(first, second, request.details), (float(a.y) + float(b.y)) / 2)

    def record(self, request: PlannedRequest, answer: Any, extra: Mapping[str, Any]) -> Recorded:
        assert request.body is not None
        details = {**request.details, **extra, "rows": request.body["rows"]}
        return Recorded(request.index, self.answer(request, answer).y, int(answer[0].id), details)

    def from_record(self, index: int | None, y: float | None, details: Mapping[str, Any]) -> PairAnswer:
        first, second = details["rows"]
        return PairAnswer(PairRequest(int(first), int(second), details), float(y or 0.0))

    def public(self, request: PlannedRequest, answer: Any | None) -> RoundQuery:
        return RoundQuery(
            request=request.request,
            kind=self.name,
            index=request.index,
            status="not_sent" if answer is None else "complete",
            y=None if answer is None else self.answer(request, answer).y,
            curator_query_id=None if answer is None else int(answer[0].id),
            details=request.details,
        )


class ToyParams(StrategyParams):
    pass


class PairWalk(Strategy):  # type: ignore[type-arg]
    """Walks the rows two at a time: round t asks for rows 2(t-1) and 2(t-1)+1."""

    name = "toy-pair-walk"
    description = "A test strategy that asks for the mean of two rows per round."
    Params = ToyParams
    kinds = ("pair",)  # type: ignore[assignment]

    def __init__(self, Z: Any, params: StrategyParams, state: Mapping[str, Any]) -> None:
        super().__init__(Z, params, state)
        self.seen: list[tuple[int, int, float]] = []

    @classmethod
    def initial_state(cls, params: Any, *, n: int, budget: int, rng: np.random.Generator) -> dict[str, Any]:
        return {}

    def plan(self, *, budget: int, rng: np.random.Generator) -> list[Any]:
        t = len(self.seen)
        return [PairRequest(2 * t, 2 * t + 1, {"walked": t})]

    def observe(self, answers: Sequence[Any]) -> None:
        for a in answers:
            self.seen.append((a.request.first, a.request.second, a.y))


@pytest.fixture
def toy() -> Iterator[None]:
    KINDS["pair"] = PairKind()
    REGISTRY[PairWalk.name] = PairWalk
    yield
    del KINDS["pair"], REGISTRY[PairWalk.name]


def test_a_toy_request_kind_and_strategy_run_without_touching_the_modeler(
    toy: None, settings: Settings, curator: FakeCurator
) -> None:
    body = study_body(strategy=PairWalk.name, iterations=5)
    for key in ("hyperparameters", "initial_points"):
        body.pop(key)
    with TestClient(make_app(settings, curator), headers=AUTH) as client:
        resp = client.post("/v1/studies", json=body)
        assert resp.status_code == 201, resp.text
        study = resp.json()
        assert study["release"]["id"] == curator.release_id
        for _ in range(3):
            step = client.post(f"/v1/studies/{study['id']}/step")
            assert step.status_code == 200, step.text
        (query,) = step.json()["queries"]
        assert query["kind"] == "pair" and query["index"] == 4
        assert query["y"] == pytest.approx((curator.f[4] + curator.f[5]) / 2)
        audit = client.get(f"/v1/studies/{study['id']}/audit").json()
        entries = audit["entries"]
        assert [e["kind"] for e in entries] == ["pair"] * 3
        assert [e["details"]["rows"] for e in entries] == [[0, 1], [2, 3], [4, 5]]
        assert client.get(f"/v1/studies/{study['id']}/audit/verify").json()["ok"] is True
        assert len(curator.queries) == 6  # two row queries per pair request
    # a restart: the strategy is rebuilt from the audit log by the toy kind, and walks on
    with TestClient(make_app(settings, curator), headers=AUTH) as client:
        step = client.post(f"/v1/studies/{study['id']}/step")
        assert step.status_code == 200, step.text
        assert step.json()["queries"][0]["index"] == 6
        shown = client.get(f"/v1/studies/{study['id']}").json()
        assert shown["iterations_done"] == 4 and shown["rounds_done"] == 4
        best = int(np.argmax([(curator.f[2 * t] + curator.f[2 * t + 1]) / 2 for t in range(4)]))
        assert shown["best"]["index"] == 2 * best


def _modeler_modules() -> Iterator[Path]:
    for path in sorted((ROOT / "modeler_service").rglob("*.py")):
        if "kinds" not in path.relative_to(ROOT).parts:
            yield path


def _string_constants(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    # the OpenAPI examples of a schema show the wire format with real names: documentation, not logic
    examples = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.Dict)
        and any(isinstance(k, ast.Constant) and k.value == "examples" for k in node.keys)
        for inner in ast.walk(node)
    }
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings | examples
    }


def test_the_modeler_names_no_request_kind_and_no_strategy_outside_the_registry() -> None:
    names = set(KINDS) | {kind.runs_on for kind in KINDS.values()} | set(REGISTRY)
    found = {
        f"{path.relative_to(ROOT)}: {value!r}"
        for path in _modeler_modules()
        for value in _string_constants(path) & names
    }
    assert sorted(found) == []


def test_the_source_check_sees_a_kind_name() -> None:
    assert "row" in _string_constants(ROOT / "modeler_service" / "kinds" / "row.py")
