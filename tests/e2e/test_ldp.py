"""Output privacy through real services: an LDP MoMA-GP-UCB study against a grant with CTL answers, the
modeler killed in the middle of an epoch (some of the epoch's plays measured) and resumed; the grant checks
made at creation; the curator's per-row output ledger."""

from __future__ import annotations

import time
from typing import Any

import pytest

from shared.privacy.ctl import CTL
from shared.protocol.client import CuratorClient
from tests.e2e.conftest import SQLITE_ONLY, Services, write_csv
from tests.e2e.test_strategies import body, reconciled
from tests.e2e.test_two_party import wait_status

pytestmark = pytest.mark.slow

OP = {"epsilon": 1.0, "B": 1.0, "R": 0.5}
K, EPOCHS = 4, 3
PARAMS = {**OP, "k": K, "kernel": "se", "lengthscale": 1.0}


def measured(index: int) -> float:
    """What the lab measures for a row (the raw outcome; it must never reach the modeler)."""
    return 0.123456789 + 0.001 * index


def post_pending(admin: Any, release_id: int, limit: int | None = None) -> int:
    posted = 0
    for q in admin.list_queries(release_id).queries:
        if q.status == "pending" and not q.cached and (limit is None or posted < limit):
            admin.post_result(q.id, measured(q.index))
            posted += 1
    return posted


@SQLITE_ONLY  # the subject is the strategy's replay mid-epoch; the rounds' SQL runs on PostgreSQL elsewhere
def test_ldp_moma_study_survives_a_restart_mid_epoch(services: Services) -> None:
    charge = CTL(**OP).charged_epsilon
    csv = services.tmp / "lab.csv"
    write_csv(csv, n=120, d=3)
    with services.admin() as admin:
        dataset = admin.upload_dataset(csv, name="lab", features=["x0", "x1", "x2"], objective_mode="manual")
        release = admin.create_release(dataset.id, epsilon=1.0, delta=1e-4)
        cached = admin.create_partner("cached", release_ids=[release.id], max_queries=50, output_privacy=OP)
        tight = admin.create_partner(
            "tight",
            release_ids=[release.id],
            max_queries=50,
            output_privacy={**OP, "fresh_repeats": True, "max_epsilon_per_row": 3 * charge},
        )
        raw = admin.create_partner("raw", release_ids=[release.id], max_queries=50)
        partner = admin.create_partner(
            "ldp lab",
            release_ids=[release.id],
            max_queries=K * EPOCHS,  # no slack: a play charged twice would fail the study
            output_privacy={**OP, "fresh_repeats": True, "max_epsilon_per_row": K * EPOCHS * charge},
        )
    with services.modeler_http() as http:
        iterations = K * EPOCHS
        refused = {
            "cached": http.post(
                "/v1/studies", json=body(services, release, cached, "ldp-moma-gp-ucb", iterations, **PARAMS)
            ),
            "tight": http.post(
                "/v1/studies", json=body(services, release, tight, "ldp-moma-gp-ucb", iterations, **PARAMS)
            ),
            "raw": http.post(
                "/v1/studies", json=body(services, release, raw, "ldp-moma-gp-ucb", iterations, **PARAMS)
            ),
            "eps": http.post(
                "/v1/studies",
                json=body(
                    services, release, partner, "ldp-moma-gp-ucb", iterations, **{**PARAMS, "epsilon": 2.0}
                ),
            ),
        }
        assert {name: r.status_code for name, r in refused.items()} == dict.fromkeys(refused, 422)
        assert "fresh_repeats is false" in refused["cached"].json()["detail"]
        assert "set strategy_params.k to at most 3" in refused["tight"].json()["detail"]
        assert "'moma-gp-ucb'" in refused["raw"].json()["detail"]
        assert "differ from the curator's grant" in refused["eps"].json()["detail"]

        study = http.post(
            "/v1/studies", json=body(services, release, partner, "ldp-moma-gp-ucb", iterations, **PARAMS)
        )
        assert study.status_code == 201, study.text
        assert study.json()["strategy_params"]["exclude_queried"] is False  # repeats answered afresh
        sid = study.json()["id"]
        assert http.post(f"/v1/studies/{sid}/run").status_code == 202
        first = wait_status(http, sid, {"awaiting_measurement", "failed"})
        assert first["status"] == "awaiting_measurement", first
    with services.admin() as admin:
        deadline = time.monotonic() + 30
        while len([q for q in admin.list_queries(release.id).queries if q.partner_id == partner.id]) < K:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert post_pending(admin, release.id, limit=2) == 2  # half of the first epoch is measured...
    services.modeler.kill()  # ...when the modeler dies
    services.new_modeler()
    with services.modeler_http() as http, services.admin() as admin:
        assert http.post(f"/v1/studies/{sid}/run").status_code == 202
        deadline = time.monotonic() + 90
        while (s := http.get(f"/v1/studies/{sid}").json())["status"] not in ("done", "failed"):
            post_pending(admin, release.id)
            assert time.monotonic() < deadline, s
            time.sleep(0.05)
        assert (s["status"], s["iterations_done"], s["rounds_done"]) == ("done", iterations, EPOCHS), s
        audit = http.get(f"/v1/studies/{sid}/audit").json()["entries"]
        assert http.get(f"/v1/studies/{sid}/audit/verify").json()["ok"]
        queries = [q for q in admin.list_queries(release.id).queries if q.partner_id == partner.id]
        output = admin.ledger(dataset.id).output
        assert output is not None
        ledger = output.model_dump()
    assert [(e["round"], e["request"]) for e in audit] == [
        (r, j) for r in range(1, EPOCHS + 1) for j in range(K)
    ]
    for r in range(1, EPOCHS + 1):
        assert len({e["index"] for e in audit if e["round"] == r}) == 1  # an epoch plays one row k times
    assert len(queries) == iterations  # nothing asked (or charged) twice across the restart
    assert all(q.charged_epsilon == pytest.approx(charge) and not q.cached for q in queries)
    # the modeler saw only privatised answers: fresh noise per play, never the lab's measurement
    assert not {round(e["y"], 9) for e in audit} & {round(measured(i), 9) for i in range(120)}
    assert len({e["y"] for e in audit}) == iterations
    plays: dict[int, int] = {}
    for e in audit:
        plays[e["index"]] = plays.get(e["index"], 0) + 1
    assert {(row["index"], row["answers"]) for row in ledger["rows"]} == set(plays.items())
    for row in ledger["rows"]:
        assert row["epsilon"] == pytest.approx(plays[row["index"]] * charge)
    assert ledger["largest_person_total"] == pytest.approx(max(plays.values()) * charge)
    assert ledger["unbounded"] is False and ledger["answers_privatised"] == iterations
    means = {r: sum(e["y"] for e in audit if e["round"] == r) / K for r in range(1, EPOCHS + 1)}
    best_round = max(means, key=lambda r: means[r])
    assert s["best"]["y"] == pytest.approx(means[best_round])  # an epoch counts with the mean of its plays
    assert s["best"]["index"] == next(e["index"] for e in audit if e["round"] == best_round)
    assert reconciled(services, sid)


@SQLITE_ONLY  # the subject is the study's parameters against the grant, not the database
def test_an_ldp_tgp_study_takes_epsilon_b_and_r_from_the_grant(services: Services) -> None:
    """Issue 32: an ``ldp-tgp-ucb`` study created without epsilon, B and R runs against a grant with output
    privacy; the study records the grant's values."""
    csv = services.tmp / "tgp.csv"
    write_csv(csv, n=60, d=2)
    with services.admin() as admin:
        dataset = admin.upload_dataset(csv, name="tgp", objective="objective")
        release = admin.create_release(dataset.id, epsilon=1.0, delta=1e-4)
        partner = admin.create_partner("tgp lab", release_ids=[release.id], max_queries=8, output_privacy=OP)
    with services.modeler_http() as http:
        created = http.post("/v1/studies", json=body(services, release, partner, "ldp-tgp-ucb", 8))
        assert created.status_code == 201, created.text
        study = created.json()
        assert {k: study["strategy_params"][k] for k in OP} == OP  # the values used, recorded
        assert study["strategy_params"]["exclude_queried"] is True  # a repeat: answered from the cache
        other = http.post("/v1/studies", json=body(services, release, partner, "ldp-tgp-ucb", 8, R=1.0))
        assert other.status_code == 422 and "R = 1 differ" in other.json()["detail"]
        # GP-UCB's fit takes the grant's output noise as its floor (2 b^2, b the Laplace scale), recorded
        gp = http.post("/v1/studies", json=body(services, release, partner, "gp-ucb", 8))
        assert gp.status_code == 201, gp.text
        floor = gp.json()["strategy_params"]["noise_variance_floor"]
        assert floor == pytest.approx(2 * CTL(**OP).scale ** 2, rel=1e-12)
        assert http.post(f"/v1/studies/{study['id']}/run").status_code == 202
        done = wait_status(http, study["id"], {"done", "failed"})
    assert (done["status"], done["iterations_done"]) == ("done", 8), done
    assert reconciled(services, study["id"])


@SQLITE_ONLY
def test_an_output_private_study_skips_rows_its_grant_cannot_afford(services: Services) -> None:
    """Issue 34: rows answered raw to another partner do not stop an output-private study, and a row whose
    person's allotment under the study's grant is used up is refused (nothing charged), excluded, and the
    study goes on to done; its best is labelled noisy, with the posterior mean beside it."""
    charge = CTL(**OP).charged_epsilon
    csv = services.tmp / "excl.csv"
    write_csv(csv, n=60, d=2)
    with services.admin() as admin:
        dataset = admin.upload_dataset(csv, name="excl", objective="objective")
        release = admin.create_release(dataset.id, epsilon=1.0, delta=1e-4)
        raw = admin.create_partner("raw lab", release_ids=[release.id], max_queries=60)
        capped = {**OP, "fresh_repeats": True, "max_epsilon_per_row": charge}  # one answer per person
        private = admin.create_partner(
            "ldp lab", release_ids=[release.id], max_queries=60, output_privacy=capped
        )
    with CuratorClient(services.curator.url, raw.token) as other:
        for index in range(60):  # every person's outcome disclosed raw to another partner
            other.create_query(release.id, index)
    with CuratorClient(services.curator.url, private.token) as own:
        for index in range(48):  # this grant's own answers use up rows 0..47 (the study's first choice: 0)
            own.create_query(release.id, index)
    with services.modeler_http() as http:
        created = http.post("/v1/studies", json=body(services, release, private, "ldp-tgp-ucb", 10))
        assert created.status_code == 201, created.text
        study = created.json()
        assert http.post(f"/v1/studies/{study['id']}/run").status_code == 202
        done = wait_status(http, study["id"], {"done", "failed"})
        assert (done["status"], done["iterations_done"]) == ("done", 10), done
        rows = [e["index"] for e in http.get(f"/v1/studies/{study['id']}/audit").json()["entries"]]
        best = done["best"]
    assert all(i >= 48 for i in rows) and len(set(rows)) == 10  # refused rows never recorded, none twice
    assert best["noisy"] is True and isinstance(best["posterior_mean"], float)
    with services.admin() as admin:
        assert admin.get_partner(private.id).queries_used == 48 + 10  # no refusal was charged
    assert reconciled(services, study["id"])
