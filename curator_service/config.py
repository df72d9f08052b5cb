"""Settings of the curator service (environment variables prefixed ``POBO_CURATOR_``)."""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.servicekit.serving import WORKERS_HELP, check_operator_token
from shared.servicekit.tls import check_tls_files

#: Name of the file (inside the data dir) that holds a generated admin token.
ADMIN_TOKEN_FILE = "admin-token"  # noqa: S105 - a file name, not a secret


class Settings(BaseSettings):
    """One place for every knob; secrets are ``SecretStr`` so their ``repr`` never shows them."""

    model_config = SettingsConfigDict(
        env_prefix="POBO_CURATOR_",
        env_file=None,
        extra="ignore",
        secrets_dir="/run/secrets" if os.path.isdir("/run/secrets") else None,
    )

    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL. Default: a SQLite file <data_dir>/curator.db (WAL mode). "
        "PostgreSQL: postgresql+psycopg://user@host:5432/db",
    )
    data_dir: Path = Field(default=Path("./pobo-data/curator"), description="Arrays, SQLite file, token.")
    admin_token: SecretStr | None = Field(
        default=None,
        description="Admin bearer token. Unset: generated on first start into <data_dir>/admin-token (0600).",
    )
    max_upload_bytes: int = Field(
        default=4 * 2**30, ge=1, description="Largest accepted CSV upload (default 4 GiB, > 1e6 x 100 cells)."
    )
    max_features: int = Field(
        default=1000,
        ge=1,
        le=100_000,
        description="Most feature columns a dataset may have (413 beyond). Releases and the privacy report "
        "work on a d x d matrix: at d = 1000 that takes ~0.2 s and 8 MB, at 2000 ~1.2 s, at 4000 ~9 s.",
    )
    max_release_bytes: int = Field(
        default=2 * 2**30,
        ge=1024,
        description="Largest release (n x r float64, built in memory); 413 beyond. Default 2 GiB.",
    )
    host: str = "127.0.0.1"
    port: int = Field(default=8001, ge=0, le=65535)
    workers: int = Field(default=1, ge=1, le=64, description=WORKERS_HELP)
    csv_parse_workers: int = Field(
        default_factory=lambda: max(1, min(4, os.cpu_count() or 1)),
        ge=1,
        le=64,
        description="Processes parsing the chunks of a big CSV upload in parallel (1: the request thread).",
    )
    max_wait_seconds: float = Field(default=60.0, ge=0, description="Upper bound of ?wait= long-polls.")
    orphan_min_age_seconds: float = Field(
        default=3600.0,
        ge=0,
        description="At start-up, array files no database row refers to (a crash between writing a file "
        "and committing its row) are deleted once this old. 0 is safe when one process owns the data dir.",
    )
    max_json_bytes: int = Field(
        default=1 * 2**20, ge=1024, description="Largest body of any request but the CSV upload (413 beyond)."
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

    tls_certfile: Path | None = Field(
        default=None, description="PEM certificate (chain) to serve HTTPS; needs tls_keyfile too."
    )
    tls_keyfile: Path | None = Field(default=None, description="PEM private key of tls_certfile.")
    tls_keyfile_password: SecretStr | None = Field(
        default=None, description="Password of tls_keyfile, if it is encrypted."
    )

    @field_validator("admin_token")
    @classmethod
    def _long_enough(cls, token: SecretStr | None) -> SecretStr | None:
        return check_operator_token(token, "POBO_CURATOR_ADMIN_TOKEN")

    @model_validator(mode="after")
    def _check_tls(self) -> Settings:
        check_tls_files(self.tls_certfile, self.tls_keyfile, prefix="POBO_CURATOR_")
        return self

    @property
    def tls_enabled(self) -> bool:
        return self.tls_certfile is not None

    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'curator.db').resolve()}"

    def resolve_admin_token(self) -> SecretStr:
        """The admin token: the setting, else the token file, else a new token written to that file.

        A new token is printed once (to stderr) so the operator can copy it; later starts reuse the file.
        """
        if self.admin_token is not None and self.admin_token.get_secret_value():
            return self.admin_token
        path = self.data_dir / ADMIN_TOKEN_FILE
        if path.exists():
            token = path.read_text(encoding="utf-8").strip()
            if token:
                return SecretStr(token)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        token = secrets.token_urlsafe(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(token + "\n")
        os.chmod(path, 0o600)
        print(
            f"pobo curator: generated an admin token (saved to {path}, mode 0600; shown only now):\n"
            f"  {token}",
            file=sys.stderr,
            flush=True,
        )
        return SecretStr(token)
