"""What every curator console page needs: the app's components, one transaction per use, the admin
principal, and form fields parsed into numbers (a bad value is an HTML 422 page, never a 500)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any, TypeVar

from fastapi import Path, Request
from pydantic import BaseModel, ValidationError
from sqlalchemy.orm import Session
from starlette.datastructures import FormData, ImmutableMultiDict

from curator_service.api.deps import Components
from curator_service.services.auth import Principal
from shared.servicekit.console import ConsoleRefusal
from shared.servicekit.db import transaction

M = TypeVar("M", bound=BaseModel)
#: A form's fields, or a GET query's (a confirmation page carries a form's values in its URL).
Fields = ImmutableMultiDict[str, Any]
#: A row id in a path: the 32-bit range the databases store (as the API's ``RowId``).
RowId = Annotated[int, Path(ge=-(2**31), le=2**31 - 1)]

#: The console is the admin's: every service call is made as the admin (only the admin token signs in).
ADMIN = Principal("admin")


def components(request: Request) -> Components:
    found: Components = request.app.state.components
    return found


@contextmanager
def db_session(request: Request, *, write: bool = False) -> Iterator[Session]:
    """One transaction, as the API's ``get_session``: commits at the end, rolls back (and runs the
    ``on_rollback`` callbacks, e.g. deleting an upload's files) on any error."""
    with transaction(components(request).db, write=write) as session:
        yield session


def text(form: Fields, name: str) -> str | None:
    """A text field, stripped; None when absent or blank."""
    value = form.get(name)
    if not isinstance(value, str):
        return None
    value = value.strip()
    return value or None


def number(
    form: Fields, name: str, label: str | None = None, *, default: float | None = None
) -> float | None:
    """A finite float field (blank: ``default``); anything else is a 422 page naming the field."""
    raw = text(form, name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConsoleRefusal(422, f"{label or name} must be a number, got {raw!r}") from None
    if not math.isfinite(value):
        raise ConsoleRefusal(
            422, f"{label or name} must be a finite number (not NaN or infinity), got {raw!r}"
        )
    return value


def integer(form: Fields, name: str, label: str | None = None, *, default: int | None = None) -> int | None:
    """A whole-number field (blank: ``default``); anything else is a 422 page."""
    raw = text(form, name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConsoleRefusal(422, f"{label or name} must be a whole number, got {raw!r}") from None
    return _in_range(value, label or name)


def _in_range(value: int, name: str) -> int:
    """Within the 32-bit INTEGER range the databases store (beyond it a driver error, not a 422)."""
    if not -(2**31) <= value <= 2**31 - 1:
        raise ConsoleRefusal(422, f"{name} is out of range")
    return value


def ids(form: FormData, name: str) -> list[int]:
    """Every value of a multi-valued id field (checkboxes, multi-select), as ints."""
    out: list[int] = []
    for value in form.getlist(name):
        if isinstance(value, str) and value.strip():
            try:
                parsed = int(value)
            except ValueError:
                raise ConsoleRefusal(422, f"{name}: not an id: {value!r}") from None
            out.append(_in_range(parsed, name))
    return out


def checked(form: FormData, name: str) -> bool:
    return form.get(name) is not None


def optional_int(value: str | None, name: str) -> int | None:
    """A GET parameter that may be blank (a GET form sends empty fields as ``name=``)."""
    if value is None or not value.strip():
        return None
    try:
        parsed = int(value)
    except ValueError:
        raise ConsoleRefusal(422, f"{name} must be a whole number, got {value!r}") from None
    return _in_range(parsed, name)


def validated(model: type[M], data: dict[str, Any]) -> M:
    """The API's own request schema, so the console accepts exactly what the API accepts; its errors as a
    422 page."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        fields = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ())) or 'input'}: {e.get('msg')}" for e in exc.errors()
        )
        raise ConsoleRefusal(422, f"invalid input ({fields})") from None
