"""The pilot deployment: compose.yaml (one host), compose.curator.yaml and compose.modeler.yaml (the two
organisations' hosts), compose.tls.yaml, .env.example, secrets/ and the Dockerfile.

No Docker engine runs on our machines, so these tests check the pieces compose uses: the file parses, it runs
the same entry points the end-to-end tests start as real processes (``pobo curator serve`` /
``pobo modeler serve``, against PostgreSQL in CI), every ``POBO_*`` variable it sets is a real setting of the
service it is given to, every secret is a compose secret file (never an environment variable) that the
service reads as one of its settings, the image creates the volume mount points for its non-root user, every
service has a health check, and nothing is published beyond loopback but the curator's TLS proxy on 443.
The rest of the two-host deployment (schema, log rotation, proxy, lock file) is in test_deployment_split.py.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import sys
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml
from pydantic import SecretStr
from pydantic_settings import BaseSettings
from typer.testing import CliRunner

from curator_service.config import Settings as CuratorSettings
from modeler_service.config import Settings as ModelerSettings
from shared.tools.cli import app

ROOT = Path(__file__).resolve().parents[1]
#: Complete projects (one host; each organisation's host), and an override of compose.yaml.
FULL_FILES = ["compose.yaml", "compose.curator.yaml", "compose.modeler.yaml"]
COMPOSE_FILES = [*FULL_FILES, "compose.tls.yaml"]
SETTINGS: dict[str, tuple[type[BaseSettings], str]] = {
    "curator": (CuratorSettings, "POBO_CURATOR_"),
    "modeler": (ModelerSettings, "POBO_MODELER_"),
}
#: Each pobo service of each complete compose file: (file, service, settings class, variable prefix).
PILOT_SERVICES = [
    pytest.param(file, service, *SETTINGS[service], id=f"{file}-{service}")
    for file, services in [
        ("compose.yaml", ["curator", "modeler"]),
        ("compose.curator.yaml", ["curator"]),
        ("compose.modeler.yaml", ["modeler"]),
    ]
    for service in services
]
#: The only ports published beyond loopback: the curator's TLS proxy, HTTPS.
PUBLIC_PORTS = {("compose.curator.yaml", "proxy"): {"443"}}
#: Where compose mounts the secrets a service lists.
SECRETS_DIR = "/run/secrets"
#: Environment variable names that announce a secret, and URLs with a password in them.
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD", re.IGNORECASE)
URL_WITH_PASSWORD = re.compile(r"://[^/@\s:]*:[^/@\s]+@")


def _yaml(name: str) -> dict[str, Any]:
    data = yaml.safe_load((ROOT / name).read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module", params=FULL_FILES)
def compose(request: pytest.FixtureRequest) -> dict[str, Any]:
    return _yaml(str(request.param))


def _env_example() -> dict[str, str]:
    out: dict[str, str] = {}
    for line in (ROOT / ".env.example").read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def _environment(svc: dict[str, Any]) -> dict[str, str]:
    """A service's ``environment:``, in either of compose's forms (mapping or ``KEY=value`` list)."""
    env = svc.get("environment") or {}
    if isinstance(env, list):
        env = dict(str(item).partition("=")[::2] for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def _service_secrets(svc: dict[str, Any]) -> list[tuple[str, str]]:
    """(top-level secret, file name under /run/secrets) of each secret a service lists, in either form."""
    out = []
    for item in svc.get("secrets") or []:
        if isinstance(item, str):
            out.append((item, item))
        else:
            out.append((item["source"], item.get("target", item["source"])))
    return out


def _volume_target(volume: str | dict[str, Any]) -> str:
    if isinstance(volume, dict):
        return str(volume["target"])
    return volume.split(":")[1]


def _named_volume_targets(compose: dict[str, Any], svc: dict[str, Any]) -> list[str]:
    """Where a service mounts the compose file's named volumes (bind mounts left out)."""
    out = []
    for volume in svc.get("volumes") or []:
        source = volume.get("source") if isinstance(volume, dict) else volume.split(":")[0]
        if source in (compose.get("volumes") or {}):
            out.append(_volume_target(volume))
    return out


def _clear_pobo_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Environment variables win over secret files: none of the developer's may leak into a test."""
    for key in list(os.environ):
        if key.upper().startswith("POBO_"):
            monkeypatch.delenv(key)


def _dockerfile() -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (INSTRUCTION, arguments), backslash continuations joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in (ROOT / "Dockerfile").read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue  # comment lines inside a continuation are dropped by docker too
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        op, _, args = (pending + line).partition(" ")
        out.append((op.upper(), args.strip()))
        pending = ""
    return out


def _runtime_user(instructions: list[tuple[str, str]]) -> str:
    users = [args.split(":")[0] for op, args in instructions if op == "USER"]
    assert users, "the Dockerfile sets no USER: the services would run as root"
    return users[-1]


def _shell_commands(script: str) -> list[list[str]]:
    """The simple commands of a RUN line (split on ``&&``, ``;``, ``|``...)."""
    lexer = shlex.shlex(script, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token in {"&&", "||", ";", "|", "&"}:
            commands.append([])
        else:
            commands[-1].append(token)
    return [c for c in commands if c]


def _directories_made(run_lines: list[str]) -> dict[str, dict[str, str]]:
    """What RUN lines do to directories: {path: {"created": ..., "owner": "user[:group]", "mode": "0700"}}.

    Understands ``mkdir [-p] [-m MODE]``, ``install -d [-o U] [-g G] [-m MODE]``, ``chown [-R] U[:G]`` and
    ``chmod [-R] MODE``, which is what a Dockerfile uses to prepare a mount point.
    """
    valued = {"-m", "--mode", "-o", "--owner", "-g", "--group"}
    made: dict[str, dict[str, str]] = {}
    for line in run_lines:
        for prog, *args in _shell_commands(line):
            opts: dict[str, str] = {}
            operands: list[str] = []
            it = iter(args)
            for arg in it:
                if arg in valued:
                    opts[arg.lstrip("-")[0]] = next(it, "")
                elif arg.startswith("-"):
                    opts[arg.lstrip("-")] = ""
                else:
                    operands.append(arg)
            prog = prog.rsplit("/", 1)[-1]
            if prog == "mkdir" or (prog == "install" and "d" in opts):
                for path in operands:
                    entry = made.setdefault(path, {})
                    entry["created"] = prog
                    if "m" in opts:
                        entry["mode"] = opts["m"]
                    if "o" in opts:
                        entry["owner"] = opts["o"] + (f":{opts['g']}" if "g" in opts else "")
            elif prog in {"chown", "chmod"} and len(operands) >= 2:
                key = "owner" if prog == "chown" else "mode"
                for path in operands[1:]:
                    made.setdefault(path, {})[key] = operands[0]
    return made


def test_compose_has_postgres_16_with_volume_and_healthcheck(compose: dict[str, Any]) -> None:
    """Each host has its own database (compose.yaml: one for both services)."""
    db = compose["services"]["db"]
    assert db["image"].startswith("postgres:16")
    assert any(v.endswith(":/var/lib/postgresql/data") for v in db["volumes"])
    assert db["volumes"][0].split(":")[0] in compose["volumes"]
    assert "pg_isready" in " ".join(db["healthcheck"]["test"])
    assert "ports" not in db, "the database must not be published on the host"


@pytest.mark.parametrize(("file", "service", "settings_cls", "prefix"), PILOT_SERVICES)
def test_compose_service_runs_the_tested_entry_point(
    file: str, service: str, settings_cls: type[BaseSettings], prefix: str
) -> None:
    compose = _yaml(file)
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
    env = _environment(svc)
    ours = [k for k in env if k.startswith(prefix)]
    assert ours, f"{service} gets no {prefix}* settings"
    for key in ours:
        assert key[len(prefix) :].lower() in fields, f"{key} is not a setting of the {service} service"
    # The database URL (it contains the password) is a secret file, read as the setting database_url.
    assert f"{prefix}DATABASE_URL" not in env
    assert f"{prefix.lower()}database_url" in [name for _, name in _service_secrets(svc)]
    assert svc["depends_on"]["db"]["condition"] == "service_healthy"
    # Published ports match the port the service listens on (loopback only: see below).
    port = opts[opts.index("--port") + 1]
    for mapping in svc.get("ports") or []:
        assert str(mapping).rsplit(":", 1)[-1] == port
    # Data lives in a named volume.
    assert any(v.split(":")[0] in compose["volumes"] for v in svc["volumes"])


@pytest.mark.parametrize("file", COMPOSE_FILES)
def test_published_ports_bind_loopback_only(file: str) -> None:
    for name, svc in _yaml(file)["services"].items():
        for mapping in svc.get("ports") or []:
            public = PUBLIC_PORTS.get((file, name), set())
            if isinstance(mapping, dict) and str(mapping.get("target")) in public:
                continue
            if isinstance(mapping, str) and mapping in {f"{p}:{p}" for p in public}:
                continue  # the TLS proxy's HTTPS port, on every interface (test_deployment_split.py)
            if isinstance(mapping, dict):  # long syntax
                assert mapping.get("host_ip") == "127.0.0.1", (
                    f"{file}: {name} publishes {mapping} beyond loopback"
                )
            else:  # "8001:8001" or "0.0.0.0:8001:8001" would listen on every interface of the host
                assert str(mapping).startswith("127.0.0.1:"), (
                    f"{file}: {name} publishes {mapping} beyond loopback"
                )


def test_every_service_has_a_health_check(compose: dict[str, Any]) -> None:
    """Published or not: ``depends_on: condition: service_healthy`` and the operators rely on it."""
    image_check = [args for op, args in _dockerfile() if op == "HEALTHCHECK"]
    image_has_check = bool(image_check) and not image_check[-1].upper().startswith("NONE")
    for name, svc in compose["services"].items():
        check = svc.get("healthcheck")
        if check is not None:
            assert not check.get("disable") and check.get("test") not in ("NONE", ["NONE"]), name
            assert check.get("test"), f"{name}: health check without a test"
            continue
        # The pobo services use the image's HEALTHCHECK, which probes the port in POBO_HEALTH_PORT.
        assert "build" in svc and image_has_check, f"{name} has no health check"
        command = svc["command"]
        listening = {command[command.index("--port") + 1]}
        published = {str(m).rsplit(":", 1)[-1] for m in svc.get("ports") or []}
        assert published <= listening, f"{name} publishes a port it does not listen on"
        assert _environment(svc).get("POBO_HEALTH_PORT") in listening, (
            f"{name}: POBO_HEALTH_PORT must be the port the service listens on"
        )


@pytest.mark.parametrize("file", COMPOSE_FILES)
def test_compose_takes_only_non_secret_knobs_from_env_file(file: str) -> None:
    text = (ROOT / file).read_text(encoding="utf-8")
    referenced = set(re.findall(r"\$\{([A-Z0-9_]+)", text))
    example = _env_example()
    assert referenced <= set(example), f"missing from .env.example: {sorted(referenced - set(example))}"
    # .env reaches the containers as environment variables: it must not invite a secret.
    for key, value in example.items():
        assert not SECRET_NAME.search(key), f".env.example: {key} is a secret; make it a compose secret file"
        assert not URL_WITH_PASSWORD.search(value), f".env.example: {key} holds a URL with a password"
    assert ".env" in (ROOT / ".gitignore").read_text(encoding="utf-8").split()


@pytest.mark.parametrize("file", COMPOSE_FILES)
def test_compose_environment_holds_no_secret(file: str) -> None:
    """Environment variables show in ``docker inspect`` and to every process in the container."""
    for name, svc in _yaml(file)["services"].items():
        assert "env_file" not in svc, f"{file}: {name} would get all of .env as environment variables"
        for key, value in _environment(svc).items():
            where = f"{file}: {name}.{key}"
            if key.endswith("_FILE"):  # e.g. POSTGRES_PASSWORD_FILE: a path, to a compose secret
                assert value.startswith(f"{SECRETS_DIR}/"), f"{where} should name a file in {SECRETS_DIR}"
                continue
            assert not SECRET_NAME.search(key), f"{where} passes a secret in the environment: use a secret"
            assert not URL_WITH_PASSWORD.search(value), f"{where} is a URL with a password: use a secret"


def test_compose_secrets_are_files_kept_out_of_git(compose: dict[str, Any]) -> None:
    declared = compose.get("secrets") or {}
    assert declared, "the compose file declares no secrets"
    used: set[str] = set()
    for name, svc in compose["services"].items():
        for source, target in _service_secrets(svc):
            assert source in declared, (
                f"{name} lists the secret {source}, which the compose file does not declare"
            )
            assert "/" not in target, f"{name}: secret {source} must be mounted in {SECRETS_DIR}"
            used.add(source)
    documented = (ROOT / "secrets" / "README.md").read_text(encoding="utf-8")
    for source, spec in declared.items():
        file = (spec or {}).get("file")
        assert file, f"secret {source} must be a file (compose cannot create it from the environment safely)"
        path = PurePosixPath(file)
        assert path.parent == PurePosixPath("secrets") and path.name == source, f"{source}: file {file}"
        assert source in used, f"secret {source} is given to no service"
        assert f"`{source}`" in documented, f"secrets/README.md does not say what {source} holds"
    # PostgreSQL reads its password from the secret file (the image's POSTGRES_PASSWORD_FILE).
    db = compose["services"]["db"]
    env = _environment(db)
    assert "POSTGRES_PASSWORD" not in env
    password_file = env["POSTGRES_PASSWORD_FILE"]
    assert password_file.removeprefix(f"{SECRETS_DIR}/") in {target for _, target in _service_secrets(db)}
    # The secret files are never committed; the README next to them is.
    ignored = (ROOT / ".gitignore").read_text(encoding="utf-8").split()
    assert "secrets/*" in ignored and "!secrets/README.md" in ignored


@pytest.mark.parametrize(("file", "service", "settings_cls", "prefix"), PILOT_SERVICES)
@pytest.mark.filterwarnings("error")
def test_compose_secrets_are_read_as_settings(
    file: str,
    service: str,
    settings_cls: type[BaseSettings],
    prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """pydantic-settings reads ``<secrets_dir>/<env_prefix><field>`` (case-insensitive) as the field."""
    _clear_pobo_env(monkeypatch)
    mounted = [target for _, target in _service_secrets(_yaml(file)["services"][service])]
    expected: dict[str, str] = {}
    for name in mounted:
        assert name.startswith(prefix.lower()), (
            f"{service} gets the secret {name}, which is none of its settings"
        )
        field = name[len(prefix) :]
        assert field in settings_cls.model_fields, f"{service} has no setting {field} (secret {name})"
        expected[field] = f"value of {name}"
        (tmp_path / name).write_text(expected[field] + "\n", encoding="utf-8")  # `echo`/`print` add the \n
    settings = settings_cls(_secrets_dir=tmp_path)
    for field, value in expected.items():
        got = getattr(settings, field)
        assert (got.get_secret_value() if isinstance(got, SecretStr) else got) == value, field
    # Everything the pilot must not take from the environment arrives this way.
    needed = {"curator": {"database_url", "admin_token"}, "modeler": {"database_url", "token", "secret_key"}}
    assert needed[service] <= set(expected)


@pytest.mark.parametrize(
    ("service", "settings_cls", "prefix"),
    [("curator", *SETTINGS["curator"]), ("modeler", *SETTINGS["modeler"])],
)
@pytest.mark.filterwarnings("error")
def test_settings_still_read_the_environment_first(
    service: str,
    settings_cls: type[BaseSettings],
    prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _clear_pobo_env(monkeypatch)
    field = {"curator": "admin_token", "modeler": "token"}[service]
    # No secrets directory (any machine without /run/secrets, e.g. `pobo demo` or the tests): the environment.
    from_env, from_file = "from-env-0123456789abcdefghij", "from-file-0123456789abcdefghij"  # >= 24 chars
    monkeypatch.setenv(f"{prefix}{field.upper()}", from_env)
    assert getattr(settings_cls(), field).get_secret_value() == from_env
    # A secret file of the same setting: the environment variable still wins (pydantic-settings' order) ...
    (tmp_path / f"{prefix.lower()}{field}").write_text(from_file + "\n", encoding="utf-8")
    assert getattr(settings_cls(_secrets_dir=tmp_path), field).get_secret_value() == from_env
    # ... and the file is read when the variable is not set.
    monkeypatch.delenv(f"{prefix}{field.upper()}")
    assert getattr(settings_cls(_secrets_dir=tmp_path), field).get_secret_value() == from_file


@pytest.mark.parametrize("package", ["curator_service", "modeler_service"])
@pytest.mark.parametrize("exists", [True, False], ids=["with-run-secrets", "without-run-secrets"])
@pytest.mark.filterwarnings("error")
def test_settings_use_run_secrets_only_where_it_exists(
    package: str, exists: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compose mounts the secrets at /run/secrets; elsewhere no secrets_dir at all, since pydantic-settings
    warns about a configured one that is missing. The config module is loaded afresh, under another name,
    with /run/secrets made to exist or not."""
    real_isdir, real_exists = os.path.isdir, os.path.exists
    real_is_dir, real_path_exists = Path.is_dir, Path.exists

    def is_secrets_dir(path: str | os.PathLike[str]) -> bool:
        return os.fspath(path) == SECRETS_DIR

    monkeypatch.setattr(os.path, "isdir", lambda p: exists if is_secrets_dir(p) else real_isdir(p))
    monkeypatch.setattr(os.path, "exists", lambda p: exists if is_secrets_dir(p) else real_exists(p))
    monkeypatch.setattr(Path, "is_dir", lambda s, **kw: exists if is_secrets_dir(s) else real_is_dir(s, **kw))
    monkeypatch.setattr(
        Path, "exists", lambda s, **kw: exists if is_secrets_dir(s) else real_path_exists(s, **kw)
    )
    name = f"_probe_{package}_config"
    spec = importlib.util.spec_from_file_location(name, ROOT / package / "config.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    secrets_dir = module.Settings.model_config.get("secrets_dir")
    if exists:
        assert secrets_dir is not None and Path(secrets_dir) == Path(SECRETS_DIR)
    else:
        assert secrets_dir is None
        _clear_pobo_env(monkeypatch)
        module.Settings()  # and no warning about a missing directory (filterwarnings: error)


def test_dockerfile_is_slim_non_root_and_installs_the_console_script() -> None:
    instructions = _dockerfile()
    base = next(args for op, args in instructions if op == "FROM")
    assert re.fullmatch(r"python:3\.11-slim(\S*)?", base)
    assert _runtime_user(instructions) not in {"root", "0", ""}
    # The image installs this project, whose console script is the `pobo` the compose commands call.
    assert any(op == "RUN" and "pip install" in args and "/app" in args for op, args in instructions)
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    assert scripts["pobo"] == "shared.tools.cli:app"
    # Everything the services need at run time is copied in (migrations are applied at start-up).
    copied = {args.split()[0] for op, args in instructions if op == "COPY"}
    assert {"shared", "curator_service", "modeler_service", "migrations"} <= copied


def test_dockerfile_creates_the_volume_mount_points_for_the_runtime_user(compose: dict[str, Any]) -> None:
    """A named volume mounted on a directory missing from the image is created owned by root, and the
    services (non-root) crash on their first write; mounted on an image directory, it takes over that
    directory's owner and mode on first use."""
    instructions = _dockerfile()
    user = _runtime_user(instructions)
    last_user = max(i for i, (op, _) in enumerate(instructions) if op == "USER")
    made = _directories_made([args for op, args in instructions[:last_user] if op == "RUN"])
    pobo = {name: svc for name, svc in compose["services"].items() if "build" in svc}
    assert pobo
    targets = [target for svc in pobo.values() for target in _named_volume_targets(compose, svc)]
    # Each service's data dir is such a volume.
    for name, svc in pobo.items():
        assert _environment(svc)[f"POBO_{name.upper()}_DATA_DIR"] in targets, f"{name}: data dir not a volume"
    for target in targets:
        entry = made.get(target, {})
        assert entry.get("created"), f"{target} (a named volume) is not created before USER {user}"
        owner, _, group = entry.get("owner", "").partition(":")
        assert owner == user, f"{target} must be chowned to {user} before USER, not {entry.get('owner')!r}"
        assert group in {"", user}, f"{target}: group {group!r}"
        mode = entry.get("mode", "")
        assert mode.isdigit() and int(mode, 8) == 0o700, f"{target} must have mode 0700, not {mode!r}"
