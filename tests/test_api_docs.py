"""docs/api.md is generated from the services' OpenAPI documents and must match the code."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared import apidocs

DOC = Path(__file__).resolve().parent.parent / "docs" / "api.md"


@pytest.fixture(scope="module")
def generated() -> str:
    return apidocs.generate()


def test_committed_api_doc_is_up_to_date(generated: str) -> None:
    committed = DOC.read_text(encoding="utf-8") if DOC.exists() else ""
    assert committed == generated, (
        "docs/api.md does not match the API the code documents; "
        "regenerate with `make docs` (or `.venv/bin/python -m shared.apidocs --write`)"
    )


def test_api_doc_covers_the_privacy_fields_and_both_services(generated: str) -> None:
    for needle in (
        "### POST /v1/datasets/{dataset_id}/releases",
        "`mechanism`",
        "`acknowledge_no_guarantee`",
        "`allow_large_delta`",
        "`formal_guarantee`",
        "`noise_std`",
        "`population`",
        "### GET /v1/populations",
        "### POST /v1/studies",
    ):
        assert needle in generated, needle
    assert "../shared" not in generated
    assert "API.md" not in generated
