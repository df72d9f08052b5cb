"""Issue 5, item 6: the modeler keeps the curator token it was given only encrypted (Fernet), and its own
API token not at all, in its database."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from modeler_service.config import Settings
from tests.modeler_service.conftest import TOKEN, study_body
from tests.modeler_service.fake_curator import PARTNER_TOKEN


def test_database_holds_no_clear_token(client: Any, settings: Settings, tmp_path: Path) -> None:
    r = client.post("/v1/studies", json=study_body())
    assert r.status_code == 201, r.text
    assert PARTNER_TOKEN not in r.text
    client.app.state.components.ctx.db.dispose()
    if settings.resolved_database_url().startswith("sqlite"):
        db_file = Path(settings.resolved_database_url().removeprefix("sqlite:///"))
        raw = b"".join(p.read_bytes() for p in db_file.parent.glob(db_file.name + "*"))
    else:  # PostgreSQL: every text the study tables hold
        from sqlalchemy import create_engine, inspect, text

        engine = create_engine(settings.resolved_database_url())
        chunks = []
        with engine.connect() as conn:
            for table in inspect(conn).get_table_names():
                chunks += [repr(tuple(row)) for row in conn.execute(text(f'SELECT * FROM "{table}"'))]
        engine.dispose()
        raw = "\n".join(chunks).encode()
    assert raw
    assert PARTNER_TOKEN.encode() not in raw
    assert TOKEN.encode() not in raw
