"""``pobo curator ...`` and ``pobo study ...`` (shared/tools/sdkcli.py) with typer's CliRunner against real
services: URLs and tokens from the environment or a private profile file, never from an argument."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from shared.protocol.client import ModelerClient
from shared.tools.cli import app
from tests.e2e.conftest import SQLITE_ONLY, Services, write_csv

pytestmark = pytest.mark.slow
UNSET: dict[str, str | None] = dict.fromkeys(
    ("POBO_CURATOR_URL", "POBO_CURATOR_TOKEN", "POBO_MODELER_URL", "POBO_MODELER_TOKEN", "POBO_PARTNER_TOKEN")
    + ("POBO_PROFILE", "XDG_CONFIG_HOME")
)


def _env(services: Services, **extra: str | None) -> dict[str, str | None]:
    return {
        **UNSET,
        "POBO_CURATOR_URL": services.curator.url,
        "POBO_CURATOR_TOKEN": services.admin_token,
        "POBO_MODELER_URL": services.modeler.url,
        "POBO_MODELER_TOKEN": services.modeler_token,
        **extra,
    }


def _json(runner: CliRunner, args: list[str], env: dict[str, str | None]) -> Any:
    result = runner.invoke(app, [*args, "--json"], env=env)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@SQLITE_ONLY
def test_the_commands_run_a_study_with_a_lab(services: Services, tmp_path: Path) -> None:
    runner = CliRunner()
    env = _env(services)
    csv = tmp_path / "ward.csv"
    outcomes = write_csv(csv, n=60, d=3)
    dataset = _json(
        runner,
        ["curator", "upload", str(csv), "--name", "ward", "--features", "x0,x1,x2"]
        + ["--objective-mode", "manual", "--epsilon-budget", "1.5"],
        env,
    )
    assert (dataset["n"], dataset["d"], dataset["objective_mode"]) == (60, 3, "manual")
    release = _json(
        runner, ["curator", "release", str(dataset["id"]), "--epsilon", "1", "--delta", "1e-4"], env
    )
    # over the budget: the curator's refusal, its words, exit status 1, nothing spent
    refused = runner.invoke(
        app, ["curator", "release", str(dataset["id"]), "--epsilon", "1", "--delta", "1e-4"], env=env
    )
    assert refused.exit_code == 1 and "409" in refused.output and "budget" in refused.output
    ledger = _json(runner, ["curator", "ledger", str(dataset["id"])], env)
    assert ledger["epsilon_spent"] == pytest.approx(1.0) and len(ledger["entries"]) == 1
    partner = _json(
        runner,
        ["curator", "partner", "--name", "lab", "--release", str(release["id"]), "--max-queries", "3"],
        env,
    )
    assert partner["token"]
    assert _json(runner, ["curator", "grant", str(partner["id"]), "--release", str(release["id"])], env)[
        "release_ids"
    ] == [release["id"]]

    study_env = {**env, "POBO_PARTNER_TOKEN": partner["token"]}
    bad = runner.invoke(
        app, ["study", "create", "--release", "1", "--iterations", "2", "--params", "{"], env=study_env
    )
    assert bad.exit_code == 2 and "--params is not a JSON object" in bad.output
    study = _json(
        runner,
        ["study", "create", "--release", str(release["id"]), "--iterations", "2", "--strategy", "random"],
        study_env,
    )
    assert (study["status"], study["iterations_total"], study["curator_url"]) == (
        "ready",
        2,
        services.curator.url,
    )
    assert partner["token"] not in json.dumps(study)
    _json(runner, ["study", "run", study["id"], "--iterations", "1"], env)
    deadline = time.monotonic() + 60
    while not (
        pending := _json(runner, ["curator", "queries", "--release", str(release["id"])], env)["data"]
    ):
        assert time.monotonic() < deadline, "no query waited for a measurement"
        time.sleep(0.05)
    (query,) = pending
    human = runner.invoke(app, ["curator", "queries"], env=env)  # the table names the query too
    assert human.exit_code == 0 and "1 pending queries" in human.output
    answered = _json(
        runner, ["curator", "answer", str(query["id"]), str(float(outcomes[query["index"]]))], env
    )
    assert (answered["status"], answered["y"]) == ("complete", pytest.approx(outcomes[query["index"]]))
    watched = _json(runner, ["study", "watch", study["id"], "--timeout", "60"], env)
    assert (watched["status"], watched["iterations_done"]) == ("ready", 1)
    assert watched["best"]["y"] == pytest.approx(outcomes[query["index"]])
    # the second iteration's measurement comes from the lab's CSV (answer --file: one transaction)
    _json(runner, ["study", "run", study["id"]], env)
    deadline = time.monotonic() + 60
    while not (pending := _json(runner, ["curator", "queries"], env)["data"]):
        assert time.monotonic() < deadline, "no second query waited for a measurement"
        time.sleep(0.05)
    (second,) = pending
    results = tmp_path / "results.csv"
    results.write_text(f"query_id,y\n{second['id']},{float(outcomes[second['index']])}\n", encoding="utf-8")
    assert _json(runner, ["curator", "answer", "--file", str(results)], env)["count"] == 1
    done = _json(runner, ["study", "watch", study["id"], "--timeout", "60"], env)
    assert (done["status"], done["iterations_done"]) == ("done", 2)
    shown = _json(runner, ["study", "show", study["id"]], env)
    assert shown == done
    # without --json: tables that name what was asked for
    for args, expected in (
        (["study", "show", study["id"]], "done"),
        (["study", "list"], study["id"]),
        (["curator", "ledger", str(dataset["id"])], "epsilon_spent"),
    ):
        table = runner.invoke(app, args, env=env)
        assert table.exit_code == 0 and expected in table.output, table.output
    assert [s["id"] for s in _json(runner, ["study", "list"], env)["data"]] == [study["id"]]

    out_csv, out_json = tmp_path / "audit.csv", tmp_path / "audit.json"
    assert runner.invoke(app, ["study", "export", study["id"], "-o", str(out_csv)], env=env).exit_code == 0
    assert (
        runner.invoke(
            app, ["study", "export", study["id"], "-o", str(out_json), "--format", "json"], env=env
        ).exit_code
        == 0
    )
    with ModelerClient(services.modeler.url, services.modeler_token) as direct:
        assert out_csv.read_bytes() == direct.audit_csv(study["id"])
        assert json.loads(out_json.read_text())["entries"] == [
            json.loads(e.model_dump_json()) for e in direct.audit(study["id"]).entries
        ]
    missing = runner.invoke(app, ["study", "show", "no-such-study"], env=env)
    assert missing.exit_code == 1 and "404" in missing.output


def test_without_a_url_or_token_the_commands_say_where_to_put_them(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["study", "list"], env={**UNSET, "XDG_CONFIG_HOME": str(tmp_path)})
    assert result.exit_code == 2
    assert "POBO_MODELER_URL and POBO_MODELER_TOKEN" in result.output
    assert str(tmp_path / "pobo" / "profile.toml") in result.output


def test_a_profile_others_can_read_is_refused_with_the_chmod(tmp_path: Path) -> None:
    profile = tmp_path / "profile.toml"
    profile.write_text('[modeler]\nurl = "http://127.0.0.1:9"\ntoken = "secret-token"\n', encoding="utf-8")
    os.chmod(profile, 0o644)
    result = CliRunner().invoke(app, ["study", "list"], env={**UNSET, "POBO_PROFILE": str(profile)})
    assert result.exit_code == 2
    assert f"chmod 600 {profile}" in result.output and "0644" in result.output
    assert "secret-token" not in result.output


@SQLITE_ONLY
def test_a_private_profile_is_read(services: Services, tmp_path: Path) -> None:
    profile = tmp_path / "profile.toml"
    profile.write_text(
        f'[modeler]\nurl = "{services.modeler.url}"\ntoken = "{services.modeler_token}"\n', encoding="utf-8"
    )
    os.chmod(profile, 0o600)
    result = CliRunner().invoke(app, ["study", "list", "--json"], env={**UNSET, "POBO_PROFILE": str(profile)})
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"data": [], "count": 0}
    # the environment wins over the profile: a wrong token there is what the modeler sees
    wrong = CliRunner().invoke(
        app, ["study", "list"], env={**UNSET, "POBO_PROFILE": str(profile), "POBO_MODELER_TOKEN": "wrong"}
    )
    assert wrong.exit_code == 1 and "401" in wrong.output
