"""Settings of the modeler service (environment variables prefixed ``POBO_MODELER_``)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from cryptography.fernet import Fernet
from pydantic import Field, SecretStr, field_validator, model_validator

from shared.servicekit.dask_settings import DaskSettings
from shared.servicekit.serving import check_operator_token
from shared.servicekit.settings import ServiceSettings, settings_config

#: Files (inside the data dir) holding a generated bearer token and a generated encryption key.
TOKEN_FILE = "token"  # noqa: S105 - a file name, not a secret
SECRET_KEY_FILE = "secret.key"  # noqa: S105 - a file name


class Settings(ServiceSettings, DaskSettings):
    """Every knob of the modeler; the ones both services have are defined in ``ServiceSettings`` (and the
    Dask cluster's in ``DaskSettings``: with backend dask the GP-UCB loops run on it, ``shared.bo.backend``).
    """

    model_config = settings_config("POBO_MODELER_")
    service: ClassVar[str] = "modeler"
    default_port: ClassVar[int] = 8002

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
    dask_partitions: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        description="Partitions of a GP-UCB loop's candidates on the Dask cluster (backend dask). Unset: one "
        "per worker of the cluster when the study's strategy is built.",
    )
    dask_workers_read_data_dir: bool | None = Field(
        default=None,
        description="The Dask workers can read this service's data_dir at the same path (one host, or a "
        "shared file system): each partition then loads its own rows of a study's stored Z, and no rows "
        "travel through the scheduler. Unset: true for the local cluster (DASK_ADDRESS and "
        "DASK_GATEWAY_ADDRESS unset), false for a remote one (each partition's rows are then sent in its "
        "first task).",
    )
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
    max_wait_seconds: float = Field(
        default=60.0, ge=0, le=600, description="Upper bound of ?wait= long-polls (federation rounds)."
    )
    federation_tick_seconds: float = Field(
        default=0.5,
        gt=0,
        le=60,
        description="How often the round closer looks for federation rounds past their deadline.",
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
    def _check_curator_tls(self) -> Settings:
        if self.curator_ca_bundle is not None and not self.curator_ca_bundle.is_file():
            raise ValueError(
                f"POBO_MODELER_CURATOR_CA_BUNDLE: {self.curator_ca_bundle} does not exist or is not a file"
            )
        if self.curator_client_key is not None and self.curator_client_cert is None:
            raise ValueError(
                "POBO_MODELER_CURATOR_CLIENT_KEY is set but POBO_MODELER_CURATOR_CLIENT_CERT is not"
            )
        return self

    def resolve_token(self) -> SecretStr:
        """The API token: the setting, else the token file, else a new token written there (printed once)."""
        return self.resolve_secret(self.token, TOKEN_FILE, announce_as="an API token")

    def resolve_secret_key(self) -> SecretStr:
        """The Fernet key: the setting, else the key file, else a new key written there (never printed)."""
        return self.resolve_secret(
            self.secret_key, SECRET_KEY_FILE, lambda: Fernet.generate_key().decode("ascii")
        )
