"""``import pobo`` against real services: the documented notebook (docs/examples/sdk_notebook.py, shown in
docs/sdk.md) runs the demo's two-party flow; the wrappers' own behaviour (tables in, errors out, ``wait``
through a manual measurement, the optional pandas) on the same processes."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import runpy
import time
from pathlib import Path

import numpy as np
import pytest

import pobo
from pobo._tables import PANDAS_MISSING
from shared.protocol.client import CuratorClient, ModelerClient
from tests.e2e.conftest import SQLITE_ONLY, Services, write_csv

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "sdk_notebook.py"
HAS_PANDAS = importlib.util.find_spec("pandas") is not None


def _env(monkeypatch: pytest.MonkeyPatch, services: Services) -> None:
    monkeypatch.setenv("POBO_CURATOR_URL", services.curator.url)
    monkeypatch.setenv("POBO_CURATOR_TOKEN", services.admin_token)
    monkeypatch.setenv("POBO_MODELER_URL", services.modeler.url)
    monkeypatch.setenv("POBO_MODELER_TOKEN", services.modeler_token)


def test_the_docs_show_the_example_that_is_run() -> None:
    """docs/sdk.md carries the example verbatim: the text a reader copies is the text the next test runs."""
    assert EXAMPLE.read_text(encoding="utf-8").strip() in (ROOT / "docs" / "sdk.md").read_text(
        encoding="utf-8"
    )


@SQLITE_ONLY
def test_the_notebook_runs_the_two_party_flow(services: Services, monkeypatch: pytest.MonkeyPatch) -> None:
    _env(monkeypatch, services)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        ns = runpy.run_path(str(EXAMPLE), run_name="__main__")
    printed = out.getvalue()
    study, best, dataset, release = ns["study"], ns["best"], ns["dataset"], ns["release"]
    assert (dataset.n, dataset.d, dataset.features) == (4000, 7, ns["FEATURES"])
    assert study.status == "done" and study.iterations_done == 20
    # the SDK's answers are the API's models, and agree with what the typed clients read directly
    with ModelerClient(services.modeler.url, services.modeler_token) as direct:
        assert direct.get_study(study.id).best == best
        entries = direct.audit(study.id).entries
    assert len(ns["audit"].entries) == 20 == len(entries)
    assert best.y == max(e.y for e in entries) and best.index in {e.index for e in entries}
    with CuratorClient(services.curator.url, services.admin_token) as admin:
        queries = admin.list_queries(release.id).queries
        assert admin.get_partner(ns["partner"].id).queries_used == 20
    assert sorted(q.id for q in queries) == sorted(e.curator_query_id for e in entries)
    assert ns["ledger"].epsilon_spent == pytest.approx(1.0)
    assert f"best row {best.index} with recovery score {best.y:.2f}" in printed
    if HAS_PANDAS:
        assert list(ns["frame"]["y"]) == [e.y for e in entries]
    else:
        assert PANDAS_MISSING in printed and "pip install pandas" in PANDAS_MISSING


@SQLITE_ONLY
def test_tables_errors_and_a_manual_measurement(services: Services) -> None:
    csv = services.tmp / "data.csv"
    outcomes = write_csv(csv, n=60, d=3)
    X = np.loadtxt(csv, delimiter=",", skiprows=1)[:, :3]
    with (
        pobo.Curator(services.curator.url, services.admin_token) as curator,
        pobo.Modeler(services.modeler.url, services.modeler_token) as modeler,
    ):
        assert services.admin_token not in repr(curator) and services.modeler_token not in repr(modeler)
        # an array with its column names is uploaded as the CSV it would be; without names it is refused
        dataset = curator.upload(
            X, name="ward", columns=["x0", "x1", "x2"], objective_mode="manual", epsilon_budget=1.5
        )
        assert (dataset.n, dataset.d, dataset.features, dataset.objective_mode) == (
            60,
            3,
            ["x0", "x1", "x2"],
            "manual",
        )
        with pytest.raises(TypeError, match="columns="):
            curator.upload(X, name="nameless")
        with pytest.raises(ValueError, match="2 names for an array of 3 columns"):
            curator.upload(X, name="short", columns=["a", "b"])
        release = curator.release(dataset.id, epsilon=1.0, delta=1e-4)
        # the API's refusals arrive as the clients' errors, with the API's status and words
        with pytest.raises(pobo.CuratorError) as refused:
            curator.release(dataset.id, epsilon=1.0, delta=1e-4)  # 2 > the budget of 1.5
        assert refused.value.status_code == 409 and "budget" in refused.value.detail
        assert isinstance(refused.value, pobo.ApiError)
        assert curator.ledger(dataset.id).epsilon_spent == pytest.approx(1.0)  # nothing spent by the refusal
        with pytest.raises(pobo.ModelerApiError) as missing:
            modeler.study("no-such-study")
        assert missing.value.status_code == 404

        partner = curator.create_partner(name="lab", release_ids=[release.id], max_queries=2)
        assert [p.id for p in curator.partners().data] == [partner.id]
        assert dataset.id in curator.populations().data[0].dataset_ids
        study = modeler.create_study(
            curator_url=services.curator.url,
            release_id=release.id,
            curator_token=partner.token,
            iterations=2,
            hyperparameters={"lengthscale": 1.0, "signal_variance": 1.0, "noise_variance": 0.01},
        )
        modeler.run(study.id, iterations=1)
        # the run waits for the lab: wait() waits through it (and a short timeout says so) ...
        with pytest.raises(TimeoutError, match="after the timeout"):
            modeler.wait(study.id, timeout=0.3, progress=False)
        deadline = time.monotonic() + 60
        while not (pending := curator.pending_queries(release_id=release.id).data):
            assert time.monotonic() < deadline, "the study never asked for a measurement"
            time.sleep(0.05)
        assert modeler.study(study.id).status == "awaiting_measurement"
        (query,) = pending
        curator.post_result(query.id, float(outcomes[query.index]))
        # ... and returns once the one-iteration run is over: the study is ready for the next run
        after = modeler.wait(study.id, timeout=60, progress=False)
        assert (after.status, after.iterations_done) == ("ready", 1)
        assert after.best is not None and after.best.y == pytest.approx(outcomes[query.index])
        assert curator.pending_queries(release_id=release.id).count == 0
        if not HAS_PANDAS:
            with pytest.raises(ImportError, match="pip install pandas"):
                modeler.to_dataframe(study.id)


@SQLITE_ONLY
def test_a_federation_is_created_joined_and_started_from_the_sdk(services: Services) -> None:
    """``Modeler.create_federation``, ``add_agent``, ``start_federation``, then ``federation(s)`` read it."""
    with pobo.Modeler(services.modeler.url, services.modeler_token) as modeler:
        fed = modeler.create_federation(
            dimension=2,
            bounds=[(0, 1), (-2, 2)],
            rounds=2,
            P=2,
            M=8,
            q=1.0,
            z=5.0,
            S=1.0,
            epsilon_budget=10.0,
            round_seconds=60,
        )
        assert (fed.status, fed.params["rounds"]) == ("registering", 2)
        agents = [modeler.add_agent(fed.id, f"hospital-{k}") for k in range(2)]
        assert len({a.token for a in agents}) == 2 and all(a.token for a in agents)
        started = modeler.start_federation(fed.id)
        assert started.status == "running" and started.round == 1
        assert [f.id for f in modeler.federations().data] == [fed.id]
        assert modeler.federation(fed.id).status == "running"
        with pytest.raises(pobo.ModelerApiError) as late:
            modeler.add_agent(fed.id, "latecomer")  # the agent list is frozen at the start
        assert late.value.status_code == 409
