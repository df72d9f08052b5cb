"""The pilot deployment: compose.yaml, .env.example and the Dockerfile.

No Docker engine runs on our machines, so these tests check the pieces compose uses: the file parses, it runs
the same entry points the end-to-end tests start as real processes (``pobo curator serve`` /
``pobo modeler serve``, against PostgreSQL in CI), every ``POBO_*`` variable it sets is a real setting of the
service it is given to, every secret comes from ``.env``, and nothing is published beyond loopback.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from curator_service.config import Settings as CuratorSettings
from modeler_service.config import Settings as ModelerSettings
from shared.cli import app

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "compose.yaml").read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def _env_example() -> dict[str, str]:
    out: dict[str, str] = {}
    for line in (ROOT / ".env.example").read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def test_compose_has_postgres_16_with_volume_and_healthcheck(compose: dict[str, Any]) -> None:
    db = compose["services"]["db"]
    assert db["image"].startswith("postgres:16")
    assert any(v.endswith(":/var/lib/postgresql/data") for v in db["volumes"])
    assert db["volumes"][0].split(":")[0] in compose["volumes"]
    assert "pg_isready" in " ".join(db["healthcheck"]["test"])
    assert "ports" not in db, "the database must not be published on the host"


@pytest.mark.parametrize(
    ("service", "settings_cls", "prefix"),
    [("curator", CuratorSettings, "POBO_CURATOR_"), ("modeler", ModelerSettings, "POBO_MODELER_")],
)
def test_compose_service_runs_the_tested_entry_point(
    compose: dict[str, Any], service: str, settings_cls: type, prefix: str
) -> None:
    svc = compose["services"][service]
    assert svc["command"][:3] == ["pobo", service, "serve"]
    # The entry point exists and takes the options compose passes.
    opts = svc["command"][3:]
    assert "--host" in opts and "--port" in opts
    result = CliRunner().invoke(app, [service, "serve", "--help"])
    assert result.exit_code == 0, result.output
    assert "--host" in result.output and "--port" in result.output
    # Every POBO_<SERVICE>_* variable is a field of its settings (a typo would be silently ignored).
    fields = set(settings_cls.model_fields)
    env = svc["environment"]
    ours = [k for k in env if k.startswith(prefix)]
    assert ours, f"{service} gets no {prefix}* settings"
    for key in ours:
        assert key[len(prefix) :].lower() in fields, f"{key} is not a setting of the {service} service"
    assert env[f"{prefix}DATABASE_URL"].startswith("postgresql+psycopg://")
    assert svc["depends_on"]["db"]["condition"] == "service_healthy"
    # Published ports are bound to loopback only, and match the port the service listens on.
    port = opts[opts.index("--port") + 1]
    for mapping in svc["ports"]:
        host_ip, _host_port, container_port = mapping.split(":")
        assert host_ip == "127.0.0.1"
        assert container_port == port
    # Data lives in a named volume.
    assert any(v.split(":")[0] in compose["volumes"] for v in svc["volumes"])


def test_compose_secrets_come_from_env_file(compose: dict[str, Any]) -> None:
    text = (ROOT / "compose.yaml").read_text(encoding="utf-8")
    referenced = set(re.findall(r"\$\{([A-Z0-9_]+)", text))
    example = _env_example()
    assert referenced, "compose.yaml should take its secrets from .env"
    assert referenced <= set(example), f"missing from .env.example: {sorted(referenced - set(example))}"
    # No literal token or password in the compose file itself.
    for name in ("curator", "modeler", "db"):
        for key, value in compose["services"][name].get("environment", {}).items():
            if re.search(r"TOKEN|PASSWORD|SECRET", key):
                assert str(value).startswith("${"), f"{name}.{key} must come from .env"
    assert ".env" in (ROOT / ".gitignore").read_text(encoding="utf-8").split()


def test_dockerfile_is_slim_non_root_and_installs_the_console_script() -> None:
    lines = [ln.strip() for ln in (ROOT / "Dockerfile").read_text(encoding="utf-8").splitlines()]
    base = next(ln for ln in lines if ln.startswith("FROM "))
    assert re.fullmatch(r"FROM python:3\.11-slim(\S*)?", base)
    users = [ln.split()[1] for ln in lines if ln.startswith("USER ")]
    assert users and users[-1] not in {"root", "0"}
    # The image installs this project, whose console script is the `pobo` the compose commands call.
    assert any("pip install" in ln and "/app" in ln for ln in lines)
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    assert scripts["pobo"] == "shared.cli:app"
    # Everything the services need at run time is copied in (migrations are applied at start-up).
    copied = {ln.split()[1] for ln in lines if ln.startswith("COPY ")}
    assert {"shared", "curator_service", "modeler_service", "migrations"} <= copied
