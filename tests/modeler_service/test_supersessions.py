"""Supersessions in the modeler's audit log: values of a measured (``manual``) study that the curator's lab
changed after the study had been sent them. Recorded once each (``POST .../audit/sync`` and the runner), in a
hash chain of their own that ``GET .../audit/verify`` checks; the strategy is rebuilt on the latest values;
``pobo reconcile``'s comparison accepts what was recorded and names what was not."""

from __future__ import annotations

import time
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from modeler_service import rounds, service
from modeler_service.config import Settings
from modeler_service.db import transaction
from shared.bo.strategies import round_rng
from shared.protocol.schemas import QueryLogVerification, QueryPublic
from shared.tools.reconcile import Supersession, compare_release_logs
from tests.modeler_service.conftest import study_body
from tests.modeler_service.fake_curator import FakeCurator
from tests.modeler_service.test_studies import wait_for

FIXED = {"lengthscale": 1.0, "signal_variance": 1.0, "noise_variance": 1e-4}


def measured_study(client: TestClient, curator: FakeCurator, iterations: int = 3) -> str:
    """A gp-ucb study on a manual dataset, run to done while the lab measures each row as f(row)."""
    curator.manual = True
    body = study_body(iterations=iterations, initial_points=2, hyperparameters=FIXED)
    sid = str(client.post("/v1/studies", json=body).json()["id"])
    assert client.post(f"/v1/studies/{sid}/run").status_code == 202
    measure(client, curator, sid)
    return sid


def measure(client: TestClient, curator: FakeCurator, sid: str) -> dict[str, Any]:
    """The lab measures every pending query until the study's run ends."""
    deadline = time.monotonic() + 30
    while True:
        for q in curator.pending():
            curator.post_result(q["id"], float(curator.f[q["index"]]))
        study = client.get(f"/v1/studies/{sid}").json()
        if study["status"] in {"done", "ready", "failed"}:
            assert study["status"] != "failed", study["error"]
            return dict(study)
        assert time.monotonic() < deadline, study
        time.sleep(0.01)


def sync(client: TestClient, sid: str) -> dict[str, Any]:
    resp = client.post(f"/v1/studies/{sid}/audit/sync")
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def audit(client: TestClient, sid: str) -> dict[str, Any]:
    return dict(client.get(f"/v1/studies/{sid}/audit").json())


def verify(client: TestClient, sid: str) -> dict[str, Any]:
    return dict(client.get(f"/v1/studies/{sid}/audit/verify").json())


def sql(settings: Settings, statement: str, **params: Any) -> None:
    engine = create_engine(settings.resolved_database_url())
    with engine.begin() as conn:
        conn.execute(text(statement), params)
    engine.dispose()


def test_a_supersession_is_recorded_once_beside_the_value_sent(
    client: TestClient, curator: FakeCurator
) -> None:
    sid = measured_study(client, curator)
    entries = audit(client, sid)["entries"]
    first = entries[1]
    sent = first["y"]
    change = curator.supersede(first["curator_query_id"], sent - 0.25)
    assert sync(client, sid) == {"recorded": 1, "supersessions": 1}
    assert sync(client, sid) == {"recorded": 0, "supersessions": 1}  # a repeat records nothing more
    log = audit(client, sid)
    assert log["entries"] == entries  # every entry keeps the value it was sent, and its place
    [s] = log["supersessions"]
    assert (s["seq"], s["correction_id"], s["curator_query_id"]) == (
        1,
        change["id"],
        first["curator_query_id"],
    )
    assert (s["audit_seq"], s["round"], s["request"], s["index"]) == (2, 2, 0, first["index"])
    assert (s["previous_y"], s["y"]) == (sent, sent - 0.25)
    assert verify(client, sid) == {
        "ok": True,
        "entries": 3,
        "first_bad_seq": None,
        "supersessions": 1,
        "first_bad_supersession_seq": None,
    }
    # a second change of the same value chains from the first: previous_y is the value the first gave
    curator.supersede(first["curator_query_id"], 0.125)
    assert sync(client, sid) == {"recorded": 1, "supersessions": 2}
    second = audit(client, sid)["supersessions"][1]
    assert (second["seq"], second["previous_y"], second["y"], second["prev_hash"]) == (
        2,
        sent - 0.25,
        0.125,
        s["hash"],
    )
    assert verify(client, sid)["ok"]
    study = client.get(f"/v1/studies/{sid}").json()
    assert study["iterations_done"] == 3  # the iteration numbering is the queries' alone


def test_verify_catches_an_edited_or_deleted_supersession(
    client: TestClient, curator: FakeCurator, settings: Settings
) -> None:
    sid = measured_study(client, curator)
    for entry in audit(client, sid)["entries"][:2]:
        curator.supersede(entry["curator_query_id"], 2.0 + entry["seq"])
    assert sync(client, sid)["recorded"] == 2 and verify(client, sid)["ok"]
    sql(settings, "UPDATE modeler_audit_supersessions SET y = 9.5 WHERE study_id = :s AND seq = 2", s=sid)
    assert verify(client, sid) == {
        "ok": False,
        "entries": 3,
        "first_bad_seq": None,
        "supersessions": 2,
        "first_bad_supersession_seq": 2,
    }
    sql(settings, "UPDATE modeler_audit_supersessions SET y = 4.0 WHERE study_id = :s AND seq = 2", s=sid)
    assert verify(client, sid)["ok"]  # the value as recorded again: the chain checks out
    sql(settings, "DELETE FROM modeler_audit_supersessions WHERE study_id = :s AND seq = 2", s=sid)
    found = verify(client, sid)  # the last one deleted: the study's stored length and head tell
    assert (found["ok"], found["supersessions"], found["first_bad_supersession_seq"]) == (False, 1, 2)


def _plans(app: Any, sid: str, round_no: int) -> tuple[int, int, int | None]:
    """The next round's row as planned on the corrected values and on the values as sent, and the row of
    the cached strategy's plan (None: no cached strategy)."""
    ctx = app.state.components.ctx
    with transaction(ctx.db, write=False) as session:
        study = service.get_study(session, sid)
        Z = ctx.state(study).inputs
        corrected = rounds.recorded_rounds(session, sid, superseded=study.supersessions_done)
        sent = rounds.recorded_rounds(session, sid)
    rows = [
        rounds.new_strategy(study, Z, history).plan(budget=1, rng=round_rng(study.seed, round_no))[0].index
        for history in (corrected, sent)
    ]
    cached = ctx.cache.get(sid).strategy
    row = None if cached is None else cached.plan(budget=1, rng=round_rng(study.seed, round_no))[0].index
    return rows[0], rows[1], row


def test_the_strategy_is_rebuilt_on_the_corrected_value(
    app: Any, client: TestClient, curator: FakeCurator
) -> None:
    sid = measured_study(client, curator, iterations=4)
    best = client.get(f"/v1/studies/{sid}").json()["best"]
    entry = next(e for e in audit(client, sid)["entries"] if e["index"] == best["index"])
    assert _plans(app, sid, 5)[2] is not None  # the run left its strategy cached
    curator.supersede(entry["curator_query_id"], -5.0)  # the best row was mis-measured: far worse
    assert sync(client, sid)["recorded"] == 1
    with_corrected, as_sent, cached = _plans(app, sid, 5)
    assert cached is None  # dropped: the next round rebuilds from the audit log
    assert with_corrected != as_sent  # the correction matters to the next choice (the test has teeth)
    resp = client.patch(f"/v1/studies/{sid}", json={"iterations": 5})
    assert resp.status_code == 200, resp.text
    step = client.post(f"/v1/studies/{sid}/step").json()
    assert step["index"] == with_corrected
    curator.post_result(step["curator_query_id"], 0.5)
    assert wait_for(client, sid, {"done"})["iterations_done"] == 5


def test_the_runner_records_supersessions_after_a_round_that_waited(
    client: TestClient, curator: FakeCurator
) -> None:
    curator.manual = True
    body = study_body(iterations=3, initial_points=2, hyperparameters=FIXED)
    sid = client.post("/v1/studies", json=body).json()["id"]
    assert client.post(f"/v1/studies/{sid}/run").status_code == 202
    deadline = time.monotonic() + 30
    while len(curator.queries) < 2 or not curator.pending():  # round 1 recorded, round 2 waiting
        for q in curator.pending():
            curator.post_result(q["id"], 0.5)
        assert time.monotonic() < deadline
        time.sleep(0.01)
    curator.supersede(1, 0.75)  # the lab re-measures round 1's sample while round 2 is measured
    measure(client, curator, sid)
    [s] = audit(client, sid)["supersessions"]  # recorded by the runner: no sync asked for
    assert (s["curator_query_id"], s["previous_y"], s["y"], s["audit_seq"]) == (1, 0.5, 0.75, 1)


def test_a_study_whose_outcomes_come_from_a_column_never_asks(
    client: TestClient, curator: FakeCurator
) -> None:
    sid = client.post("/v1/studies", json=study_body(iterations=4)).json()["id"]
    assert client.post(f"/v1/studies/{sid}/run").status_code == 202
    assert wait_for(client, sid, {"done", "failed"})["status"] == "done"
    assert not [r for r in curator.requests if r.url.path.endswith("/corrections")]
    assert sync(client, sid) == {"recorded": 0, "supersessions": 0}  # asked on demand: nothing to record


def test_another_studys_supersession_and_a_round_in_flight(
    app: Any, client: TestClient, curator: FakeCurator
) -> None:
    """The partner's token serves two studies on the release: each records its own. A change of a query of
    the round in flight holds back the changes after it until that round is recorded (the chain keeps the
    curator's order); it is then recorded, or not at all when the study was sent the new value."""
    one = measured_study(client, curator, iterations=2)
    other = client.post("/v1/studies", json=study_body(iterations=3, hyperparameters=FIXED)).json()["id"]
    first = client.post(f"/v1/studies/{other}/step").json()  # round 1, measured and recorded
    assert measure(client, curator, other)["iterations_done"] == 1
    components = app.state.components
    step = components.stepper.step(other, wait=False, claim=True, settle_at=0)  # no runner: in flight
    assert step is not None and step.status == "pending"
    qid = step.curator_query_id
    curator.supersede(1, 0.25)  # one's query
    curator.post_result(qid, 0.5)
    curator.supersede(qid, 0.625)  # other's round in flight: changed before the modeler read it
    curator.supersede(first["curator_query_id"], 0.375)  # other's round 1: after the one in flight
    assert sync(client, other) == {"recorded": 0, "supersessions": 0}  # one's skipped; its own wait
    assert sync(client, one) == {"recorded": 1, "supersessions": 1}
    components.runners.start(other)  # the round in flight is read now: its value is the new one
    assert measure(client, curator, other)["iterations_done"] == 2  # (a step: one round)
    entries = audit(client, other)["entries"]
    assert [e["y"] for e in entries if e["curator_query_id"] == qid] == [0.625]
    # recorded by the runner after the round's record, which already shows the run as ended: wait for it
    deadline = time.monotonic() + 10
    while not audit(client, other)["supersessions"]:
        assert time.monotonic() < deadline, "the runner never recorded the supersession"
        time.sleep(0.01)
    [s] = audit(client, other)["supersessions"]
    assert (s["curator_query_id"], s["y"]) == (first["curator_query_id"], 0.375)
    assert sync(client, other) == {"recorded": 0, "supersessions": 1}


def test_sync_errors(client: TestClient, curator: FakeCurator) -> None:
    assert client.post("/v1/studies/nope/audit/sync").status_code == 404
    sid = measured_study(client, curator, iterations=2)
    curator.fail_next = [401]
    resp = client.post(f"/v1/studies/{sid}/audit/sync")
    assert resp.status_code == 422 and "refused the study's partner token" in resp.json()["detail"]
    curator.fail_next = [409]
    resp = client.post(f"/v1/studies/{sid}/audit/sync")
    assert resp.status_code == 409 and "corrections of release 1" in resp.json()["detail"]


def test_reconcile_accepts_a_recorded_supersession_and_names_a_missing_one(
    client: TestClient, curator: FakeCurator
) -> None:
    sid = measured_study(client, curator, iterations=2)
    qid = audit(client, sid)["entries"][0]["curator_query_id"]
    change = curator.supersede(qid, 1.5)

    def compare() -> Any:
        log = audit(client, sid)
        queries = [QueryPublic.model_validate(q) for q in curator.queries]
        chain = QueryLogVerification(ok=True, entries=len(queries), first_bad_seq=None, head="0" * 64)
        return compare_release_logs(
            sid, 1, log["entries"], verify(client, sid), queries, chain, supersessions=log["supersessions"]
        )

    missing = compare()  # not synced yet
    assert [(m.query_id, m.kind) for m in missing.mismatches] == [
        (qid, "supersession not in the modeler's audit")
    ]
    sync(client, sid)
    report = compare()
    assert report.ok and report.modeler_entries == 2
    assert report.supersessions == [Supersession(qid, change["id"], change["previous_y"], 1.5)]


def test_a_rebuild_observes_the_latest_of_several_values(
    app: Any, client: TestClient, curator: FakeCurator
) -> None:
    sid = measured_study(client, curator, iterations=2)
    qid = audit(client, sid)["entries"][0]["curator_query_id"]
    for y in (0.25, 0.375):
        curator.supersede(qid, y)
    sync(client, sid)
    ctx = app.state.components.ctx
    with transaction(ctx.db, write=False) as session:
        study = service.get_study(session, sid)
        history = rounds.recorded_rounds(session, sid, superseded=study.supersessions_done)
        plain = rounds.recorded_rounds(session, sid)
    assert [a.y for r in history for a in r][0] == 0.375
    assert [a.y for r in plain for a in r][0] == audit(client, sid)["entries"][0]["y"]
