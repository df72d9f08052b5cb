"""docs/api.md is generated from the services' OpenAPI documents and must match the code."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.tools import apidocs

DOC = Path(__file__).resolve().parent.parent / "docs" / "api.md"


@pytest.fixture(scope="module")
def generated() -> str:
    return apidocs.generate()


def test_committed_api_doc_is_up_to_date(generated: str) -> None:
    committed = DOC.read_text(encoding="utf-8") if DOC.exists() else ""
    assert committed == generated, (
        "docs/api.md does not match the API the code documents; "
        "regenerate with `pobo docs api` (or `make docs`)"
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


def test_both_services_document_one_api_version_and_one_422_shape() -> None:
    documents = {service.key: service.document for service in apidocs.openapi_documents()}
    versions = {name: doc["info"]["version"] for name, doc in documents.items()}
    assert len(set(versions.values())) == 1, versions
    shapes = [doc["components"]["schemas"]["HTTPValidationError"] for doc in documents.values()]
    assert shapes[0]["properties"]["detail"]["type"] == "string"
    assert shapes[0] == shapes[1]


def test_pobo_docs_api_check_passes_on_the_committed_file() -> None:
    from typer.testing import CliRunner

    from shared.tools.cli import app

    result = CliRunner().invoke(app, ["docs", "api", "--check"])
    assert result.exit_code == 0, result.output
