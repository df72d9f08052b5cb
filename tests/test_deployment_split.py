"""The two organisations' hosts (compose.curator.yaml, compose.modeler.yaml) and what all compose files share.

No Docker engine runs here, so, beside test_deployment.py's checks (entry points, settings, secrets, mount
points, loopback): every compose file is valid against the Compose Specification's JSON schema (vendored in
tests/data, see its README); every service rotates its logs, restarts, and has a health check that runs a
program its image has; every secret, volume and network a service names is declared, and every bind mount
exists in the repository or is documented; the curator's Caddy proxy terminates TLS on 443 with the
certificate compose mounts and forwards to the curator's service name and port; the modeler trusts the
proxy's CA and talks to it alone; the image installs with constraints.txt, which pins every run-time
dependency (transitive ones too) and nothing else; and the docs say which file each organisation runs, how
to upgrade and how to roll back.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import tomllib
from importlib import metadata
from pathlib import Path, PurePosixPath
from typing import Any

import jsonschema
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from modeler_service.config import Settings as ModelerSettings
from tests.test_deployment import (
    COMPOSE_FILES,
    FULL_FILES,
    PUBLIC_PORTS,
    ROOT,
    _dockerfile,
    _environment,
    _service_secrets,
    _shell_commands,
    _yaml,
)

SCHEMA = ROOT / "tests" / "data" / "compose-spec.json"
CADDYFILE = "deploy/Caddyfile.curator"
#: Programs a health check may run, by image: the official images' tools, and this project's image (built
#: from python:3.11-slim, whose python is on the PATH).
IMAGE_PROGRAMS = {"postgres": {"pg_isready", "psql"}, "caddy": {"wget", "caddy"}, "pobo": {"python"}}
#: Where the official images keep their state (their Dockerfiles' VOLUME), which a named volume may take.
IMAGE_VOLUMES = {"postgres": {"/var/lib/postgresql/data"}, "caddy": {"/data", "/config"}}
#: Bind-mounted host directories the operators create (docs/deployment.md says how), not in the repository.
DOCUMENTED_DIRS = {"./certs"}
#: Packages only the tests or the developers use: never in the image's lock file.
NOT_RUNTIME = {
    "pytest",
    "ruff",
    "mypy",
    "hypothesis",
    "schemathesis",
    "playwright",
    "scikit-learn",
    "jsonschema",
}


def _image_of(file: str, name: str, svc: dict[str, Any]) -> str:
    """``pobo`` for this project's image, else the official image's name (``postgres``, ``caddy``)."""
    if "build" in svc or (file == "compose.tls.yaml" and "build" in _yaml("compose.yaml")["services"][name]):
        return "pobo"
    return str(svc["image"]).split(":")[0].rsplit("/", 1)[-1]


def _short_volume(volume: str | dict[str, Any]) -> tuple[str, str, bool]:
    """(source, target, read-only) of a service's volume, in either of compose's forms."""
    if isinstance(volume, dict):
        return str(volume.get("source", "")), str(volume["target"]), bool(volume.get("read_only"))
    parts = volume.split(":")
    return parts[0], parts[1], len(parts) > 2 and "ro" in parts[2].split(",")


def _port(svc: dict[str, Any]) -> str:
    command = svc["command"]
    return str(command[command.index("--port") + 1])


def _interpolated(value: str, values: dict[str, str]) -> str:
    """Compose's ``${VAR}``, ``${VAR:-default}`` and ``${VAR:?message}``, with ``values`` for VAR."""

    def sub(match: re.Match[str]) -> str:
        name, op, rest = match.group(1), match.group(2) or "", match.group(3) or ""
        if name in values:
            return values[name]
        assert op.endswith("-"), f"${{{name}}} is required and not given"
        return rest

    return re.sub(r"\$\{([A-Z0-9_]+)(?::?([-?]))?([^}]*)\}", sub, value)


# -- Caddyfile


def _caddy_blocks(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """The Caddyfile's top-level blocks: (the tokens before ``{``, the directive lines inside, nested
    blocks' lines included). Comments (``#`` starting a token) dropped."""
    blocks: list[tuple[list[str], list[list[str]]]] = []
    depth = 0
    for raw in text.splitlines():
        tokens = shlex.split(raw, comments=True)
        if not tokens:
            continue
        opens, closes = tokens[-1] == "{", tokens == ["}"]
        if depth == 0 and opens:
            blocks.append((tokens[:-1], []))
        elif depth > 0 and not closes:
            blocks[-1][1].append(tokens[:-1] if opens else tokens)
        depth += 1 if opens else -1 if closes else 0
    assert depth == 0, f"{CADDYFILE}: unbalanced braces"
    return blocks


def _directive(lines: list[list[str]], name: str) -> list[list[str]]:
    return [line[1:] for line in lines if line[0] == name]


# -- the schema


def test_the_vendored_schema_is_the_compose_specification() -> None:
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    assert schema["title"] == "Compose Specification"
    jsonschema.Draft7Validator.check_schema(schema)
    readme = (SCHEMA.parent / "README.md").read_text(encoding="utf-8")
    assert "compose-spec/compose-spec" in readme and "schema/compose-spec.json" in readme
    assert re.search(r"commit `[0-9a-f]{40}`", readme), "tests/data/README.md: the schema's commit"


@pytest.mark.parametrize("file", COMPOSE_FILES)
def test_compose_file_matches_the_compose_specification(file: str) -> None:
    validator = jsonschema.Draft7Validator(json.loads(SCHEMA.read_text(encoding="utf-8")))
    errors = [
        f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in validator.iter_errors(_yaml(file))
    ]
    assert not errors, f"{file} is not a valid compose file:\n" + "\n".join(errors)


def test_the_schema_check_catches_mistakes() -> None:
    """A misspelt key, a wrong type and a misplaced option fail it (else the test above proves nothing)."""
    validator = jsonschema.Draft7Validator(json.loads(SCHEMA.read_text(encoding="utf-8")))
    good = _yaml("compose.curator.yaml")
    assert validator.is_valid(good)
    for path, value in [
        (("services", "curator", "healtcheck"), {"test": ["CMD", "true"]}),
        (("services", "proxy", "ports"), "443:443"),
        (("services", "db", "logging", "max-size"), "10m"),
        (("volumes", "pgdata"), "local"),
    ]:
        bad = json.loads(json.dumps(good))
        node = bad
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        assert not validator.is_valid(bad), f"the schema accepts {'.'.join(path)} = {value!r}"


# -- every service


@pytest.mark.parametrize("file", FULL_FILES)
def test_every_service_rotates_its_logs_and_restarts(file: str) -> None:
    for name, svc in _yaml(file)["services"].items():
        logging = svc.get("logging") or {}
        assert logging.get("driver") == "json-file", f"{file}: {name} has no json-file log rotation"
        options = logging.get("options") or {}
        size, count = str(options.get("max-size", "")), str(options.get("max-file", ""))
        assert re.fullmatch(r"[1-9][0-9]*[kmg]", size), f"{file}: {name}: max-size {size!r}"
        assert count.isdigit() and int(count) >= 2, f"{file}: {name}: max-file {count!r}"
        # Bounded: at most 1 GB of logs a container.
        assert int(size[:-1]) * {"k": 1e3, "m": 1e6, "g": 1e9}[size[-1]] * int(count) <= 1e9, (
            f"{file}: {name}"
        )
        assert svc.get("restart") in {"unless-stopped", "always"}, f"{file}: {name} is not restarted"


@pytest.mark.parametrize("file", COMPOSE_FILES)
def test_health_checks_run_a_program_the_image_has(file: str) -> None:
    services = _yaml(file)["services"]
    for name, svc in services.items():
        check = svc.get("healthcheck")
        if check is None:
            continue  # the image's HEALTHCHECK (test_deployment.py checks it is there and probes the port)
        test = check["test"]
        assert isinstance(test, list) and test[0] in {"CMD", "CMD-SHELL"}, f"{file}: {name}: {test}"
        argv = test[1:] if test[0] == "CMD" else shlex.split(test[1])
        image = _image_of(file, name, svc)
        assert argv[0] in IMAGE_PROGRAMS[image], f"{file}: {name}: the {image} image has no {argv[0]}"
        if argv[0] == "pg_isready":  # of the database the image creates
            env = _environment(svc)
            assert argv[argv.index("-U") + 1] == env["POSTGRES_USER"]
            assert argv[argv.index("-d") + 1] == env["POSTGRES_DB"]
        if image == "pobo":  # the port the service listens on (its TLS or plain port)
            full = _yaml("compose.yaml")["services"][name] if file == "compose.tls.yaml" else svc
            assert f"127.0.0.1:{_port(full)}/healthz" in argv[-1], f"{file}: {name} probes another port"
    dockerfile = dict(_dockerfile())
    assert dockerfile["FROM"].startswith("python:"), "the pobo image's health checks need python"


@pytest.mark.parametrize("file", COMPOSE_FILES)
def test_every_volume_secret_and_network_is_declared(file: str) -> None:
    data = _yaml(file)
    base = _yaml("compose.yaml") if file == "compose.tls.yaml" else data  # an override uses compose.yaml's
    volumes, networks = base.get("volumes") or {}, base.get("networks") or {}
    used_volumes: set[str] = set()
    for name, svc in data["services"].items():
        image = _image_of(file, name, svc)
        for volume in svc.get("volumes") or []:
            source, target, read_only = _short_volume(volume)
            where = f"{file}: {name}: {source}:{target}"
            if source.startswith((".", "/")):  # a bind mount: configuration or certificates, read-only
                assert source.startswith("./"), f"{where}: bind-mount paths of this repository only"
                assert read_only, f"{where} must be mounted read-only"
                assert (ROOT / source).exists() or source in DOCUMENTED_DIRS, f"{where}: no such file"
                continue
            assert source in volumes, f"{where}: volume {source} is not declared"
            used_volumes.add(source)
            if image != "pobo":  # the pobo image's mount points: test_deployment.py
                assert target in IMAGE_VOLUMES[image], f"{where}: not where the {image} image keeps its state"
        for source, _ in _service_secrets(svc):
            assert source in (base.get("secrets") or {}), f"{file}: {name}: secret {source} not declared"
        for network in svc.get("networks") or []:
            assert network in networks, f"{file}: {name}: network {network} not declared"
    if data is base:
        assert used_volumes == set(volumes), f"{file}: unused volumes {set(volumes) - used_volumes}"
    for directory in DOCUMENTED_DIRS:  # created by the operators, as docs/deployment.md says
        assert f"`{directory}`" in (ROOT / "docs" / "deployment.md").read_text(encoding="utf-8")


# -- the two hosts


def test_each_host_runs_its_own_services_and_publishes_only_the_proxy() -> None:
    curator, modeler = _yaml("compose.curator.yaml"), _yaml("compose.modeler.yaml")
    assert set(curator["services"]) == {"db", "curator", "proxy"}
    assert set(modeler["services"]) == {"db", "modeler"}
    assert curator["name"] != modeler["name"]  # separate projects: separate volumes even on one machine
    services = curator["services"]
    assert "ports" not in services["curator"], "the curator is reached through its proxy only"
    assert set(services["curator"]["networks"]) & set(services["proxy"]["networks"])
    assert not set(services["db"]["networks"]) & set(services["proxy"]["networks"])
    assert services["proxy"]["ports"] == ["443:443"] and PUBLIC_PORTS == {
        ("compose.curator.yaml", "proxy"): {"443"}
    }
    assert services["proxy"]["depends_on"]["curator"]["condition"] == "service_healthy"
    for data in (curator, modeler):  # the databases: no route out, nothing but their service reaches them
        (backend,) = data["services"]["db"]["networks"]
        assert data["networks"][backend] == {"internal": True}
    # The client address the proxy forwards is trusted only because nothing but the proxy reaches the port.
    assert _environment(services["curator"]).get("FORWARDED_ALLOW_IPS") == "*"
    peers = {
        n for n, s in services.items() if set(s.get("networks", [])) & set(services["curator"]["networks"])
    }
    assert peers == {"db", "curator", "proxy"}


def test_caddyfile_terminates_tls_and_proxies_to_the_curator() -> None:
    compose = _yaml("compose.curator.yaml")
    proxy = compose["services"]["proxy"]
    mounts = {target: (source, ro) for source, target, ro in map(_short_volume, proxy["volumes"])}
    assert mounts["/etc/caddy/Caddyfile"] == (f"./{CADDYFILE}", True)
    blocks = _caddy_blocks((ROOT / CADDYFILE).read_text(encoding="utf-8"))
    (options,) = [lines for address, lines in blocks if not address]
    # Only 443 is published: no HTTP listener for redirects; and no admin API.
    assert ["auto_https", "disable_redirects"] in options and ["admin", "off"] in options
    sites = {address[0]: lines for address, lines in blocks if address}
    env = _environment(proxy)
    https = [a for a in sites if a.startswith("https://")]
    assert len(https) == 1
    (site,) = https
    match = re.fullmatch(r"https://\{\$([A-Z_]+)\}:(\d+)", site)
    assert match, f"{CADDYFILE}: site {site!r}"
    assert match.group(1) in env and "POBO_CURATOR_PUBLIC_NAME" in env[match.group(1)]
    assert f"{match.group(2)}:{match.group(2)}" in proxy["ports"]
    lines = sites[site]
    # TLS with the certificate and key compose mounts (read-only).
    ((cert, key),) = _directive(lines, "tls")
    for path in (cert, key):
        mount = next(t for t in mounts if path.startswith(t + "/"))
        assert mounts[mount][1], f"{mount} must be read-only"
        assert mounts[mount][0] in DOCUMENTED_DIRS
    # Forwarded to the curator's service name and the port it listens on, over a network both share.
    ((upstream,),) = _directive(lines, "reverse_proxy")
    host, _, port = upstream.partition(":")
    assert host in compose["services"] and port == _port(compose["services"][host])
    # The health check probes the proxy's own loopback site.
    url = proxy["healthcheck"]["test"][-1]
    probe = re.fullmatch(r"http://127\.0\.0\.1:(\d+)(/\S+)", url)
    assert probe, url
    health = sites[f"http://:{probe.group(1)}"]
    assert ["bind", "127.0.0.1"] in health and ["respond", probe.group(2), "ok", "200"] in health


def test_the_modeler_trusts_the_curator_proxy_and_talks_to_it_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    modeler = _yaml("compose.modeler.yaml")["services"]["modeler"]
    env = _environment(modeler)
    bundle = PurePosixPath(env["POBO_MODELER_CURATOR_CA_BUNDLE"])
    mounts = {target: (source, ro) for source, target, ro in map(_short_volume, modeler["volumes"])}
    assert mounts[str(bundle.parent)] == ("./certs", True)
    # The allowlist: https://<the name the proxy's certificate is for>, as the setting parses it.
    name = "curator.example.org"
    allowlist = _interpolated(env["POBO_MODELER_CURATOR_URL_ALLOWLIST"], {"POBO_CURATOR_PUBLIC_NAME": name})
    for key in list(os.environ):
        if key.startswith("POBO_"):
            monkeypatch.delenv(key)
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n", encoding="utf-8")
    monkeypatch.setenv("POBO_MODELER_CURATOR_URL_ALLOWLIST", allowlist)
    monkeypatch.setenv("POBO_MODELER_CURATOR_CA_BUNDLE", str(tmp_path / "ca.pem"))
    settings = ModelerSettings()
    assert settings.curator_url_allowlist == [f"https://{name}"]
    assert settings.curator_ca_bundle == tmp_path / "ca.pem"
    # The name comes from the same .env variable as the proxy's site address.
    proxy_env = _environment(_yaml("compose.curator.yaml")["services"]["proxy"])
    assert any("POBO_CURATOR_PUBLIC_NAME" in value for value in proxy_env.values())


# -- the lock file


def _constraints() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][^\s;#]*)", line.strip())
        assert match, f"constraints.txt: {line!r} is not an exact pin"
        name = canonicalize_name(match.group(1))
        assert name not in pins, f"constraints.txt pins {name} twice"
        pins[name] = match.group(2)
    return pins


def _runtime_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return [Requirement(r) for r in project["dependencies"]]


def test_the_image_installs_with_the_constraints_file() -> None:
    instructions = _dockerfile()
    workdir = "/"
    copied: set[str] = set()
    for op, args in instructions:
        if op == "WORKDIR":
            workdir = args
        elif op == "COPY" and "constraints.txt" in args.split()[:-1]:
            destination = args.split()[-1]
            copied.add(str(PurePosixPath(workdir, destination, "constraints.txt")))
    assert copied == {"/app/constraints.txt"}
    installs = [
        command
        for op, args in instructions
        if op == "RUN"
        for command in _shell_commands(args)
        if command[1:3] == ["install", "-e"] or ("install" in command and "/app" in command)
    ]
    assert installs, "the Dockerfile does not pip install /app"
    for command in installs:
        assert command[command.index("-c") + 1] in copied, f"not installed with the constraints: {command}"


def test_the_constraints_pin_every_runtime_dependency_and_nothing_else() -> None:
    pins = _constraints()
    # Every dependency of pyproject.toml, at a version it allows (uvloop: the image is Linux) ...
    environment = {"sys_platform": "linux", "platform_system": "Linux", "python_version": "3.11"}
    wanted: list[tuple[str, str]] = []  # (distribution, extra) to follow
    for req in _runtime_requirements():
        if req.marker is not None and not req.marker.evaluate(environment):
            continue
        name = canonicalize_name(req.name)
        assert name in pins, f"constraints.txt does not pin {req.name} (pyproject.toml dependency)"
        assert Version(pins[name]) in req.specifier, f"{name}=={pins[name]} is outside {req}"
        wanted += [(req.name, extra) for extra in ["", *sorted(req.extras)]]
    # ... and what they pull in, followed through the metadata of the pinned versions installed here (a
    # package installed at another version is not followed: its requirements may differ).
    seen: set[tuple[str, str]] = set()
    while wanted:
        dist, extra = wanted.pop()
        if (canonicalize_name(dist), extra) in seen:
            continue
        seen.add((canonicalize_name(dist), extra))
        try:  # the requirements of the pinned version, where it is the one installed here
            if Version(metadata.version(dist)) != Version(pins[canonicalize_name(dist)]):
                continue
            requires = metadata.requires(dist) or []
        except metadata.PackageNotFoundError:
            continue
        for text in requires:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({**environment, "extra": extra}):
                continue
            name = canonicalize_name(req.name)
            assert name in pins, f"constraints.txt does not pin {req.name} (required by {dist})"
            assert Version(pins[name]) in req.specifier or not req.specifier, f"{name}: {req} ({dist})"
            wanted += [(req.name, e) for e in ["", *sorted(req.extras)]]
    # Nothing for the tests or the developers, and not pobo itself.
    assert not (set(pins) & {canonicalize_name(n) for n in NOT_RUNTIME | {"pobo"}})


def test_make_lock_regenerates_the_constraints_file() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = re.search(r"^lock:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert recipe, "the Makefile has no `lock` target"
    steps = recipe.group(1)
    assert "-m venv" in steps and "pip install -q ." in steps and "pip freeze" in steps
    assert "constraints.txt" in steps and "'.[" not in steps  # pobo alone: no test or dev extras
    assert "make lock" in (ROOT / "constraints.txt").read_text(encoding="utf-8")


# -- the docs


def test_the_docs_cover_two_hosts_upgrade_and_rollback() -> None:
    docs = (ROOT / "docs" / "deployment.md").read_text(encoding="utf-8")
    for needed in (
        "compose.curator.yaml",
        "compose.modeler.yaml",
        CADDYFILE,
        "POBO_CURATOR_PUBLIC_NAME",
        "POBO_MODELER_CURATOR_CA_BUNDLE",
        "## Upgrade and rollback",
        "pobo curator backup",
        "pobo curator migrate --to",
        "pobo modeler migrate --to",
        "make lock",
    ):
        assert needed in docs, f"docs/deployment.md does not mention {needed}"
    for page in [*(ROOT / "docs").glob("*.md"), ROOT / "README.md", ROOT / "CHANGELOG.md"]:
        assert "../shared" not in page.read_text(encoding="utf-8"), f"{page.name} refers to ../shared"
