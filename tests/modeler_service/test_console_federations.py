"""The modeler console's federation pages (issue 34): the list, a federation's rounds with epsilon after
each (table and chart), its agents with the last round that accepted a submission of theirs, and the
navigation link; nothing that is never published (an omega, a round's Poisson sample). SQLite, and
PostgreSQL when ``POBO_TEST_DATABASE_URL`` is set."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from modeler_service.config import Settings
from modeler_service.console import pages_federations
from shared.servicekit.console.charts import Series
from tests.modeler_service.conftest import TOKEN
from tests.modeler_service.test_console import check_local, sign_in
from tests.modeler_service.test_federations import close_now, setup_federation, started, submit

OMEGA = [0.3125, -0.1875, 0.4375, 0.0625, 0.5625, -0.4375, 0.2188, 0.1094]


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    """The closer thread runs its start-up pass only; the test closes rounds when it says so."""
    return Settings(
        data_dir=tmp_path / "modeler",
        database_url=database_url,
        token=TOKEN,
        federation_tick_seconds=60,
        max_wait_seconds=5,
    )


def cells(html: str, row_id: str) -> list[str]:
    row = html.split(f'id="{row_id}"')[1].split("</tr>")[0]
    return [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]


def test_federation_pages(client: TestClient, app: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    sign_in(client)
    home = client.get("/console").text
    assert 'href="/console/federations"' in home  # in the navigation
    empty = client.get("/console/federations")
    assert empty.status_code == 200 and 'id="no-federations"' in empty.text

    waiting, _ = setup_federation(client, agents=1)  # registering: no round yet
    fid, agents = started(client, agents=2, rounds=3)
    # round 1: both agents submit; round 2: only the first; then both rounds close
    for agent in agents:
        assert submit(client, fid, 1, agent, OMEGA, key=f"{fid}:{agent['id']}:1").status_code == 202
    assert close_now(app, fid, 1)
    assert submit(client, fid, 2, agents[0], OMEGA, key=f"{fid}:{agents[0]['id']}:2").status_code == 202
    assert close_now(app, fid, 2)
    api = client.get(f"/v1/federations/{fid}").json()
    rounds_api = [client.get(f"/v1/federations/{fid}/rounds/{t}").json() for t in (1, 2, 3)]

    listing = client.get("/console/federations").text
    assert (
        f'href="/console/federations/{fid}"' in listing
        and f'href="/console/federations/{waiting}"' in listing
    )
    fed_row = listing.split(f'data-federation-id="{fid}"')[1].split("</tr>")[0]
    assert "2 closed of 3" in fed_row and "round 3 open" in fed_row

    html = client.get(f"/console/federations/{fid}").text
    assert 'id="epsilon-chart"' in html and f'src="/console/federations/{fid}/epsilon.svg"' in html
    for t, rnd in zip((1, 2), rounds_api[:2], strict=True):
        row = cells(html, f"round-{t}")
        assert row[0] == str(t) and row[1] == "closed"
        assert float(row[6]) == pytest.approx(rnd["epsilon_pld"], rel=1e-3)
        assert float(row[7]) == pytest.approx(rnd["epsilon_rdp"], rel=1e-3)
    assert cells(html, "round-1")[5] == "2" and cells(html, "round-2")[5] == "1"  # submissions accepted
    assert cells(html, "round-3")[1] == "open" and cells(html, "round-3")[6] == "–"
    assert f"{api['epsilon_pld']:.4g}" in html.split('id="federation-epsilon">')[1][:20]
    first, second = (cells(html, f"agent-{a['id']}") for a in agents)
    assert first[1] == "hospital-0" and first[5] == "2" and first[6] == "2"  # last round 2, 2 rounds
    assert second[1] == "hospital-1" and second[5] == "1" and second[6] == "1"
    for value in OMEGA:
        assert str(value) not in html  # never a submission
    assert "sampled" not in html  # nor who a round's Poisson sample drew
    assert not any(a["token"] in html for a in agents)
    check_local(html)

    chart = client.get(f"/console/federations/{fid}/epsilon.svg")
    assert chart.status_code == 200 and chart.headers["content-type"].startswith("image/svg+xml")
    drawn: list[list[Series]] = []

    def record(series: list[Series], **kw: Any) -> bytes:
        drawn.append(list(series))
        return b"<svg/>"

    monkeypatch.setattr(pages_federations, "line_chart", record)
    client.get(f"/console/federations/{fid}/epsilon.svg")
    pld, rdp, budget = drawn[0]
    assert list(pld.x) == [1.0, 2.0] and list(pld.y) == pytest.approx(
        [r["epsilon_pld"] for r in rounds_api[:2]]
    )
    assert list(rdp.y) == pytest.approx([r["epsilon_rdp"] for r in rounds_api[:2]])
    assert list(budget.y) == [10.0, 10.0]

    registering = client.get(f"/console/federations/{waiting}").text
    assert "No round yet" in registering and "hospital-0" in registering
    missing = client.get("/console/federations/0123abcd")
    assert missing.status_code == 404 and "no federation" in missing.text
