"""What the two services' settings have in common: a pydantic-settings base class and secret files.

Each service subclasses :class:`ServiceSettings`, sets ``model_config = settings_config(<its prefix>)``
(``POBO_CURATOR_``, ``POBO_MODELER_``), ``service`` (its name) and ``default_port``, and adds its own
settings. Secrets may also come from files in ``/run/secrets`` (Docker and
compose secrets) when that directory exists; values are ``SecretStr`` so their ``repr`` never shows them.
"""

from __future__ import annotations

import logging
import os
import secrets
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Self

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.servicekit.serving import WORKERS_HELP, LogFormat, check_operator_token
from shared.servicekit.tls import check_tls_files

__all__ = ["SECRETS_DIR", "ServiceSettings", "settings_config", "write_secret"]

#: Where container orchestrators mount secrets, one file per setting (used when it exists at import).
SECRETS_DIR = "/run/secrets"


def settings_config(env_prefix: str) -> SettingsConfigDict:
    """A service's ``model_config``: its environment prefix, no .env file, unknown variables ignored, and
    :data:`SECRETS_DIR` as secrets directory if it exists *now* (pydantic-settings warns about a configured
    one that is missing), so the check happens when the service's settings class is defined."""
    return SettingsConfigDict(
        env_prefix=env_prefix,
        env_file=None,
        extra="ignore",
        secrets_dir=SECRETS_DIR if os.path.isdir(SECRETS_DIR) else None,
    )


class ServiceSettings(BaseSettings):
    """The settings both services have; a subclass sets ``model_config = settings_config(<prefix>)`` and
    ``service``."""

    #: The service's name ("curator"): its messages say "pobo <service>", its SQLite file is <service>.db,
    #: its data dir defaults to ./pobo-data/<service>.
    service: ClassVar[str]
    #: The port it listens on by default (8001 the curator, 8002 the modeler).
    default_port: ClassVar[int]

    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL. Default: a SQLite file in the data dir (curator.db, modeler.db; WAL "
        "mode). PostgreSQL: postgresql+psycopg://user@host:5432/db",
    )
    data_dir: Path = Field(
        default=Path("./pobo-data"),  # each service's own: ./pobo-data/<service> (__pydantic_init_subclass__)
        description="Where the service keeps its files (arrays, SQLite file, tokens and keys).",
    )
    host: str = "127.0.0.1"
    port: int = Field(default=0, ge=0, le=65535)  # each service's own: default_port
    access_log: bool = Field(
        default=True,
        description="uvicorn's access log on stdout (method, path, status only). The curator's durable "
        "access log (GET /v1/access-log) is kept either way.",
    )
    log_format: LogFormat = Field(
        default="text",
        description="text: uvicorn's lines and pobo's own as text. json: every log line (uvicorn's error and "
        "access loggers, pobo's loggers) one JSON object: time (ISO 8601, UTC), level, logger, pid, message; "
        "method, path (query string redacted) and status on access lines; exc for an exception. A generated "
        "token is then not printed: read it from its file in the data dir.",
    )
    metrics_token: SecretStr | None = Field(
        default=None,
        description="A bearer token for GET /metrics only (a Prometheus scraper), besides the service's "
        "operator token. Unset: only the operator token reads the metrics.",
    )

    @field_validator("metrics_token")
    @classmethod
    def _metrics_token_long_enough(cls, token: SecretStr | None) -> SecretStr | None:
        return check_operator_token(token, "the metrics_token setting")

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        """Give a service's settings its own defaults of ``data_dir`` and ``port``."""
        super().__pydantic_init_subclass__(**kwargs)
        if "service" in cls.__dict__:
            cls.model_fields["data_dir"].default = Path(f"./pobo-data/{cls.service}")
            cls.model_fields["port"].default = cls.default_port
            cls.model_rebuild(force=True)

    workers: int = Field(default=1, ge=1, le=64, description=WORKERS_HELP)
    max_json_bytes: int = Field(
        default=1 * 2**20,
        ge=1024,
        description="Largest accepted request body (413 beyond it); the curator's CSV upload has its own "
        "limit, max_upload_bytes.",
    )
    auth_max_failures: int = Field(
        default=10,
        ge=0,
        description="Requests with an invalid token one client may make within auth_window_seconds before "
        "it gets 429 (0: no throttling). Counted for the whole service, across its workers.",
    )
    auth_window_seconds: float = Field(default=60.0, gt=0, description="Window of the failed-token throttle.")
    cors_origins: list[str] = Field(
        default_factory=list,
        description="Browser origins allowed to call the API (CORS). Empty (default): no CORS headers at "
        "all, so no web page on another origin can call the service from a browser.",
    )
    console: bool = Field(
        default=True,
        description="Serve the browser console at /console (signed in with the service's operator token). "
        "false: no console routes at all (404).",
    )
    console_session_minutes: int = Field(
        default=480,
        ge=1,
        le=7 * 24 * 60,
        description="Lifetime of a console sign-in (minutes); the browser must sign in again after it.",
    )
    tls_certfile: Path | None = Field(
        default=None, description="PEM certificate (chain) to serve HTTPS; needs tls_keyfile too."
    )
    tls_keyfile: Path | None = Field(default=None, description="PEM private key of tls_certfile.")
    tls_keyfile_password: SecretStr | None = Field(
        default=None, description="Password of tls_keyfile, if it is encrypted."
    )

    @property
    def env_prefix(self) -> str:
        return str(self.model_config.get("env_prefix", ""))

    @model_validator(mode="after")
    def _check_tls_files(self) -> Self:
        check_tls_files(self.tls_certfile, self.tls_keyfile, prefix=self.env_prefix)
        return self

    @property
    def tls_enabled(self) -> bool:
        return self.tls_certfile is not None

    def resolved_database_url(self) -> str:
        """``database_url``, else the SQLite file ``<data_dir>/<service>.db`` (absolute)."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / f'{self.service}.db').resolve()}"

    def resolve_secret(
        self,
        configured: SecretStr | None,
        file_name: str,
        generate: Callable[[], str] | None = None,
        *,
        announce_as: str | None = None,
    ) -> SecretStr:
        """A secret from the settings, else from ``<data_dir>/<file_name>``, else a new one written to that
        file (0600), so that later starts reuse it: ``generate()``, by default a token of 256 random bits.

        ``announce_as`` ("an admin token"): a generated secret the operator must copy is printed once to
        stderr under that name (with ``log_format = "json"`` only a log line saying where it is, without
        the secret); None prints nothing (a key nobody needs to read).
        """
        if configured is not None and configured.get_secret_value():
            return configured
        path = self.data_dir / file_name
        if path.exists():
            stored = path.read_text(encoding="utf-8").strip()
            if stored:
                return SecretStr(stored)
        secret = generate() if generate is not None else secrets.token_urlsafe(32)
        write_secret(path, secret)
        if announce_as is not None and self.log_format == "json":  # no secret in a JSON log
            logging.getLogger(f"pobo.{self.service}").warning(
                "generated %s: saved to %s (mode 0600); read it from that file", announce_as, path
            )
        elif announce_as is not None:
            print(
                f"pobo {self.service}: generated {announce_as} (saved to {path}, mode 0600; shown only "
                f"now):\n  {secret}",
                file=sys.stderr,
                flush=True,
            )
        return SecretStr(secret)


def write_secret(path: Path, value: str) -> None:
    """Write ``value`` to ``path`` created with mode 0600 (never readable by others, not even briefly)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(value + "\n")
    os.chmod(path, 0o600)
