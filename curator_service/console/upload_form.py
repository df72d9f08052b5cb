"""The console's CSV upload form (``POST /console/datasets``): the form's fields read into a
``DatasetUpload``, and what the page shows again when an upload is refused.

A refused upload re-renders the datasets page with the error *and every value entered* (the browser keeps
the chosen file when the page's script sent the form; without the script it must be chosen again), with the
refusal's status. A successful one redirects (post/redirect/get) to the new dataset's page. When the file
is not comma-separated, the refusal says which delimiter it seems to use (``csvparse.delimiter_hint``).
"""

from __future__ import annotations

from typing import Any

from starlette.datastructures import FormData, UploadFile

from curator_service.console.common import integer, number, text
from curator_service.services import datasets as dataset_service
from shared.servicekit.console import Console, ConsoleRefusal
from shared.servicekit.exceptions import ServiceError

__all__ = ["TEXT_FIELDS", "entered", "refusal", "upload_of"]

#: The form's fields shown again after a refusal (the checkbox ``acknowledge_distinct_people`` too).
TEXT_FIELDS = (
    "name",
    "objective",
    "objective_mode",
    "id_column",
    "features",
    "noise_std",
    "scaling",
    "population",
    "rows_per_person",
    "epsilon_budget",
    "delta_budget",
)


def entered(form: FormData) -> dict[str, Any]:
    """What was typed into the form, as typed (to fill it in again)."""
    values: dict[str, Any] = {}
    for name in TEXT_FIELDS:
        value = form.get(name)
        values[name] = value if isinstance(value, str) else ""
    values["acknowledge_distinct_people"] = form.get("acknowledge_distinct_people") is not None
    return values


def refusal(console: Console, exc: Exception) -> tuple[int, str] | None:
    """(status, message) of an upload refused by ``exc`` (as the console's error page would show it), or
    None for an unexpected error."""
    if isinstance(exc, ConsoleRefusal):
        return exc.status, exc.message
    if isinstance(exc, ServiceError):
        return exc.status_code, exc.detail
    status = console.library_status(exc)
    return None if status is None else (status, str(exc))


def upload_of(form: FormData) -> tuple[dataset_service.DatasetUpload, UploadFile]:
    """The upload the form asks for, and its file; a ``ConsoleRefusal`` naming a bad field."""
    file = form.get("file")
    if not isinstance(file, UploadFile) or not file.filename:
        raise ConsoleRefusal(422, "choose a CSV file to upload (the form field `file`)")
    name = text(form, "name")
    if name is None:
        raise ConsoleRefusal(422, "name: give the dataset a name")
    if len(name) > 200:
        raise ConsoleRefusal(422, "name: at most 200 characters")
    mode = text(form, "objective_mode")
    if mode not in (None, "column", "manual"):
        raise ConsoleRefusal(422, f'objective_mode must be "column" or "manual", got {mode!r}')
    id_column = text(form, "id_column")
    if id_column is not None and len(id_column) > 200:
        raise ConsoleRefusal(422, "id column: at most 200 characters")
    upload = dataset_service.DatasetUpload(
        name=name,
        features=text(form, "features"),
        objective=text(form, "objective"),
        objective_mode=mode,
        noise_std=number(form, "noise_std", default=0.0) or 0.0,
        scaling=text(form, "scaling") or "none",
        epsilon_budget=number(form, "epsilon_budget"),
        delta_budget=number(form, "delta_budget"),
        population=text(form, "population"),
        acknowledge_distinct_people=form.get("acknowledge_distinct_people") is not None,
        rows_per_person=integer(form, "rows_per_person", "rows per person", default=1) or 1,
        id_column=id_column,
    )
    return upload, file
