"""Settings of the curator service (environment variables prefixed ``POBO_CURATOR_``)."""

from __future__ import annotations

import os
from typing import ClassVar

from pydantic import Field, SecretStr, field_validator

from shared.servicekit.dask_settings import DaskSettings
from shared.servicekit.serving import check_operator_token
from shared.servicekit.settings import ServiceSettings, settings_config

#: Name of the file (inside the data dir) that holds a generated admin token.
ADMIN_TOKEN_FILE = "admin-token"  # noqa: S105 - a file name, not a secret


class Settings(ServiceSettings, DaskSettings):
    """Every knob of the curator; the ones both services have are defined in ``ServiceSettings`` (and the
    Dask cluster's in ``DaskSettings``: with backend dask the Gaussian release and the gradient oracles' steps
    run on it, ``curator_service.services.releases.ComputeBackend``; docs/scaling.md)."""

    model_config = settings_config("POBO_CURATOR_")
    service: ClassVar[str] = "curator"
    default_port: ClassVar[int] = 8001

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
    access_log_retention_days: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="Access-log entries older than this many days are archived, then deleted from the "
        "database: written to <data_dir>/archive/access-log-<first id>-<last id>.jsonl.gz (gzip JSON lines, "
        "0600, with a .json sidecar holding its sha256 and row count) and deleted only once that file is on "
        "disk. Runs at start-up and every hour while the service runs, or with pobo curator "
        "archive-access-log. Unset (default): kept forever. The query logs' hash chains are never pruned.",
    )

    gradient_losses: dict[str, str] = Field(
        default_factory=dict,
        description="Plug-in losses of gradient oracles, by name: a JSON object such as "
        '{"my-loss": "my_package.losses:my_loss"}. The function is called as fn(theta_batch [b, p], rows '
        "[m, w]) and returns [m, b]; rows are the dataset's stored features, followed by its outcome column "
        "when it has one. Row j's output must depend on row j alone: checked on the dataset's rows when an "
        "oracle is created. Only the operator names these; a partner cannot. The time the function takes on "
        "a row is not hidden from the partner who chooses theta: avoid data-dependent work (early exits, "
        "subnormal floats; docs/privacy.md).",
    )

    @field_validator("gradient_losses")
    @classmethod
    def _loss_names(cls, losses: dict[str, str]) -> dict[str, str]:
        import re

        from shared.bo.gibo.oracle import BUILTIN_LOSSES

        for name, target in losses.items():
            if not re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,63}", name) or name in BUILTIN_LOSSES:
                raise ValueError(
                    f"plug-in loss name {name!r} must be lower-case letters, digits, '.', '_' or '-' "
                    f"(at most 64) and must not be a built-in loss ({', '.join(BUILTIN_LOSSES)})"
                )
            if not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", target):
                raise ValueError(
                    f"plug-in loss {name!r}: {target!r} is not of the form 'package.module:function'"
                )
        return losses

    @field_validator("admin_token")
    @classmethod
    def _long_enough(cls, token: SecretStr | None) -> SecretStr | None:
        return check_operator_token(token, "POBO_CURATOR_ADMIN_TOKEN")

    def resolve_admin_token(self) -> SecretStr:
        """The admin token: the setting, else the token file, else a new token written to that file.

        A new token is printed once (to stderr) so the operator can copy it; later starts reuse the file.
        """
        return self.resolve_secret(self.admin_token, ADMIN_TOKEN_FILE, announce_as="an admin token")
