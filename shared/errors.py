"""Typed errors raised by the pure library; the services map them to HTTP in one place each.

Messages state what was expected and what was got (``"epsilon must be > 0, got -1.0"``) and never quote a
raw data value of a dataset row.
"""

from __future__ import annotations

#: The response header in which a pobo service names the kind of an error a client may act on by itself
#: (beside the ``{"detail": ...}`` body a person reads), e.g. ``Pobo-Error-Code: row-unaffordable``.
ERROR_CODE_HEADER = "Pobo-Error-Code"
#: The curator refused a row because its person's output allotment under the caller's grant is used up:
#: nothing was charged, and that row can never be answered under this grant (the modeler excludes it).
ROW_UNAFFORDABLE = "row-unaffordable"


class PoboError(Exception):
    """Base class of every error pobo raises on purpose."""


class InputDataError(PoboError, ValueError):
    """Input data (an array, a CSV, a parameter) is malformed: wrong shape, non-finite, out of range."""


class PrivacyBudgetExceeded(PoboError):
    """A release would push a dataset past its (epsilon, delta) budget under basic composition."""


class StrategyError(PoboError, RuntimeError):
    """The optimization strategy cannot proceed (e.g. every candidate has been queried)."""
