"""Running a service's alembic migrations (at start-up, and in tests that step through revisions).

On SQLite some schema changes need a table rebuilt (alembic's batch "move and copy": create the new table,
copy the rows, drop the old one, rename). With foreign keys enforced, dropping a table that other tables
reference fails, so the migration runs the way SQLite documents for such changes (``ALTER TABLE``, "making
other kinds of table schema changes"): enforcement off on that connection *outside* the transaction,
migrate, ``PRAGMA foreign_key_check`` inside the transaction (any dangling reference aborts it), commit,
enforcement back on.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine

__all__ = ["Migrations", "run_migrations"]

#: pobo's source tree (``shared`` sits at its top, beside ``migrations``).
_SOURCE_ROOT = Path(__file__).resolve().parent.parent.parent


def _set_foreign_keys(conn: Connection, on: bool) -> None:
    # On the DBAPI connection itself: through SQLAlchemy the statement would open a transaction first, and
    # SQLite ignores this pragma inside a transaction.
    dbapi = conn.connection.dbapi_connection
    assert dbapi is not None
    dbapi.execute(f"PRAGMA foreign_keys={'ON' if on else 'OFF'}")


def run_migrations(engine: Engine, cfg: Config, *, revision: str = "head", downgrade: bool = False) -> None:
    """``alembic upgrade <revision>`` (or ``downgrade``) in one transaction on ``engine``."""
    with engine.connect() as conn:
        sqlite = conn.dialect.name == "sqlite"
        if sqlite:
            _set_foreign_keys(conn, False)
        try:
            with conn.begin():
                cfg.attributes["connection"] = conn
                (command.downgrade if downgrade else command.upgrade)(cfg, revision)
                if sqlite:
                    dangling = conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
                    if dangling:
                        raise RuntimeError(
                            f"migration to {revision} left {len(dangling)} dangling foreign key(s), first: "
                            f"{tuple(dangling[0])}; nothing was changed"
                        )
        finally:
            if sqlite:
                _set_foreign_keys(conn, True)


@dataclass(frozen=True)
class Migrations:
    """A service's alembic environment: its directory (``env.py``, ``versions/``) and version table."""

    service: str
    directory: Path
    version_table: str

    @classmethod
    def of(cls, service: str) -> Migrations:
        """The environment of ``service`` in pobo's source tree: ``<source>/migrations/<service>`` (found
        from this package, not the working directory), version table ``alembic_version_<service>`` (the
        services may share one PostgreSQL database, so each keeps its own)."""
        return cls(service, _SOURCE_ROOT / "migrations" / service, f"alembic_version_{service}")

    @property
    def pg_lock_key(self) -> int:
        """The PostgreSQL advisory-lock key serialising this service's concurrent migrations: the bytes
        ``pobo`` + the service's first four letters ("pobocura", "pobomode") as a 64-bit integer."""
        return int.from_bytes(f"pobo{self.service[:4]}".encode("ascii"), "big")

    def config(self) -> Config:
        """An alembic ``Config`` for this environment (no ini file)."""
        cfg = Config()
        cfg.set_main_option("script_location", str(self.directory))
        cfg.set_main_option("version_table", self.version_table)
        return cfg

    def upgrade(self, engine: Engine, revision: str = "head") -> None:
        """``alembic upgrade <revision>`` on ``engine`` (idempotent at head; run at every start-up)."""
        if not (self.directory / "env.py").is_file():
            raise RuntimeError(
                f"the {self.service}'s alembic environment is missing at {self.directory}; install pobo from "
                f"its source tree (pip install -e .) so that <source>/migrations/{self.service} is present"
            )
        run_migrations(engine, self.config(), revision=revision)
