"""docs/sdk.md's reference is what ``shared.tools.sdkdocs`` generates from the SDK's docstrings today, and it
names every public method of ``pobo.Curator`` and ``pobo.Modeler``."""

from __future__ import annotations

import pobo
from shared.tools.sdkdocs import BEGIN, END, SDK_DOC, reference


def test_the_reference_in_the_docs_is_the_generated_one() -> None:
    text = SDK_DOC.read_text(encoding="utf-8")
    generated = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert generated == reference().strip(), "run `python -m shared.tools.sdkdocs` and commit docs/sdk.md"


def test_the_reference_covers_every_public_method_and_error() -> None:
    text = reference()
    for cls in (pobo.Curator, pobo.Modeler):
        public = [name for name in dir(cls) if not name.startswith("_")]
        assert public, cls
        for name in public:
            assert f"#### `{name}(" in text, f"{cls.__name__}.{name} is missing from the reference"
            assert (getattr(cls, name).__doc__ or "").strip(), f"{cls.__name__}.{name} has no docstring"
    for name in ("ApiError", "CuratorError", "ModelerApiError"):
        assert f"* `pobo.{name}`" in text


def test_the_sdk_wraps_the_clients_errors() -> None:
    from shared.protocol.client import ApiError, CuratorError, ModelerApiError

    assert (pobo.ApiError, pobo.CuratorError, pobo.ModelerApiError) == (
        ApiError,
        CuratorError,
        ModelerApiError,
    )
