"""Schemathesis fuzzing of every modeler operation, in-process against the fake curator (issue 5, item 1).

A seeded study gives ``study_id`` a real value in three of every four cases; the token rotates over the
modeler's, none, and the other party's (the curator partner token). Each operation gets at least ``CASES``
cases in all, shared by the databases the run covers (half on each when PostgreSQL is there too, drawn from
a different seed on each); no 5xx, responses conform to the schema, and no body ever contains the curator
token the modeler keeps (encrypted) for the study.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, seed, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from modeler_service.config import Settings
from tests.modeler_service.conftest import AUTH, TOKEN, study_body
from tests.modeler_service.fake_curator import PARTNER_TOKEN

CASES = 100

pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.slow]


@pytest.fixture
def settings_(tmp_path: Path, database_url: str) -> Settings:
    return Settings(
        data_dir=tmp_path / "modeler",
        database_url=database_url,
        token=TOKEN,
        poll_seconds=0.2,
        curator_retries=0,
        auth_max_failures=0,  # the fuzzer sends wrong tokens on purpose
    )


def test_modeler_operations_fuzzed(settings_: Settings, curator: Any, database_url: str) -> None:
    from tests.modeler_service.conftest import make_app

    cases = CASES // (2 if os.environ.get("POBO_TEST_DATABASE_URL") else 1)
    fixed_seed = None if database_url.startswith("sqlite") else 2

    app = make_app(settings_, curator)
    with TestClient(app, headers=AUTH) as client:
        study = client.post("/v1/studies", json=study_body(iterations=3)).json()
        assert client.post(f"/v1/studies/{study['id']}/step").status_code == 200
        schema = schemathesis.openapi.from_asgi("/openapi.json", app)
        operations = [r.ok() for r in schema.get_all_operations()]
        assert len(operations) >= 8
        tokens = [AUTH, {}, {"Authorization": f"Bearer {PARTNER_TOKEN}"}, AUTH]
        counts: dict[str, int] = {}
        for operation in operations:
            label = f"{operation.method.upper()} {operation.path}"
            counts[label] = 0
            _fuzz(operation, label, counts, study["id"], tokens, cases, fixed_seed)()
    print({"operations": len(counts), "cases": sum(counts.values())}, counts)
    short = {k: n for k, n in counts.items() if n < cases and k != "GET /healthz"}
    assert not short, f"operations with fewer than {cases} cases: {short}"


def _fuzz(
    operation: Any,
    label: str,
    counts: dict[str, int],
    study_id: str,
    tokens: list[Any],
    cases: int,
    fixed_seed: int | None,
) -> Any:
    """``fixed_seed``: None draws hypothesis's derandomised sequence; a number, another fixed one."""

    @settings(
        max_examples=cases,
        deadline=None,
        database=None,
        derandomize=fixed_seed is None,
        suppress_health_check=list(HealthCheck),
    )
    @seed(fixed_seed or 0)
    @given(case=operation.as_strategy())
    def run(case: Any) -> None:
        k = counts[label]
        counts[label] += 1
        if case.path_parameters and "study_id" in case.path_parameters and k % 4 != 3:
            case.path_parameters["study_id"] = study_id
        response = case.call_and_validate(
            headers=tokens[k % len(tokens)], excluded_checks=[positive_data_acceptance]
        )
        body = response.content.decode("utf-8", "replace")  # plot.png is binary
        assert PARTNER_TOKEN not in body, f"{label}: the stored curator token was echoed"

    return run
