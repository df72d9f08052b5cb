"""Issue 31, deliverable 3: the privacy audit where partners are, through the curator's HTTP API.

The curator runs as a real process. The auditor uploads two neighbouring datasets (D and D': one person's
row moved by a norm just below 1 in scaled units; one person's outcome at the two ends of CTL's clipping
range), declared as two populations of distinct people (``acknowledge_distinct_people``: the fingerprint
rightly says they are the same people, and an audit has to pretend otherwise), makes releases and asks
queries as the admin and a partner would, downloads every release as a partner (the .npy with its sha256)
and reads every answer as the partner gets it: caching, budgets, populations and grants all on the path.

Each run's statistic is the audit's likelihood-ratio test (``shared.privacy.audit``), at a threshold fixed
in advance from the clean data (so no calibration runs are needed), and the bounds are the audit's own: one-
sided Clopper-Pearson at 99.9 %, turned into a bound on the claim's level (mu for the release, epsilon for
CTL). The sound path must stay within its claim; the same path run at twice the claimed level (the release
with half its noise, CTL at twice its epsilon, audited against the original claim) must be caught: that is
the power of the test, with 250 releases and 600 answers per dataset.
"""

from __future__ import annotations

import io
import math

import httpx
import numpy as np
import pytest

from shared.privacy.audit import Claim, clopper_pearson_upper
from shared.privacy.ctl import CTL
from shared.privacy.gaussian import calibrate
from shared.privacy.gdp import gdp_epsilon
from tests.e2e.conftest import SQLITE_ONLY, Services

pytestmark = [pytest.mark.slow, SQLITE_ONLY]

ALPHA = 1e-3
# Per dataset and per case. The service's noise is OS-keyed, so these runs are random: at these counts the
# controls are caught with probability above 0.9995 (simulated: 250 releases give a bound of ~1.31 +- 0.10
# on the half-noise release against its claim of 0.92; 600 answers ~1.40 against 1 for CTL at twice its
# epsilon, caught in 1999 of 2000 simulated runs, against 96.9 % with 400).
RELEASES = 250
ANSWERS = 600
EPSILON, DELTA = 4.0, 1e-5  # the release's claim: mu = 1 / z ~ 0.9, large enough for 200 runs to measure


def _csv(X: np.ndarray, y: np.ndarray | None = None) -> bytes:
    names = [f"x{j}" for j in range(X.shape[1])] + ([] if y is None else ["outcome"])
    rows = [",".join(names)]
    for i, row in enumerate(X):
        cells = [repr(float(v)) for v in row] + ([] if y is None else [repr(float(y[i]))])
        rows.append(",".join(cells))
    return ("\n".join(rows) + "\n").encode()


def _upload(http: httpx.Client, content: bytes, population: str, **form: str) -> dict:
    data = {
        "name": population,
        "population": population,
        "acknowledge_distinct_people": "true",
        "epsilon_budget": "1000000",
        "delta_budget": "0.5",
    } | form
    r = http.post("/v1/datasets", files={"file": ("d.csv", content, "text/csv")}, data=data)
    assert r.status_code == 201, r.text
    return r.json()


def _bound(claim: Claim, d_says_d2: int, d2_says_d: int, trials: int) -> float:
    """The audit's bound on the claim's level from error counts (99.9 %, both rates one-sided)."""
    fpr = clopper_pearson_upper(d_says_d2, trials, ALPHA / 2)
    fnr = clopper_pearson_upper(d2_says_d, trials, ALPHA / 2)
    return claim.level_lower_bound(fpr, fnr)


def test_release_audited_through_http(services: Services) -> None:
    rng = np.random.default_rng(31)
    n, d = 60, 2
    X = rng.normal(2.0, 3.0, size=(n, d))
    X2 = X.copy()
    X2[0, 0] += 1.0 - 1e-6
    Xc, X2c = X - X.mean(axis=0), X2 - X2.mean(axis=0)
    W = (X2c - Xc) / np.linalg.norm(X2c - Xc)
    shift = float(np.vdot(X2c - Xc, W))  # the two clean releases differ by this along W
    cal = calibrate(EPSILON, DELTA, d)
    claim = Claim("gdp", 1.0 / cal.noise_multiplier, EPSILON, DELTA)
    weak = gdp_epsilon(2.0 / cal.noise_multiplier, DELTA)  # the path with half the noise of the claim
    admin = httpx.Client(
        base_url=services.curator.url, headers={"Authorization": f"Bearer {services.admin_token}"}, timeout=60
    )
    datasets = {False: _upload(admin, _csv(X), "audit D"), True: _upload(admin, _csv(X2), "audit D'")}
    assert datasets[False]["population_id"] != datasets[True]["population_id"]
    made: dict[tuple[bool, float], list[int]] = {}
    for neighbour, ds in datasets.items():
        for eps in (EPSILON, weak):
            ids = []
            for _ in range(RELEASES):
                r = admin.post(f"/v1/datasets/{ds['id']}/releases", json={"epsilon": eps, "delta": DELTA})
                assert r.status_code == 201, r.text
                ids.append(r.json()["id"])
            made[(neighbour, eps)] = ids
    every = [i for ids in made.values() for i in ids]
    partner = admin.post("/v1/partners", json={"name": "auditor", "release_ids": every, "max_queries": 1})
    assert partner.status_code == 201, partner.text
    as_partner = httpx.Client(
        base_url=services.curator.url,
        headers={"Authorization": f"Bearer {partner.json()['token']}", "Accept": "application/x-npy"},
        timeout=60,
    )

    def statistic(release_id: int) -> float:
        r = as_partner.get(f"/v1/releases/{release_id}/rows")
        assert r.status_code == 200
        Z = np.load(io.BytesIO(r.content), allow_pickle=False)
        return float(np.vdot(Z - Xc, W))

    bounds = {}
    for eps in (EPSILON, weak):
        s0 = np.array([statistic(i) for i in made[(False, eps)]])
        s1 = np.array([statistic(i) for i in made[(True, eps)]])
        t = shift / 2  # the balanced threshold of the likelihood-ratio test, fixed in advance
        bounds[eps] = _bound(claim, int((s0 > t).sum()), int((s1 <= t).sum()), RELEASES)
    assert bounds[EPSILON] <= claim.level, bounds  # within its claim through the partner's path
    assert bounds[weak] > claim.level, bounds  # and the audit has the power to catch half the noise
    # the budgets and populations the audit spent are on the ledgers, each with its guarantee
    for ds in datasets.values():
        ledger = admin.get(f"/v1/datasets/{ds['id']}/ledger").json()
        assert len(ledger["entries"]) == 2 * RELEASES and ledger["formal_guarantee"] is True
        assert ledger["delta_spent"] == pytest.approx(2 * RELEASES * DELTA)


def test_outputs_audited_through_http(services: Services) -> None:
    rng = np.random.default_rng(32)
    n, B, R = 40, 1.0, 1.0
    X = rng.normal(size=(n, 2)) + 0.0123
    y = rng.uniform(-B, B, size=n)
    far = 10.0 * (B + R)
    y_d, y_d2 = y.copy(), y.copy()
    y_d[0], y_d2[0] = -far, far  # the person's outcome at either end: clipped to -(B + R) and B + R
    admin = httpx.Client(
        base_url=services.curator.url, headers={"Authorization": f"Bearer {services.admin_token}"}, timeout=60
    )
    releases = {}
    for neighbour, outcomes, label in ((False, y_d, "outputs D"), (True, y_d2, "outputs D'")):
        ds = _upload(admin, _csv(X, outcomes), label, objective="outcome")
        r = admin.post(f"/v1/datasets/{ds['id']}/releases", json={"epsilon": 1, "delta": 1e-6})
        assert r.status_code == 201, r.text
        releases[neighbour] = r.json()["id"]
    claimed = CTL(1.0, B=B, R=R)
    claim = Claim("pure", claimed.charged_epsilon, claimed.charged_epsilon, 0.0)

    def answers(epsilon: float, neighbour: bool, fresh: bool, count: int) -> np.ndarray:
        op = {"epsilon": epsilon, "B": B, "R": R}
        if fresh:
            op |= {"fresh_repeats": True, "max_epsilon_per_row": 1e6}
        grant = admin.post(
            "/v1/partners",
            json={
                "name": "auditor",
                "release_ids": [releases[neighbour]],
                "max_queries": count,
                "output_privacy": op,
            },
        )
        assert grant.status_code == 201, grant.text
        partner = httpx.Client(
            base_url=services.curator.url,
            headers={"Authorization": f"Bearer {grant.json()['token']}"},
            timeout=60,
        )
        got = []
        for _ in range(count):
            r = partner.post(f"/v1/releases/{releases[neighbour]}/queries", json={"index": 0})
            assert r.status_code == 201, r.text
            assert r.json()["cached"] is None  # a partner is never told
            got.append(r.json()["y"])
        return np.array(got)

    # a grant without fresh repeats answers a person once: its repeats are that answer, at no cost
    cached = answers(1.0, False, fresh=False, count=20)
    assert len(set(cached.tolist())) == 1
    bounds = {}
    for epsilon in (1.0, 2.0):  # the sound grant, and the same path at twice the claimed epsilon
        a0 = answers(epsilon, False, fresh=True, count=ANSWERS)
        a1 = answers(epsilon, True, fresh=True, count=ANSWERS)
        t = B + R  # the edge of the clipping range: where the Laplace likelihood ratio is largest
        bounds[epsilon] = _bound(claim, int((a0 > t).sum()), int((a1 <= t).sum()), ANSWERS)
    assert bounds[1.0] <= claim.level, bounds
    assert bounds[2.0] > claim.level, bounds
    # every fresh answer was charged to the person's output ledger
    ledger = admin.get(f"/v1/releases/{releases[False]}").json()
    led = admin.get(f"/v1/datasets/{ledger['dataset_id']}/ledger").json()["output"]
    assert led["answers_privatised"] == 1 + 2 * ANSWERS and led["answers_cached"] == 19
    assert math.isfinite(led["largest_person_total"])
