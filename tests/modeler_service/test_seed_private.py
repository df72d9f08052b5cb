"""Issue 5, item 5: the study's optional ``seed`` (benchmarks and tests only) picks the modeler's own initial
rows; it never reaches the curator and is never shown back."""

from __future__ import annotations

from typing import Any

from tests.modeler_service.conftest import study_body
from tests.modeler_service.fake_curator import FakeCurator

SEED = 918_273_645_546_372_819  # distinctive digits: any copy of it in a request would be found


def test_seed_is_never_sent_to_the_curator_nor_shown(client: Any, curator: FakeCurator, app: Any) -> None:
    created = client.post("/v1/studies", json=study_body(seed=SEED, iterations=4, initial_points=2))
    assert created.status_code == 201, created.text
    sid = created.json()["id"]
    for _ in range(4):  # two seeded initial rows, then two GP-UCB suggestions
        assert client.post(f"/v1/studies/{sid}/step").status_code == 200
    assert curator.charged() == 4

    assert curator.requests, "the fake curator saw no requests"
    for request in curator.requests:
        seen = (
            str(request.url) + repr(request.headers.multi_items()) + request.content.decode("latin-1")
        ).lower()
        assert "seed" not in seen, seen
        assert str(SEED) not in seen, seen

    shown = [created.text] + [
        client.get(path).text
        for path in (
            f"/v1/studies/{sid}",
            "/v1/studies",
            f"/v1/studies/{sid}/audit",
            f"/v1/studies/{sid}/audit/verify",
        )
    ]
    for text in shown:
        assert str(SEED) not in text and '"seed"' not in text

    description = app.openapi()["components"]["schemas"]["StudyCreate"]["properties"]["seed"]["description"]
    assert "benchmarks and tests only" in description and "never sent to the curator" in description
