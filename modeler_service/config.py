"""Settings of the modeler service (environment variables prefixed ``POBO_MODELER_``)."""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

from cryptography.fernet import Fernet
from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.servicekit.serving import WORKERS_HELP, check_operator_token
from shared.servicekit.tls import check_tls_files

#: Files (inside the data dir) holding a generated bearer token and a generated encryption key.
TOKEN_FILE = "token"  # noqa: S105 - a file name, not a secret
SECRET_KEY_FILE = "secret.key"  # noqa: S105 - a file name


def _write_secret(path: Path, value: str) -> None:
    """Create ``path`` with mode 0600 (never world-readable, not even briefly)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(value + "\n")
    os.chmod(path, 0o600)


class Settings(BaseSettings):
    """One place for every knob; secrets are ``SecretStr`` so their ``repr`` never shows them."""

    model_config = SettingsConfigDict(
        env_prefix="POBO_MODELER_",
        env_file=None,
        extra="ignore",
        secrets_dir="/run/secrets" if os.path.isdir("/run/secrets") else None,
    )

    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL. Default: a SQLite file <data_dir>/modeler.db (WAL mode). "
        "PostgreSQL: postgresql+psycopg://user@host:5432/db",
    )
    data_dir: Path = Field(default=Path("./pobo-data/modeler"), description="Z arrays, SQLite file, secrets.")
    token: SecretStr | None = Field(
        default=None,
        description="Bearer token of the modeler API. Unset: generated on first start into <data_dir>/token "
        "(mode 0600) and printed once.",
    )
    secret_key: SecretStr | None = Field(
        default=None,
        description="Fernet key encrypting the stored curator tokens. Unset: generated on first start into "
        "<data_dir>/secret.key (mode 0600). Losing it makes the stored curator tokens unreadable.",
    )
    host: str = "127.0.0.1"
    port: int = Field(default=8002, ge=0, le=65535)
    workers: int = Field(default=1, ge=1, le=64, description=WORKERS_HELP)
    curator_timeout: float = Field(default=30.0, gt=0, description="Seconds per curator request.")
    curator_retries: int = Field(default=4, ge=0, le=20, description="Retries of a failed curator request.")
    curator_retry_base_seconds: float = Field(
        default=2.0,
        gt=0,
        le=3600,
        description="A running study whose curator is unreachable (or answers 502/503/504, or 429 with "
        "Retry-After) waits this long before its first new attempt, then twice as long each time (with "
        "jitter), up to curator_retry_max_seconds; status waiting_for_curator meanwhile.",
    )
    curator_retry_max_seconds: float = Field(
        default=120.0,
        gt=0,
        le=86400,
        description="Longest wait between two attempts at an unreachable curator.",
    )
    poll_seconds: float = Field(
        default=30.0, gt=0, le=600, description="Long-poll length while awaiting a manual measurement."
    )
    access_log: bool = Field(default=True, description="uvicorn access log (method, path, status only).")
    max_json_bytes: int = Field(
        default=1 * 2**20, ge=1024, description="Largest accepted request body (413 beyond it)."
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
        description="Browser origins allowed to call the API (CORS). Empty (default): no CORS headers.",
    )
    curator_url_allowlist: list[str] = Field(
        default_factory=list,
        description="Curator base URLs a study may use (JSON list, e.g. '[\"https://curator.example.org:8001\"]'"
        "); a study's curator_url must start with one of them. Empty (default): any URL. Set it so that a "
        "modeler token cannot make the modeler probe other hosts or internal ports.",
    )
    resume_on_start: bool = Field(
        default=False,
        description="At start-up, a study left `running` or `awaiting_measurement` by a killed process is "
        "made `ready` (resumable with POST .../run). True: its run is also restarted automatically.",
    )

    tls_certfile: Path | None = Field(
        default=None, description="PEM certificate (chain) to serve HTTPS; needs tls_keyfile too."
    )
    tls_keyfile: Path | None = Field(default=None, description="PEM private key of tls_certfile.")
    tls_keyfile_password: SecretStr | None = Field(
        default=None, description="Password of tls_keyfile, if it is encrypted."
    )
    curator_ca_bundle: Path | None = Field(
        default=None,
        description="PEM bundle of the CA(s) that signed the curator's certificate (https curator URLs). "
        "Unset: the system trust store. Certificates are always verified.",
    )
    curator_client_cert: Path | None = Field(
        default=None, description="Optional client certificate (PEM) presented to the curator (mutual TLS)."
    )
    curator_client_key: Path | None = Field(default=None, description="Private key of curator_client_cert.")

    @field_validator("token")
    @classmethod
    def _long_enough(cls, token: SecretStr | None) -> SecretStr | None:
        return check_operator_token(token, "POBO_MODELER_TOKEN")

    @model_validator(mode="after")
    def _check_tls(self) -> Settings:
        check_tls_files(self.tls_certfile, self.tls_keyfile, prefix="POBO_MODELER_")
        if self.curator_ca_bundle is not None and not self.curator_ca_bundle.is_file():
            raise ValueError(
                f"POBO_MODELER_CURATOR_CA_BUNDLE: {self.curator_ca_bundle} does not exist or is not a file"
            )
        if self.curator_client_key is not None and self.curator_client_cert is None:
            raise ValueError(
                "POBO_MODELER_CURATOR_CLIENT_KEY is set but POBO_MODELER_CURATOR_CLIENT_CERT is not"
            )
        return self

    @property
    def tls_enabled(self) -> bool:
        return self.tls_certfile is not None

    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'modeler.db').resolve()}"

    def resolve_token(self) -> SecretStr:
        """The API token: the setting, else the token file, else a new token written there (printed once)."""
        if self.token is not None and self.token.get_secret_value():
            return self.token
        path = self.data_dir / TOKEN_FILE
        if path.exists():
            token = path.read_text(encoding="utf-8").strip()
            if token:
                return SecretStr(token)
        token = secrets.token_urlsafe(32)
        _write_secret(path, token)
        print(
            f"pobo modeler: generated an API token (saved to {path}, mode 0600; shown only now):\n  {token}",
            file=sys.stderr,
            flush=True,
        )
        return SecretStr(token)

    def resolve_secret_key(self) -> SecretStr:
        """The Fernet key: the setting, else the key file, else a new key written there (never printed)."""
        if self.secret_key is not None and self.secret_key.get_secret_value():
            return self.secret_key
        path = self.data_dir / SECRET_KEY_FILE
        if path.exists():
            key = path.read_text(encoding="utf-8").strip()
            if key:
                return SecretStr(key)
        key = Fernet.generate_key().decode("ascii")
        _write_secret(path, key)
        return SecretStr(key)
